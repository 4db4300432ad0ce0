// Softmax (attention shapes, causal or not) and cross-entropy (char-level and GPT-2 vocabularies),
// forward and backward, in GB/s against a memcpy moving the same number of bytes in the same run.
//
//   QK_NUM_THREADS=1 ./build/bench/bench_softmax     (and QK_NUM_THREADS=2)
//
// Bytes are counted as each tensor read or written once (the minimum any implementation moves):
//   softmax      forward: read x, write y (+ lse per row)   backward: read y, dy (+ lse), write dx
//   cross_entropy forward: read logits, targets, write lse  backward: read logits, targets, lse,
//                                                             write dlogits
// The memcpy reference moves the same total (it reads bytes/2 and writes bytes/2). The backward is
// timed by calling the recorded node directly, so the engine's accumulation into .grad (a copy)
// is not counted.
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "qk.h"

using namespace qk;

namespace {

struct Timing {
    double fwd_s, bwd_s;
    double fwd_bytes, bwd_bytes;
};

void print_header() {
    std::printf(
        "| op | shape | fwd ms | bwd ms | fwd GB/s | bwd GB/s | fwd+bwd GB/s | memcpy GB/s "
        "(same bytes) | fwd+bwd / memcpy |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
}

void print_row(const std::string& op, const std::string& shape, const Timing& t) {
    const double bytes = t.fwd_bytes + t.bwd_bytes, secs = t.fwd_s + t.bwd_s;
    const double gbps = bytes / secs / 1e9;
    const double ref = bench::memcpy_gbps(static_cast<size_t>(bytes / 2));
    std::printf("| %s | %s | %.3f | %.3f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", op.c_str(),
                shape.c_str(), t.fwd_s * 1e3, t.bwd_s * 1e3, t.fwd_bytes / t.fwd_s / 1e9,
                t.bwd_bytes / t.bwd_s / 1e9, gbps, ref, gbps / ref);
    std::fflush(stdout);
}

// Times forward (no recording) and the recorded node's backward on an fp32 tensor f(x).
template <class F>
std::pair<double, double> time_fwd_bwd(Tensor x, F f) {
    double fwd;
    {
        NoGradGuard no_grad;
        fwd = bench::time_median([&] { f(x); });
    }
    x.requires_grad_();
    Tensor y = f(x);
    Tensor dy = randn(y.shape(), kF32);
    const auto node = y.grad_fn();
    const double bwd = bench::time_median([&] { node->backward(dy); });
    return {fwd, bwd};
}

Timing bench_softmax(int64_t BH, int64_t T, bool causal) {
    const double n = double(BH * T * T), rows = double(BH * T);
    auto [fwd, bwd] = time_fwd_bwd(randn({BH, T, T}, kF32),
                                   [&](const Tensor& x) { return softmax(x, {.causal = causal}); });
    return {fwd, bwd, 4 * (2 * n + rows), 4 * (3 * n + rows)};
}

Timing bench_cross_entropy(int64_t N, int64_t V) {
    std::vector<int32_t> ids(N);
    for (int64_t i = 0; i < N; ++i) ids[i] = int32_t((i * 7919) % V);
    Tensor targets = from_ids(ids);
    const double n = double(N * V);
    auto [fwd, bwd] = time_fwd_bwd(randn({N, V}, kF32),
                                   [&](const Tensor& x) { return cross_entropy(x, targets); });
    return {fwd, bwd, 4 * (n + 2.0 * N), 4 * (2 * n + 2.0 * N)};
}

}  // namespace

int main() {
    std::printf("threads: %d\n\n", num_threads());
    print_header();
    const int64_t softmax_shapes[][2] = {{16 * 4, 64}, {8 * 6, 256}};
    for (const auto& s : softmax_shapes)
        for (bool causal : {false, true})
            print_row(causal ? "softmax causal" : "softmax",
                      fmt::format("({}, {}, {})", s[0], s[1], s[1]),
                      bench_softmax(s[0], s[1], causal));
    const int64_t ce_shapes[][2] = {{2048, 65}, {16384, 65}, {2048, 50257}};
    for (const auto& s : ce_shapes)
        print_row("cross_entropy", fmt::format("({}, {})", s[0], s[1]),
                  bench_cross_entropy(s[0], s[1]));
    return 0;
}
