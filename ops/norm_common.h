// What the normalisation ops share: the row-parallel threshold and the input checks.
// Internal to ops/norm.cpp and ops/lp_normalize.cpp.
#pragma once
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace qk {

namespace cpu {
// Rows go to the pool's threads above 2^15 elements (~10 µs of work, the order of a sleeping
// worker's wake-up).
constexpr int64_t kNormParallelWork = 1 << 15;
}  // namespace cpu

// x: floating, at least 1-D with a non-empty normalised dim; eps > 0 keeps a constant row finite.
inline void check_norm_input(const char* op, const Tensor& x, double eps) {
    QK_CHECK(x.defined(), "{}: x is an undefined tensor", op);
    QK_CHECK(is_compute_dtype(x.dtype()), "{}: x must be float32 or float64, got {} of shape {}",
             op, x.dtype(), x.shape());
    QK_CHECK(x.dim() >= 1, "{}: x must have at least one dim to normalise over, got shape {}", op,
             x.shape());
    QK_CHECK(eps > 0 && std::isfinite(eps),
             "{}: eps must be finite and > 0 (it keeps an all-zero row finite), got {}", op, eps);
}

// Instantiates a cpu kernel template for float and double (ops/norm.h declares them for the tests
// and the benchmark).
#define QK_NORM_INSTANTIATE(kernel)                 \
    template decltype(kernel<float>) kernel<float>; \
    template decltype(kernel<double>) kernel<double>;

inline Tensor empty_like(const Tensor& t) {
    return Tensor::empty(t.shape(), t.dtype(), t.device());
}

}  // namespace qk
