// Embedding lookup.
#pragma once

#include "core/tensor.h"

namespace qk {

// weight: (V, C) float; ids: any shape, int32 in [0, V) -> (*ids.shape, C).
// Backward scatter-adds dy rows into dweight (repeated ids accumulate); ids get no gradient.
// Throws qk::Error naming the position and value of an id outside [0, V). ids may be on the cpu
// when weight is on cuda (they are checked on the host and copied); otherwise same device.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// The CUDA twins of the cpu kernels in ops/embedding.cpp (cuda/embedding.cu): device pointers,
// contiguous, ids already checked to be in [0, V). Instantiated for float and double.
//   y: (N, C) out; weight: (V, C); ids: (N).
//   dweight: (V, C), zeroed by the caller, accumulated into with atomicAdd; dy: (N, C).
namespace cuda {
template <class T>
void embedding_forward(T* y, const T* weight, const int32_t* ids, int64_t N, int64_t C);
template <class T>
void embedding_backward(T* dweight, const T* dy, const int32_t* ids, int64_t N, int64_t C);
}  // namespace cuda

}  // namespace qk
