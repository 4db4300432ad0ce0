// bfloat16: the top 16 bits of a float32 (sign, the same 8 exponent bits, 7 mantissa bits).
//
// Same range as float32 (max 3.39e38, smallest normal 1.18e-38), 8 significant bits: a value is
// known to within 2^-8 of itself, so 1000 is stored as one of 996, 1000, 1004. Products of two
// bfloat16 values are exact in float32 (8 + 8 bits < 24), which is why bf16 GEMMs accumulate in
// float32 and lose nothing but the rounding of their inputs.
//
// Rounding, identical on the cpu, in CUDA kernels and in the emulator (this one header serves
// all three, QK_HOST_DEVICE marking it callable from device code):
//   float -> bf16   round to nearest, ties to even, on the bits:
//                       bits + 0x7FFF + (bit 16 of bits)   then keep the top 16 bits
//                   the carry ripples into the exponent when it must, so the largest floats
//                   round to Inf and subnormals round like any other value;
//                   NaN stays NaN: its top 16 bits with the quiet bit set (x86's vcvtneps2bf16
//                   does the same), never the Inf that the carry would otherwise make.
//   double -> bf16  rounded once, on the double's bits, not through float: a (float) cast
//                   first would round twice (1 + 2^-8 + 2^-30 to the tie 1 + 2^-8, then down
//                   to 1 instead of up), and under flush-to-zero it would zero the values that
//                   bf16's subnormals can still hold.
//   bf16 -> float   exact: the 16 bits shifted back up.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace qk {

namespace bf16_bits {

QK_HOST_DEVICE inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);  // a bit cast both host and device compilers accept
    return u;
}
QK_HOST_DEVICE inline uint64_t double_bits(double d) {
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    return u;
}
QK_HOST_DEVICE inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// float32 bits -> bfloat16 bits, round to nearest even.
QK_HOST_DEVICE inline uint16_t round_float(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
    const uint32_t tie_to_even = (u >> 16) & 1u;
    return static_cast<uint16_t>((u + 0x7FFFu + tie_to_even) >> 16);
}

// double bits -> bfloat16 bits, round to nearest even, on the integer bits: no float conversion,
// whose result the flush-to-zero mode of the library's threads would change for tiny values.
// The significand s (53 bits with the implicit 1) is cut at the bit that bf16 keeps last:
// 8 significant bits for a normal result, a fixed quantum of 2^-133 for a subnormal one.
QK_HOST_DEVICE inline uint16_t round_double(uint64_t u) {
    const uint16_t sign = static_cast<uint16_t>((u >> 48) & 0x8000u);
    const int biased = static_cast<int>((u >> 52) & 0x7FF);
    const uint64_t fraction = u & ((uint64_t{1} << 52) - 1);
    if (biased == 0x7FF) return sign | (fraction ? 0x7FC0 : 0x7F80);  // NaN, Inf
    if (biased == 0) return sign;  // zero or a double subnormal (< 2^-1022): rounds to 0
    const int e = biased - 1023;   // value = s · 2^(e - 52)
    if (e >= 128) return sign | 0x7F80;
    const uint64_t s = (uint64_t{1} << 52) | fraction;
    const int shift = e >= -126 ? 52 - 7 : -e - 81;  // bits of s below the last kept one
    if (shift >= 60) return sign;  // |x| < 2^-140, far below half the smallest subnormal (2^-134)
    uint64_t kept = s >> shift;
    const uint64_t rest = s & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) ++kept;
    // A normal result adds the 7 stored bits (kept - 128) to the exponent field, so a carry out
    // of the significand (kept = 256) steps the exponent, up to Inf; a subnormal result is kept
    // itself, 128 being the smallest normal.
    const uint32_t magnitude =
        e >= -126 ? (static_cast<uint32_t>(e + 127) << 7) + static_cast<uint32_t>(kept - 128)
                  : static_cast<uint32_t>(kept);
    return sign | static_cast<uint16_t>(magnitude);
}

}  // namespace bf16_bits

struct bf16 {
    uint16_t bits = 0;

    bf16() = default;
    QK_HOST_DEVICE explicit bf16(float f)
        : bits(bf16_bits::round_float(bf16_bits::float_bits(f))) {}
    QK_HOST_DEVICE explicit bf16(double d)
        : bits(bf16_bits::round_double(bf16_bits::double_bits(d))) {}
    QK_HOST_DEVICE explicit bf16(int32_t i) : bf16(static_cast<double>(i)) {}

    QK_HOST_DEVICE static bf16 from_bits(uint16_t b) {
        bf16 h;
        h.bits = b;
        return h;
    }
    QK_HOST_DEVICE float to_float() const {
        return bf16_bits::bits_float(static_cast<uint32_t>(bits) << 16);
    }
    QK_HOST_DEVICE explicit operator float() const { return to_float(); }
    // Exact for subnormals too: a float -> double conversion would read them as 0 on a thread
    // with denormals-are-zero set (every thread of the library), and not on a GPU.
    QK_HOST_DEVICE double to_double() const {
        const uint16_t magnitude = bits & 0x7FFF;
        if (magnitude == 0 || magnitude >= 0x80) return to_float();  // zero, normal, Inf, NaN
        const double subnormal = static_cast<double>(magnitude) * 0x1p-133;
        return (bits & 0x8000) ? -subnormal : subnormal;
    }
    QK_HOST_DEVICE explicit operator double() const { return to_double(); }
    QK_HOST_DEVICE explicit operator int32_t() const { return static_cast<int32_t>(to_float()); }
};
static_assert(sizeof(bf16) == 2, "bf16 is stored as its 16 bits");

// Round-trip: the bfloat16 nearest to x, back as a float (what a value becomes when stored).
QK_HOST_DEVICE inline float round_to_bf16(float x) { return bf16(x).to_float(); }

}  // namespace qk
