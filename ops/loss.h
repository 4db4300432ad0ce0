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

// The LM head and its loss as one op: loss = cross_entropy(linear(x, weight, {}, precision),
// targets, ignore_index), with the same values and gradients. x: (N, K); weight: (V, K);
// targets: (N) int32. At bf16 or fp16 on cuda the loss's kernel reads each row of logits once for
// the loss and its gradient together, as llm.c's fused classifier does: the gradient for an
// upstream gradient of loss_gradient (what the caller's backward will give the loss: 1, or a loss
// scale over the micro-batches) is written in the forward, rounded and padded as the head's two
// backward GEMMs read it, so the backward reads no logits and writes no float32 gradient. A
// backward with another upstream gradient is still exact: a device-side check finds it and writes
// the gradient again from the logits (one more pass). Elsewhere it is the two ops.
// z_loss > 0 adds z_loss · mean(logsumexp(logits)²) over all N rows (PaLM's z-loss; the model's
// composition: cross_entropy + mean(lse²)·z) in the same kernel; the values then agree with the
// ops' to float32 rounding, not to the bit (one sum in double where the ops add floats).
struct LinearCrossEntropy {
    Tensor loss;    // () the mean cross-entropy (+ the z-loss); its gradient reaches x and weight
    Tensor logits;  // (N, V) the head's output, detached: for reading (a loss that needs the
                    // logits' own gradient, such as a cap, takes linear and cross_entropy)
    Tensor cross_entropy;  // () the mean cross-entropy alone, detached: loss without the z-loss
};
LinearCrossEntropy linear_cross_entropy(const Tensor& x, const Tensor& weight,
                                        const Tensor& targets, Precision precision,
                                        int32_t ignore_index = -1, double loss_gradient = 1.0,
                                        double z_loss = 0.0);

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
// linear_cross_entropy's (float only): the forward above and the gradient for an upstream
// gradient `assumed`, written as g: (N, g_ld) out, rounded to bf16 (half_is_bf16) or fp16 bits,
// zero in columns V..g_ld and on ignored rows; g_upstream: () out, `assumed`. The fixup, launched
// by the backward, compares the upstream gradient dloss with g_upstream on the device: equal, it
// does nothing; else it rewrites g for dloss, to the bits cross_entropy_backward's dx_half would
// have, and sets g_upstream to dloss. z_loss > 0: the loss is the mean cross-entropy plus
// z_loss · mean over all N rows of lse², the gradient includes the z-loss's, and ce: () out gets
// the cross-entropy alone; lse is then every row's (ignored ones too).
template <class T>
void cross_entropy_forward_gradient(T* loss, T* lse, uint16_t* g, T* g_upstream, const T* x,
                                    const int32_t* t, int64_t N, int64_t V, int32_t ignore_index,
                                    int64_t n_valid, int64_t x_ld, int64_t g_ld, double assumed,
                                    bool half_is_bf16, double z_loss = 0, T* ce = nullptr);
template <class T>
void cross_entropy_gradient_fixup(uint16_t* g, T* g_upstream, const T* x, const int32_t* t,
                                  const T* lse, const T* dloss, int64_t N, int64_t V,
                                  int32_t ignore_index, int64_t n_valid, int64_t x_ld, int64_t g_ld,
                                  bool half_is_bf16, double z_loss = 0);
}  // namespace cuda

}  // namespace qk
