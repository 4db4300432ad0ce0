// IEEE 754 binary16 (float16) to float32, exactly: every float16 value is a float32 value.
//
// A float16 is 1 sign bit, 5 exponent bits (bias 15) and 10 fraction bits. Normal numbers are
// (−1)^s · 2^(e − 15) · 1.f; e = 0 holds zero and the subnormals 2^−14 · 0.f; e = 31 holds inf
// (f = 0) and NaN. A float32 has 8 exponent bits (bias 127) and 23 fraction bits, so a normal
// float16 moves over by rebiasing the exponent (+112) and shifting the fraction left by 13; a
// subnormal one is normalised first (it is a normal float32); inf and NaN keep their fraction.
#pragma once

#include <cstdint>
#include <cstring>

namespace qk {

inline float float16_to_float(uint16_t h) {
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

}  // namespace qk
