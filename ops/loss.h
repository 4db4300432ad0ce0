// Losses.
#pragma once

#include "core/tensor.h"

namespace qk {

// Fused log-softmax + negative log-likelihood. logits: (N, V) float; targets: (N) int32.
// Returns the mean over the targets that are not ignore_index (a scalar).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -1);

}  // namespace qk
