// The unfused attention at bf16 / fp16 on cuda as one node, which keeps only the T² buffers its
// GEMMs read and skips the causal mask's upper blocks: ops/attention_materialized.cpp.
#pragma once

#include <array>

#include "ops/attention.h"

namespace qk {

// Whether attention_unfused takes the one-node path for these arguments: cuda, float32 q at
// bf16 or fp16 precision, a scale number (no scale tensor), no window, FP8 logits, dropout or
// signals, Tq and Tk > 0. Everything else runs the composition.
bool materialized_attention_applies(const Tensor& q, const Tensor& k, const AttentionOptions& o,
                                    const AttentionSignals* signals);

// q, k, v: (B, H, Tq or Tk, D) float32 on cuda, k and v with H heads (repeat_kv'd), checked by
// attention_unfused -> (B, H, Tq, D); differentiable in q, k, v.
Tensor attention_materialized(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& o);

#ifdef QK_WITH_CUDA
// q, k, v rounded to `half`, contiguous (B, heads, T, D), for the tensor-core attention and the
// materialised one (ops/attention.cpp): a rounding kept beside a contiguous input (the per-head
// QK-norms write one in their own pass) is read as it is, and the others are rounded together,
// in one launch.
std::array<Tensor, 3> rounded_attention_inputs(const std::array<Tensor, 3>& inputs, DType half);
#endif

}  // namespace qk
