// bench_gpu_attention: the fused attention on a GPU, measured as FlashAttention reports it (causal,
// bf16, FLOPs 4·B·H·T²·D / 2 forward and 2.5 times that backward), at the shapes of PyTorch's peer
// (`torch_peer.py attn`, run beside it by bench/gpu_check.sh), and one at head dim 256:
//
//   ./build-nvcc/bench/bench_gpu_attention [quick]
//   ./build-nvcc/bench/bench_gpu_attention profile B H T D   one fused forward + backward at that
//        shape, untimed, for a profiler (`ncu -k regex:_mma_kernel --launch-count 3 ...` sees
//        the forward, dK/dV and dQ kernels once each)
//
// Per shape, one RESULT line:
//   kernel      cuda::attention_forward_mma on bf16 q, k, v already on the device: what SDPA does
//   fused       the attention op at bf16 precision on float32 q, k, v (their bf16 casts included),
//               forward, and forward + backward (the backward still on CUDA cores)
//   naive       attention_unfused at bf16 precision (cuBLAS batched GEMMs, softmax, GEMMs)
//   float32     the CUDA-core fused kernel at full precision, forward (first shape only: slow)
// Each time is the median of repeats between two device synchronisations. `quick`: two shapes.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "autograd/grad_mode.h"
#include "bench_util.h"
#include "cuda/runtime.h"
#include "qk.h"

using namespace qk;

namespace {

struct Shape4 {
    int64_t B, H, T, D;
};

double timed_ms(const std::function<void()>& fn) {
    return 1e3 * bench::time_median(
                     [&] {
                         fn();
                         cuda::synchronize();
                     },
                     0.3, 3);
}

std::string rate(double ms, double flops) {
    return fmt::format("{:.3f} ms {:.1f} TFLOP/s", ms, flops / ms / 1e9);
}

// Random float32 q, k, v (taking gradients) and an upstream gradient of shape s, on the device.
struct Inputs {
    Tensor q, k, v, probe;
    explicit Inputs(const Shape& shape) {
        Generator gen(7);
        for (Tensor* t : {&q, &k, &v, &probe}) *t = randn(shape, kF32, Device::cuda, gen);
        for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
    }
};

void measure(const Shape4& s, bool with_float32) {
    const Shape shape{s.B, s.H, s.T, s.D};
    const Inputs in(shape);
    const Tensor &q = in.q, &k = in.k, &v = in.v, &probe = in.probe;
    const double fwd = 4.0 * double(s.B * s.H) * double(s.T) * double(s.T) * double(s.D) / 2;
    const AttentionOptions bf16_causal{.causal = true, .precision = Precision::bf16};

    const Tensor q16 = q.detach().to(kBF16), k16 = k.detach().to(kBF16), v16 = v.detach().to(kBF16),
                 scale = full({1}, 0.125, kF32, Device::cuda);
    Tensor out = Tensor::empty(shape, kF32, Device::cuda);
    Tensor lse = Tensor::empty({s.B, s.H, s.T}, kF64, Device::cuda);
    const AttentionShape sh{s.B * s.H, s.H, s.H, s.T, s.T, s.D, true};
    const double kernel = timed_ms([&] {
        cuda::attention_forward_mma<bf16>(out.data<float>(), lse.data<double>(), nullptr, nullptr,
                                          nullptr, q16.data<bf16>(), k16.data<bf16>(),
                                          v16.data<bf16>(), scale.data<float>(), 0, 0.0f, sh);
    });
    auto forward = [&](auto attend) {
        return timed_ms([&] {
            autograd::NoGradGuard no_grad;
            attend(q, k, v, bf16_causal, nullptr);
        });
    };
    auto both = [&](auto attend) {
        return timed_ms([&] { attend(q, k, v, bf16_causal, nullptr).backward(probe); });
    };
    const auto fused = [](const Tensor& a, const Tensor& b, const Tensor& c,
                          const AttentionOptions& o,
                          AttentionSignals* sig) { return attention(a, b, c, o, sig); };
    const auto naive = [](const Tensor& a, const Tensor& b, const Tensor& c,
                          const AttentionOptions& o,
                          AttentionSignals* sig) { return attention_unfused(a, b, c, o, sig); };
    std::string line = fmt::format(
        "RESULT qknorm attn bf16 B={} H={} T={} D={}: kernel fwd {}; fused fwd {}; fused fwd+bwd "
        "{}; naive fwd {}; naive fwd+bwd {}",
        s.B, s.H, s.T, s.D, rate(kernel, fwd), rate(forward(fused), fwd),
        rate(both(fused), 3.5 * fwd), rate(forward(naive), fwd), rate(both(naive), 3.5 * fwd));
    if (with_float32) {
        const double ms = timed_ms([&] {
            autograd::NoGradGuard no_grad;
            attention(q, k, v, {.causal = true});
        });
        line += fmt::format("; float32 cuda-core fused fwd {}", rate(ms, fwd));
    }
    fmt::print("{}\n", line);
    std::fflush(stdout);
}

void profile_once(const Shape4& s) {
    const Inputs in({s.B, s.H, s.T, s.D});
    attention(in.q, in.k, in.v, {.causal = true, .precision = Precision::bf16}).backward(in.probe);
    cuda::synchronize();
    fmt::print("profiled B={} H={} T={} D={}\n", s.B, s.H, s.T, s.D);
}

}  // namespace

int main(int argc, char** argv) {
    if (!cuda::device_available()) {
        fmt::print("bench_gpu_attention: no CUDA device ({})\n", cuda::backend_description());
        return 0;
    }
    if (argc == 6 && std::strcmp(argv[1], "profile") == 0) {
        profile_once(
            {std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5])});
        return 0;
    }
    const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
    std::vector<Shape4> shapes{{8, 12, 1024, 64}, {4, 12, 2048, 64}, {2, 12, 4096, 64},
                               {8, 6, 1024, 128}, {2, 6, 4096, 128}, {1, 12, 8192, 64},
                               {2, 4, 4096, 256}};  // the last: Gemma 3's head size
    if (quick) shapes = {{8, 12, 1024, 64}, {8, 6, 1024, 128}};
    for (size_t i = 0; i < shapes.size(); ++i) measure(shapes[i], i == 0);
}
