// float32 -> bfloat16 inside CUDA kernels: the device's own conversion instruction
// (__float2bfloat16_rn, cvt.rn.bf16.f32 on sm_80 and later: one instruction where the bit
// arithmetic of core/bfloat16.h takes five), with the project's NaN rule on top.
//
// Both round to nearest even on the bits, so every non-NaN float gives the same bf16 as on the
// cpu (test_cuda_core compares all of them on a GPU, and a sample in the emulator, whose
// <cuda_bf16.h> stand-in is cuda/emu/cuda_bf16.h). They differ only for NaN: CUDA returns the
// canonical 0x7FFF, which drops the sign; qk::bf16 keeps the sign and the top payload bits, as
// x86's vcvtneps2bf16 does, so a NaN's bits are the same wherever it was rounded.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "core/dtype.h"
#include "core/float16.h"
#include "cuda/emu/cuda_compat.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#else
#include "cuda/emu/cuda_bf16.h"
#endif

namespace qk::cuda {

__device__ __forceinline__ bf16 float_to_bf16(float x) {
    if (x != x) return bf16(x);  // NaN: the project's rule, not CUDA's canonical NaN
    return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}

// The copy kernels' element conversion: the cpu's (convert_value, core/dtype.h), except
// float -> bf16 on the instruction.
template <class D, class S>
__device__ __forceinline__ D convert_element(S x) {
    if constexpr (std::is_same_v<D, bf16> && std::is_same_v<S, float>)
        return float_to_bf16(x);
    else
        return convert_value<D>(x);
}

// A kernel's optional rounded copy of an output element (ops/rounded_copy.h): bf16 or fp16 bits
// at half_out[i], rounded as the copy kernels round; nothing when half_out is null.
template <class T>
__device__ __forceinline__ void store_half(uint16_t* half_out, int64_t i, T value, bool is_bf16) {
    if (!half_out) return;
    const float f = static_cast<float>(value);
    half_out[i] = is_bf16 ? float_to_bf16(f).bits : convert_element<f16>(f).bits;
}

}  // namespace qk::cuda
