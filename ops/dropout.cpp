// Dropout, the inverted kind: scaled at training time so that evaluation is the identity.
//
// Forward (training, 0 < p < 1): each element is kept with probability 1 - p,
//     keep[i] ~ Bernoulli(1 - p),   s = 1 / (1 - p),   y[i] = keep[i] ? x[i] * s : 0
// so E[y[i]] = (1 - p) * x[i] * s = x[i]: the expected activation is unchanged.
// Saved: keep, one byte per element (a float mask of 0 and s would take four).
// Backward: with the mask fixed, y is linear in x with slope keep[i] * s:
//     dx[i] = keep[i] ? dy[i] * s : 0
// The same kernel (apply_mask) computes both.
//
// Edge cases: !training or p == 0 returns x itself (no copy, no node). p == 1 is allowed and
// drops everything: y = 0 and dx = 0, with s taken as 0 rather than 1 / 0. p outside [0, 1] (or
// NaN) is an error.
//
// Random numbers: element i (row-major, whatever x's strides) is dropped when the i-th 32-bit
// word drawn from gen is below p * 2^32; words come four per Philox block, so a call advances gen
// by ceil(numel / 4) blocks. The mask depends only on gen's (seed, counter), not on the thread
// count or the device: a fresh Generator(seed) redraws the same mask. Generator::fill draws the
// words for 16 counters at a time, so the draw costs less than the masking pass. On cuda the
// mask is drawn the same way on the cpu and copied to the device (cuda/dropout.cu applies it).
#include "ops/dropout.h"

#include <cmath>
#include <memory>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#ifdef QK_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace qk {

namespace cpu {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelWork = 1 << 16;

// keep: (n) out, 1 = kept.   keep[i] = (word_i >= threshold), word_i the i-th word from gen.
inline void draw_keep_mask(uint8_t* keep, int64_t n, uint64_t threshold, Generator& gen) {
    constexpr int64_t kChunk = 4096;  // words drawn at a time: stays in L1
    uint32_t words[kChunk];
    for (int64_t start = 0; start < n; start += kChunk) {
        const int64_t count = std::min(kChunk, n - start);
        gen.fill(words, count);
        for (int64_t i = 0; i < count; ++i) keep[start + i] = words[i] >= threshold;
    }
}

// out, in: (n), contiguous; keep: (n).   out[i] = keep[i] ? in[i] * s : 0
// Forward: in = x, out = y. Backward: in = dy, out = dx.
template <class T>
void apply_mask(T* out, const T* in, const uint8_t* keep, int64_t n, T s) {
    auto range = [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) out[i] = keep[i] ? in[i] * s : T(0);
    };
    parallel_for(n, range, n >= kParallelWork);
}

}  // namespace cpu

namespace {

// The keep mask, drawn on the cpu whatever x's device (so the same generator state gives the same
// mask on both). For a cuda x it is copied to the device once, and forward and backward read the
// device copy; the host copy is then dropped.
struct Mask {
    std::vector<uint8_t> host;
    std::shared_ptr<Storage> device;  // null unless x is on cuda
};

// out = in with the mask applied (in contiguous: row-major order matches the mask's).
Tensor masked(const Tensor& in, const Mask& keep, double s) {
    Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
    switch (in.device()) {
        case Device::cpu:
            QK_CHECK(!keep.device, "dropout: the gradient is on cpu, the mask on cuda (shape {})",
                     in.shape());
            dispatch_float(in.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cpu::apply_mask(out.data<T>(), in.data<T>(), keep.host.data(), in.numel(), T(s));
            });
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            QK_CHECK(keep.device, "dropout: the gradient is on cuda, the mask on cpu (shape {})",
                     in.shape());
            dispatch_float(in.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cuda::apply_mask(out.data<T>(), in.data<T>(),
                                 static_cast<const uint8_t*>(keep.device->data()), in.numel(),
                                 T(s));
            });
#else
            throw_built_without_cuda("dropout");
#endif
            break;
    }
    return out;
}

}  // namespace

Tensor dropout(const Tensor& x_in, double p, bool training, Generator& gen) {
    QK_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got {} (input shape {})", p,
             x_in.shape());
    QK_CHECK(is_compute_dtype(x_in.dtype()),
             "dropout: x must be float32 or float64, got {} of shape {}", x_in.dtype(),
             x_in.shape());
    if (!training || p == 0) return x_in;
    const Tensor x = autograd::contiguous_input(x_in);
    const double s = p < 1 ? 1 / (1 - p) : 0;
    const auto threshold = static_cast<uint64_t>(std::llround(std::ldexp(p, 32)));  // p * 2^32
    Mask keep;
    keep.host.resize(static_cast<size_t>(x.numel()));
    cpu::draw_keep_mask(keep.host.data(), x.numel(), threshold, gen);
    if (x.device() == Device::cuda) {
#ifdef QK_WITH_CUDA
        keep.device = std::make_shared<Storage>(keep.host.size(), Device::cuda);
        if (!keep.host.empty())
            cuda::copy_to_device(keep.device->data(), keep.host.data(), keep.host.size());
        keep.host = {};
#else
        throw_built_without_cuda("dropout");
#endif
    }
    Tensor y = masked(x, keep, s);
    return autograd::record("dropout", y, {x_in}, [keep = std::move(keep), s](const Tensor& dy) {
        return std::vector<Tensor>{masked(dy.contiguous(), keep, s)};
    });
}

}  // namespace qk
