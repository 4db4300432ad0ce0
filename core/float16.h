// IEEE 754 binary16 (float16): the storage type of DType::f16 (`qk::f16`) and its conversions.
//
// float -> f16 and double -> f16 round to nearest, ties to even, from the value's own bits
// (core/minifloat.h derives it), with IEEE overflow: from 65,520 up (halfway past 65,504) the
// result is Inf; NaN stays NaN with its sign. Identical on the cpu, in CUDA kernels
// (QK_HOST_DEVICE) and in the emulator. f16 -> float is exact (every float16 value is a float),
// decoded by the same header.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/minifloat.h"

namespace qk {

QK_HOST_DEVICE inline float float16_to_float(uint16_t h) {
    return static_cast<float>(minifloat::decode(h, MiniFormat::float16));
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
