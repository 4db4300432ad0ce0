// Small floating-point formats, rounded to and read from on the bits: float16 (IEEE binary16) and
// the two FP8 formats of the OCP 8-bit floating point specification, E4M3 and E5M2.
//
// A format with E exponent bits (bias B = 2^(E-1) − 1) and M mantissa bits stores
//     normal     (−1)^s · 2^(e − B) · (1 + m / 2^M)      1 <= e
//     subnormal  (−1)^s · 2^(1 − B) · (m / 2^M)          e = 0
// and reserves codes at the top for Inf and NaN:
//     format   E  M  bias  largest finite   smallest subnormal  Inf          NaN
//     float16  5  10  15   65,504           2^-24               e = 31, m=0  e = 31, m != 0
//     E5M2     5  2   15   57,344           2^-16               e = 31, m=0  e = 31, m != 0
//     E4M3     4  3   7    448              2^-9                none         e = 15, m = 7 only
// E4M3 gives up Inf (and all but one NaN) to reach 448 instead of 240: its e = 15 codes are
// normal numbers except 0x7F / 0xFF.
//
// Rounding a double x to the format, round to nearest, ties to even, in integers only (no
// floating-point operation, so the flush-to-zero mode of the library's threads changes nothing):
// x = S · 2^(ex − 52) with a 53-bit significand S. The last bit the format keeps has weight
// 2^(ex − M) for a normal result and the fixed 2^(1 − B − M) for a subnormal one, so
//     shift = 52 − M                 (normal: ex >= 1 − B)
//           = 52 − M + (1 − B − ex)  (subnormal)
//     kept  = S >> shift, rounded up when the bits cut off exceed half, or equal half and kept
//             is odd.
// The code is then  ((ex + B) << M) + (kept − 2^M)  for a normal result and  kept  for a
// subnormal one: a carry out of the mantissa (kept = 2^(M+1), or 2^M from the largest
// subnormal) steps the exponent field by itself. A code beyond the largest finite one overflows:
// to Inf (IEEE behaviour: float16, E5M2) or to the largest finite value (saturation: E4M3, which
// has no Inf, and any format asked to saturate, as CUDA's cvt ... .satfinite does). An infinite
// input saturates the same way; NaN becomes the format's NaN with the sign kept.
//
// A float is rounded from its own bits the same way (52 → 23 fraction bits, bias 1023 → 127).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace qk {

enum class MiniFormat { float16, e4m3, e5m2 };

// What a conversion does with values beyond the largest finite one.
enum class Overflow { to_inf, saturate };

namespace minifloat {

struct Layout {
    int exponent_bits, mantissa_bits, bias;
    uint32_t max_finite;  // the magnitude code of the largest finite value
    bool has_inf;
    uint32_t nan;  // the magnitude code of the canonical NaN
};

QK_HOST_DEVICE constexpr Layout layout(MiniFormat f) {
    switch (f) {
        case MiniFormat::float16:
            return {5, 10, 15, 0x7BFF, true, 0x7E00};
        case MiniFormat::e5m2:
            return {5, 2, 15, 0x7B, true, 0x7E};
        case MiniFormat::e4m3:
            break;
    }
    return {4, 3, 7, 0x7E, false, 0x7F};
}

// The code (sign bit at 1 << (E + M)) of the format nearest to the binary floating-point value
// with bits u, whose own format has SourceFraction fraction bits and exponent bias SourceBias
// (52 and 1023 for a double, 23 and 127 for a float).
template <int SourceFraction, int SourceBias, class Bits>
QK_HOST_DEVICE inline uint32_t round_bits(Bits u, MiniFormat format, Overflow overflow) {
    const Layout l = layout(format);
    const int width = l.exponent_bits + l.mantissa_bits;
    constexpr int kSourceExponentMax = 2 * SourceBias + 1;
    const uint32_t sign = static_cast<uint32_t>(u >> (sizeof(Bits) * 8 - 1)) << width;
    const int biased = static_cast<int>((u >> SourceFraction) & kSourceExponentMax);
    const uint64_t fraction = static_cast<uint64_t>(u) & ((uint64_t{1} << SourceFraction) - 1);
    const uint32_t inf = (uint32_t{(1u << l.exponent_bits) - 1}) << l.mantissa_bits;
    const uint32_t too_big = l.has_inf && overflow == Overflow::to_inf ? inf : l.max_finite;
    if (biased == kSourceExponentMax) return sign | (fraction ? l.nan : too_big);
    if (biased == 0) return sign;  // zero, or a subnormal source: far below every format's range
    const int ex = biased - SourceBias;
    const int min_normal = 1 - l.bias;
    if (ex > l.bias + 1) return sign | too_big;  // at least 2^(bias + 2): overflows however rounded
    const uint64_t S = (uint64_t{1} << SourceFraction) | fraction;
    const int shift = SourceFraction - l.mantissa_bits + (ex >= min_normal ? 0 : min_normal - ex);
    if (shift > SourceFraction + 1) return sign;  // below half the smallest subnormal
    uint64_t kept = S >> shift;
    const uint64_t rest = S & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) ++kept;
    const uint64_t code = ex >= min_normal
                              ? (static_cast<uint64_t>(ex + l.bias) << l.mantissa_bits) +
                                    (kept - (uint64_t{1} << l.mantissa_bits))
                              : kept;
    return sign | (code > l.max_finite ? too_big : static_cast<uint32_t>(code));
}

QK_HOST_DEVICE inline uint32_t round_double(double x, MiniFormat format, Overflow overflow) {
    uint64_t u;
    std::memcpy(&u, &x, sizeof u);
    return round_bits<52, 1023>(u, format, overflow);
}
QK_HOST_DEVICE inline uint32_t round_float(float x, MiniFormat format, Overflow overflow) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return round_bits<23, 127>(u, format, overflow);
}

// The value of a code, exactly (every value of these formats is a float, and a double).
QK_HOST_DEVICE inline double decode(uint32_t code, MiniFormat format) {
    const Layout l = layout(format);
    const int width = l.exponent_bits + l.mantissa_bits;
    const bool negative = (code >> width) & 1u;
    const uint32_t magnitude = code & ((1u << width) - 1);
    const uint32_t e = magnitude >> l.mantissa_bits, m = magnitude & ((1u << l.mantissa_bits) - 1);
    const uint32_t top = (1u << l.exponent_bits) - 1;
    const bool nan = l.has_inf ? e == top && m : magnitude == l.nan;
    const bool inf = l.has_inf && e == top && !m;
    // 2^(e − B − M) · (2^M + m) for a normal code, 2^(1 − B − M) · m for a subnormal one, Inf and
    // NaN as their double bits: exact, and free of libm (this runs in device code too).
    const int power = (e ? static_cast<int>(e) : 1) - l.bias - l.mantissa_bits;
    const uint64_t bits = nan   ? uint64_t{0x7FF8} << 48
                          : inf ? uint64_t{0x7FF} << 52
                                : static_cast<uint64_t>(power + 1023) << 52;
    double value;
    std::memcpy(&value, &bits, sizeof value);
    if (!nan && !inf) value *= static_cast<double>(e ? (1u << l.mantissa_bits) + m : m);
    return negative ? -value : value;
}

}  // namespace minifloat

// x rounded to the format and read back: the value a tensor element becomes when stored in it.
QK_HOST_DEVICE inline float round_to_format(float x, MiniFormat format, Overflow overflow) {
    return static_cast<float>(
        minifloat::decode(minifloat::round_float(x, format, overflow), format));
}

// The largest finite value of the format: 65,504, 448 or 57,344.
QK_HOST_DEVICE inline double max_finite(MiniFormat format) {
    return minifloat::decode(minifloat::layout(format).max_finite, format);
}

// round_to_format again, for a float, by float arithmetic that vectorises: the same values
// (tests/test_minifloat.cpp holds it to round_to_format on every tie and its neighbours), ~20x
// faster in a loop. For |x| in the binade [2^e, 2^(e+1)), the format keeps multiples of
// q = 2^(e − M) (below the normal range, of the fixed 2^(e_min − M)); the float sum |x| + 2^(e + 23
// − M) has exactly that ulp, so the FPU's own round-to-nearest-even rounds it to a multiple of q,
// and subtracting the magic number back is exact. Above the largest finite value the result
// saturates, or becomes Inf (IEEE formats, to_inf). Float subnormals round to 0, as there.
class FastRounder {
  public:
    QK_HOST_DEVICE FastRounder(MiniFormat format, Overflow overflow) {
        const minifloat::Layout l = minifloat::layout(format);
        mantissa_bits_ = l.mantissa_bits;
        min_exponent_ = 1 - l.bias;
        // Past the largest binade every value overflows: capping e there keeps 2^(e + 23 − M) a
        // finite float for any x, Inf and NaN included.
        cap_exponent_ = static_cast<int>(l.max_finite >> l.mantissa_bits) - l.bias + 1;
        largest_ = static_cast<float>(max_finite(format));
        const uint32_t inf_bits = 0x7f800000u;
        float inf;
        std::memcpy(&inf, &inf_bits, sizeof inf);
        too_big_ = l.has_inf && overflow == Overflow::to_inf ? inf : largest_;
    }
    QK_HOST_DEVICE float operator()(float x) const {
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        const uint32_t sign = bits & 0x80000000u, magnitude_bits = bits & 0x7fffffffu;
        int e = static_cast<int>(magnitude_bits >> 23) - 127;
        e = e < min_exponent_ ? min_exponent_ : e > cap_exponent_ ? cap_exponent_ : e;
        const uint32_t magic_bits = static_cast<uint32_t>(e - mantissa_bits_ + 23 + 127) << 23;
        float magnitude, magic;
        std::memcpy(&magnitude, &magnitude_bits, sizeof magnitude);
        std::memcpy(&magic, &magic_bits, sizeof magic);
        float r = (magnitude + magic) - magic;
        r = r > largest_ ? too_big_ : r;  // a NaN stays NaN
        uint32_t r_bits;
        std::memcpy(&r_bits, &r, sizeof r_bits);
        r_bits |= sign;
        std::memcpy(&r, &r_bits, sizeof r);
        return r;
    }

  private:
    int mantissa_bits_, min_exponent_, cap_exponent_;
    float largest_, too_big_;
};

}  // namespace qk
