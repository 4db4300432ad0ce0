// float32 <-> float16 and float32 -> bfloat16 runs (core/half_convert.h).
#include "core/half_convert.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace qk::cpu {

#if defined(__x86_64__)
namespace {

__attribute__((target("f16c,avx"))) void floats_to_f16_f16c(f16* dst, const float* src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = f16(src[i]);
}

__attribute__((target("f16c,avx"))) void f16_to_floats_f16c(float* dst, const f16* src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = src[i].to_float();
}

// The rule of bf16_bits::round_float on 16 lanes: (u + 0x7FFF + lsb) >> 16, a NaN (|u| above
// Inf's bits) keeps its top bits with the quiet bit set. The 32-bit lanes hold results < 2^16,
// so vpmovdw's truncation to 16 bits is exact. GCC 12's headers start the shift and the narrowing
// from _mm512_undefined, which its -Wmaybe-uninitialized flags (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void floats_to_bf16_avx512(bf16* dst, const float* src,
                                                              int64_t n) {
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i quiet = _mm512_set1_epi32(0x0040);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512(src + i);
        const __m512i top = _mm512_srli_epi32(u, 16);
        const __m512i tie_to_even = _mm512_and_si512(top, one);
        const __m512i rounded =
            _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), tie_to_even), 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
        const __m512i bits = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(top, quiet));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
    }
    for (; i < n; ++i) dst[i] = bf16(src[i]);
}
#pragma GCC diagnostic pop

}  // namespace

bool has_avx512f() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}

// CPUID leaf 1: F16C and AVX, and the OS saving the ymm registers (OSXSAVE, XCR0 bits 1-2).
// Asked directly: clang's __builtin_cpu_supports knows no "f16c".
bool has_f16c() {
    static const bool yes = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
        if (!(c & bit_F16C) || !(c & bit_AVX) || !(c & bit_OSXSAVE)) return false;
        unsigned xcr0_lo = 0, xcr0_hi = 0;
        __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        return (xcr0_lo & 6u) == 6u;
    }();
    return yes;
}
#else
bool has_f16c() { return false; }
bool has_avx512f() { return false; }
#endif

void floats_to_f16(f16* dst, const float* src, int64_t n) {
#if defined(__x86_64__)
    if (has_f16c()) return floats_to_f16_f16c(dst, src, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = f16(src[i]);
}

void f16_to_floats(float* dst, const f16* src, int64_t n) {
#if defined(__x86_64__)
    if (has_f16c()) return f16_to_floats_f16c(dst, src, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i].to_float();
}

}  // namespace qk::cpu

namespace qk::cpu {

void floats_to_bf16(bf16* dst, const float* src, int64_t n) {
#if defined(__x86_64__)
    if (has_avx512f()) return floats_to_bf16_avx512(dst, src, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16(src[i]);
}

}  // namespace qk::cpu
