// Reductions over given dims, with keepdim. (math::exp_fast, the vectorisable exp of the exp-sum
// kernels, lives in ops/elementwise_math.h, included here for them.)
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/elementwise_math.h"

namespace qk {

using Dims = std::vector<int64_t>;  // negative dims count from the end; {} means all dims

Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), like torch.var.
Tensor var(const Tensor& x, const Dims& dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor logsumexp(const Tensor& x, const Dims& dims = {}, bool keepdim = false);

// Sums x down to `shape`, the inverse of broadcasting: dims that broadcasting added or expanded
// from 1 are summed. The backward of every broadcasting op goes through it.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace qk
