// float32 <-> float16 runs (core/half_convert.h).
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

}  // namespace

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
