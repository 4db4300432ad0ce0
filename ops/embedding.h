// Embedding lookup.
#pragma once

#include "core/tensor.h"

namespace qk {

// weight: (V, C) float; ids: any shape, int32 in [0, V) -> (*ids.shape, C).
// Backward scatter-adds dy rows into dweight (repeated ids accumulate); ids get no gradient.
// Throws qk::Error naming the position and value of an id outside [0, V).
Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace qk
