// The gated product of a gated linear unit (SwiGLU, GeGLU): y = act(gate) ⊙ up, one fused op where
// the composition act(gate) * up took an activation and a product, forward and backward.
#pragma once

#include "core/tensor.h"

namespace qk {

enum class GluActivation { silu, gelu };  // SwiGLU (Qwen3, Llama), GeGLU with tanh-GELU (Gemma)

// gate, up: the same shape, float32 or float64, on one device. Equal, bit for bit, to
// silu(gate) * up (or gelu(gate) * up) and to their gradients.
Tensor glu(const Tensor& gate, const Tensor& up, GluActivation activation);

// Launchers of cuda/glu.cu (device pointers, contiguous, n elements each).
namespace cuda {
template <class T>
void glu_forward(T* y, const T* gate, const T* up, int64_t n, GluActivation activation);
template <class T>
void glu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                  GluActivation activation);
}  // namespace cuda

}  // namespace qk
