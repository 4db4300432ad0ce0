// Losses.
#pragma once

#include "core/tensor.h"

namespace qk {

// Fused log-softmax + negative log-likelihood. logits: (N, V) float (rows of unit stride are read
// where they lie: a narrowed view of wider rows is not copied); targets: (N) int32. Returns the
// mean over the targets that are not ignore_index (a scalar). rounded_copy bf16 / fp16: on cuda
// the backward also writes the logits' gradient rounded, for the LM head's mixed GEMMs that read
// it next, kept as its cast copy (ops/rounded_copy.h); no value changes.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -1,
                     Precision rounded_copy = Precision::full);

// The kernels behind cross_entropy, declared for the kernel-level parity tests. Raw pointers:
// x: (N, V) logits, row i at x + i·x_ld (x_ld >= V: the rows of a wider buffer, e.g. a padded
// head's); dx: (N, V) their gradient, contiguous; t: (N) int32 targets; lse: (N), log Σ exp per row
// (0 on ignored rows). Instantiated for float and double.
namespace cpu {
// Returns Σ_{valid i} (lse_i − x_{i,t_i}) in double, summed in row order.
template <class T>
double cross_entropy_forward(T* lse, const T* x, const int32_t* t, int64_t N, int64_t V,
                             int32_t ignore_index, int64_t x_ld);
// scale = dL / n_valid.
template <class T>
void cross_entropy_backward(T* dx, const T* x, const int32_t* t, const T* lse, int64_t N, int64_t V,
                            int32_t ignore_index, T scale, int64_t x_ld);
}  // namespace cpu

// The CUDA twins (cuda/loss.cu): device pointers. The targets must already be checked (in
// range or ignore_index, n_valid > 0 of them). loss: () out, the mean over valid rows, written on
// the device; dloss: () the upstream gradient, read on the device.
namespace cuda {
template <class T>
void cross_entropy_forward(T* loss, T* lse, const T* x, const int32_t* t, int64_t N, int64_t V,
                           int32_t ignore_index, int64_t n_valid, int64_t x_ld);
// dx_half: null, or (N, V) out, dx rounded to bf16 (half_is_bf16) or fp16 bits.
template <class T>
void cross_entropy_backward(T* dx, const T* x, const int32_t* t, const T* lse, const T* dloss,
                            int64_t N, int64_t V, int32_t ignore_index, int64_t n_valid,
                            int64_t x_ld, uint16_t* dx_half = nullptr, bool half_is_bf16 = true);
}  // namespace cuda

}  // namespace qk
