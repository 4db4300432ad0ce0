// lane_sum: a row sum whose rounding is fixed by the code, not by the compiler.
//
// A float32 running sum over a long row (a 50257-logit softmax) loses ~sqrt(n)·eps relative
// precision, and `#pragma omp simd reduction` only helps when the loop really vectorises: an
// AddressSanitizer or -O0 build does not, and the same kernel then gave 9e-5 instead of 7e-6.
// Here the row is summed in kLanes interleaved partial sums, combined pairwise at the end: the
// same arithmetic whether or not the compiler maps the lanes to SIMD registers (it does at -O2+),
// so every build type computes the same bits.
#pragma once

#include <cstdint>
#include <utility>

namespace qk::math {

inline constexpr int kLanes = 16;  // one AVX-512 register of floats

// Σ_{i<n} term(i).
template <class T, class Term>
inline T lane_sum(int64_t n, Term&& term) {
    T acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
    for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    return acc[0];
}

// Two sums in one pass over the same elements: term(i, a, b) adds element i's two terms into a
// and b (it may also store a value of its own). Returns {Σ a-terms, Σ b-terms}, each with
// lane_sum's fixed rounding.
template <class T, class Term>
inline std::pair<T, T> lane_sum2(int64_t n, Term&& term) {
    T acc_a[kLanes] = {}, acc_b[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) term(i + l, acc_a[l], acc_b[l]);
    for (int l = 0; i + l < n; ++l) term(i + l, acc_a[l], acc_b[l]);
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) {
            acc_a[l] += acc_a[l + width];
            acc_b[l] += acc_b[l + width];
        }
    return {acc_a[0], acc_b[0]};
}

}  // namespace qk::math
