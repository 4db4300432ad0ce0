// The gated product of a gated linear unit (SwiGLU, GeGLU): y = act(gate) ⊙ up, one fused op where
// the composition act(gate) * up took an activation and a product, forward and backward.
#pragma once

#include "core/tensor.h"

namespace qk {

enum class GluActivation { silu, gelu };  // SwiGLU (Qwen3, Llama), GeGLU with tanh-GELU (Gemma)

// gate, up: the same shape, float32 or float64, on one device. Equal, bit for bit, to
// silu(gate) * up (or gelu(gate) * up) and to their gradients. rounded_copy bf16 / fp16: on cuda
// the kernels also write y, and in the backward dgate and dup, rounded for the mixed Linear layers
// that read them next (the down projection; the gate and up projections' backward), kept as their
// cast copies (ops/rounded_copy.h).
Tensor glu(const Tensor& gate, const Tensor& up, GluActivation activation,
           Precision rounded_copy = Precision::full);

// Launchers of cuda/glu.cu (device pointers, contiguous, n elements each). The *_half outputs:
// null, or the same values rounded to bf16 (half_is_bf16) or fp16 bits. y, dgate and dup may be
// null where their rounding is written (the rounding only).
namespace cuda {
template <class T>
void glu_forward(T* y, const T* gate, const T* up, int64_t n, GluActivation activation,
                 uint16_t* y_half = nullptr, bool half_is_bf16 = true);
template <class T>
void glu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                  GluActivation activation, uint16_t* dgate_half = nullptr,
                  uint16_t* dup_half = nullptr, bool half_is_bf16 = true);
}  // namespace cuda

}  // namespace qk
