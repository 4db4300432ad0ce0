// lane_sum: a row sum whose rounding is fixed by the code, not by the compiler (and lane_max,
// a row max written the same way so that it vectorises).
//
// A float32 running sum over a long row (a 50257-logit softmax) loses ~sqrt(n)·eps relative
// precision, and `#pragma omp simd reduction` only helps when the loop really vectorises: an
// AddressSanitizer or -O0 build does not, and the same kernel then gave 9e-5 instead of 7e-6.
// Here the row is summed in kLanes interleaved partial sums, combined pairwise at the end: the
// same additions whether or not the compiler maps the lanes to SIMD registers (it does at -O2+),
// so every build type sums in the same order. (A term's own multiply-add may still be fused into
// one FMA by an optimising build and not by -O0: GCC contracts by default in C++.)
//
// How it is written matters for speed on short rows (a QK-norm head of D = 32 is two registers):
// every loop has a trip count the compiler knows, so acc stays in one register. The ragged tail
// is staged in a zero-padded register (acc + 0 is acc exactly, so the rounding is the one the
// interleaved order defines), and the pairwise combine is three fixed halvings plus one add. A
// tail loop over acc[l] for l < n − i and a `width /= 2` combine loop forced acc onto the stack:
// layer_norm at (4096, 32) ran 23.7 ns a row that way and 18.0 ns this way (bench_norm).
#pragma once

#include <cstdint>
#include <limits>

namespace qk::math {

inline constexpr int kLanes = 16;  // one AVX-512 register of floats

// acc[0] after combining the kLanes partial sums pairwise: lanes l and l + 8, then l and l + 4, …
template <class T>
inline T combine_lanes(T* acc) {
    static_assert(kLanes == 16, "the combine below is written out for 16 lanes");
    for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
    for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
    for (int l = 0; l < 2; ++l) acc[l] += acc[l + 2];
    return acc[0] + acc[1];
}

// Σ_{i<n} term(i).
template <class T, class Term>
inline T lane_sum(int64_t n, Term&& term) {
    T acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
    if (i < n) {  // the last n − i < kLanes terms, into lanes 0 … n − i − 1
        T tail[kLanes] = {};
        for (int64_t l = 0; l < n - i; ++l) tail[l] = term(i + l);
        for (int l = 0; l < kLanes; ++l) acc[l] += tail[l];
    }
    return combine_lanes(acc);
}

// max_{i<n} term(i), −inf for n = 0; a NaN term is skipped (a comparison with NaN is false), as
// by a sequential `m = t > m ? t : m`. The max is exact and does not depend on the order, so
// these lanes change no value, only the speed: written as one `#pragma omp simd reduction(max)`
// loop beside other work, GCC 12 left the online softmax's row max scalar, a chain of dependent
// vmaxss that took a third of that function's time.
template <class T, class Term>
inline T lane_max(int64_t n, Term&& term) {
    constexpr T lowest = -std::numeric_limits<T>::infinity();
    T acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = lowest;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) {
            const T t = term(i + l);
            acc[l] = t > acc[l] ? t : acc[l];
        }
    for (; i < n; ++i) {  // the ragged tail, fewer than kLanes terms
        const T t = term(i);
        acc[0] = t > acc[0] ? t : acc[0];
    }
    T m = acc[0];
    for (int l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
    return m;
}

}  // namespace qk::math
