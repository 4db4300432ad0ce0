// Reductions over given dims, with keepdim; and math::exp_fast, the vectorisable exp shared by
// the exp-sum kernels (logsumexp here, softmax, cross_entropy).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace qk {

using Dims = std::vector<int64_t>;  // negative dims count from the end; {} means all dims

Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), like torch.var.
Tensor var(const Tensor& x, const Dims& dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor logsumexp(const Tensor& x, const Dims& dims = {}, bool keepdim = false);

// Sums x down to `shape`, the inverse of broadcasting: dims that broadcasting added or expanded
// from 1 are summed. The backward of every broadcasting op goes through it.
Tensor sum_to(const Tensor& x, const Shape& shape);

namespace math {

// exp for the exp-sum kernels (logsumexp, softmax, cross_entropy), written so that a loop of it
// vectorises: glibc's expf is a scalar call (~3 ns here) that stops the loop from vectorising,
// while this runs ~10x faster in AVX-512 lanes. float: Cephes' expf, exp(x) = 2^k · e^r with
// k = round(x / ln 2), r = x − k ln 2 in [−ln2/2, ln2/2] (ln 2 split in two for an exact
// product), e^r by a degree-7 polynomial; max relative error 8.5e-8 (1.4 ulp) measured over
// [−87, 88]. x < −87.34 gives 0, x > 88.376 gives +inf (the true overflow is at 88.72; the kernels
// only pass x − max <= 0), NaN stays NaN. double: std::exp (float64 is for gradcheck, not speed).
template <class T>
inline T exp_fast(T x) {
    if constexpr (std::is_same_v<T, double>) {
        return std::exp(x);
    } else {
        constexpr float lo = -87.33654f, hi = 88.3762626f;
        float xc = x < lo ? lo : x;
        xc = xc > hi ? hi : xc;
        // 1.5 · 2^23: adding it rounds to an integer (IEEE arithmetic; -ffast-math would fold it)
        constexpr float shifter = 12582912.0f;
        const float k = (xc * 1.44269504088896341f + shifter) - shifter;
        const float r = xc - k * 0.693359375f - k * -2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        float y = p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);  // · 2^k
        y = x < lo ? 0.0f : y;
        y = x > hi ? std::numeric_limits<float>::infinity() : y;
        return x != x ? x : y;
    }
}

}  // namespace math

}  // namespace qk
