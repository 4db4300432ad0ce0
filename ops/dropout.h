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

}  // namespace qk
