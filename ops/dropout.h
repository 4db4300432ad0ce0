// Dropout.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace qk {

// Zeroes each element with probability p and scales the rest by 1 / (1 - p) (inverted dropout),
// with the mask drawn from `gen`; the identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace qk
