// The emulator's stand-in for <cuda_bf16.h>: the __nv_bfloat16 type and the conversions the
// project's kernels use, with CUDA's semantics (include it through cuda/bf16_convert.h).
//
//   __float2bfloat16_rn(x), __float2bfloat16(x)   round to nearest, ties to even; every NaN
//                                                 becomes the canonical NaN 0x7FFF, as CUDA's
//                                                 conversion (cvt.rn.bf16.f32) gives it
//   __bfloat162float(h)                           exact: the 16 bits shifted up
//   __bfloat16_as_ushort, __ushort_as_bfloat16    the bits, unchanged
//
// The rounding of non-NaN values is the project's own (qk::bf16_bits::round_float, the one the
// cpu uses): the emulator's job is to run kernels with the GPU's results, and a GPU rounds every
// non-NaN float to the same bf16 (test_cuda_core checks it on the device when one is present).
#pragma once

#include <cstdint>

#include "core/bfloat16.h"

struct __nv_bfloat16 {
    unsigned short __x;  // the bits, under CUDA's member name
};

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    const uint32_t u = qk::bf16_bits::float_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __nv_bfloat16{0x7FFF};  // CUDA's canonical NaN
    return __nv_bfloat16{qk::bf16_bits::round_float(u)};
}
inline __nv_bfloat16 __float2bfloat16(float x) { return __float2bfloat16_rn(x); }

inline float __bfloat162float(__nv_bfloat16 h) {
    return qk::bf16_bits::bits_float(static_cast<uint32_t>(h.__x) << 16);
}
