// A float32 cuda kernel's optional second output: its result rounded to the half type of the mixed
// GEMM that reads it next (bf16 or fp16), written in the same pass and kept as the result's cast
// copy (keep_cast, core/tensor.h), so that the GEMM finds its operand rounded with no launch of its
// own. softmax (attention's p and dS), glu (the gated MLP's product and its two gradients), gelu
// (the plain MLP's activation), the norms and cross_entropy's gradient take it; the tensor-core
// attention writes its output's (ops/attention.cpp). The values of the result do not change; where
// no copy is written (the cpu, float64, full precision) the GEMM rounds its operand itself, to the
// same bits.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace qk {

// An empty (rows, ...) half tensor to write beside `result`, or undefined where none is written.
inline Tensor rounded_copy_for(const Tensor& result, Precision precision) {
    const bool wanted = precision == Precision::bf16 || precision == Precision::fp16;
    if (!wanted || result.device() != Device::cuda || result.dtype() != kF32) return Tensor();
    return Tensor::empty(result.shape(), precision == Precision::bf16 ? kBF16 : kF16,
                         result.device());
}

// The kernels' view of a copy: its 16-bit elements, or null for none.
inline uint16_t* half_bits(const Tensor& copy) {
    return copy.defined() ? static_cast<uint16_t*>(copy.raw_data()) : nullptr;
}

// After the kernel: the copy (if any) becomes result's cast copy.
inline void keep_rounded_copy(const Tensor& result, const Tensor& copy) {
    if (copy.defined()) keep_cast(result, copy);
}

}  // namespace qk
