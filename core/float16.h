// IEEE 754 binary16 (float16): the storage type of DType::f16 (`qk::f16`) and its conversions.
//
// float -> f16 and double -> f16 round to nearest, ties to even, from the value's own bits
// (core/minifloat.h derives it), with IEEE overflow: from 65,520 up (halfway past 65,504) the
// result is Inf; NaN stays NaN with its sign. Identical on the cpu, in CUDA kernels
// (QK_HOST_DEVICE) and in the emulator. f16 -> float is exact:
//
// A float16 is 1 sign bit, 5 exponent bits (bias 15) and 10 fraction bits. Normal numbers are
// (−1)^s · 2^(e − 15) · 1.f; e = 0 holds zero and the subnormals 2^−14 · 0.f; e = 31 holds inf
// (f = 0) and NaN. A float32 has 8 exponent bits (bias 127) and 23 fraction bits, so a normal
// float16 moves over by rebiasing the exponent (+112) and shifting the fraction left by 13; a
// subnormal one is normalised first (it is a normal float32); inf and NaN keep their fraction.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "core/minifloat.h"

namespace qk {

QK_HOST_DEVICE inline float float16_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, fraction = h & 0x3ffu, bits;
    if (exponent == 0x1f) {  // inf or NaN
        bits = sign | 0x7f800000u | (fraction << 13);
    } else if (exponent != 0) {  // normal
        bits = sign | ((exponent + 112) << 23) | (fraction << 13);
    } else if (fraction == 0) {  // ±0
        bits = sign;
    } else {             // subnormal: shift until the leading 1 reaches the implicit bit's place
        exponent = 113;  // 2^−14 as a float32 exponent, + 127 − 14
        while ((fraction & 0x400u) == 0) {
            fraction <<= 1;
            --exponent;
        }
        bits = sign | (exponent << 23) | ((fraction & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

struct f16 {
    uint16_t bits = 0;

    f16() = default;
    QK_HOST_DEVICE explicit f16(float f)
        : bits(static_cast<uint16_t>(
              minifloat::round_float(f, MiniFormat::float16, Overflow::to_inf))) {}
    QK_HOST_DEVICE explicit f16(double d)
        : bits(static_cast<uint16_t>(
              minifloat::round_double(d, MiniFormat::float16, Overflow::to_inf))) {}
    QK_HOST_DEVICE explicit f16(int32_t i) : f16(static_cast<double>(i)) {}

    QK_HOST_DEVICE static f16 from_bits(uint16_t b) {
        f16 h;
        h.bits = b;
        return h;
    }
    QK_HOST_DEVICE float to_float() const { return float16_to_float(bits); }
    QK_HOST_DEVICE explicit operator float() const { return to_float(); }
    // float16's subnormals (down to 2^-24) are normal floats, so the float is exact and its
    // widening to double is unaffected by denormals-are-zero.
    QK_HOST_DEVICE double to_double() const { return static_cast<double>(to_float()); }
    QK_HOST_DEVICE explicit operator double() const { return to_double(); }
    QK_HOST_DEVICE explicit operator int32_t() const { return static_cast<int32_t>(to_float()); }
};
static_assert(sizeof(f16) == 2, "f16 is stored as its 16 bits");

// Round-trip: the float16 nearest to x, back as a float (what a value becomes when stored).
QK_HOST_DEVICE inline float round_to_f16(float x) { return f16(x).to_float(); }

}  // namespace qk
