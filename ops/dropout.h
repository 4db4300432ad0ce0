// Dropout.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace qk {

// Zeroes each element with probability p and scales the rest by 1 / (1 - p) (inverted dropout),
// with the mask drawn from `gen`; returns x itself when !training or p == 0. p must be in
// [0, 1]; p == 1 drops everything (zeros, zero gradient). One 32-bit draw per element, row-major:
// the same generator state gives the same mask on any machine or thread count.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

// The CUDA twin of cpu::apply_mask in ops/dropout.cpp (cuda/dropout.cu): device pointers,
// contiguous. out, in: (n); keep: (n), 1 = kept, drawn on the cpu and copied to the device.
//   out[i] = keep[i] ? in[i] * s : 0.   Instantiated for float and double.
namespace cuda {
template <class T>
void apply_mask(T* out, const T* in, const uint8_t* keep, int64_t n, T s);
}  // namespace cuda

}  // namespace qk
