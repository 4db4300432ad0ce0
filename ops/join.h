// Joining and splitting along a dim.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace qk {

// Joins along an existing dim into a fresh tensor. All tensors need tensor 0's dtype, device,
// rank, and sizes except along dim.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Joins equal-shaped tensors along a new dim: cat of x.unsqueeze(dim).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Pieces of `size` along dim (the last one may be shorter); views of x. A dim of size 0 gives
// one empty piece, like torch.split.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
// Pieces of ceil(len / n) along dim, like torch.chunk: the last may be shorter, and there may be
// fewer than n (a length of 5 in 4 chunks gives 2, 2, 1). Views of x.
std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim = 0);

}  // namespace qk
