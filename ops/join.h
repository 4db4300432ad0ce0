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

// The CUDA twin of cpu::cat_copy in ops/join.cpp (cuda/join.cu): device pointers.
// y: (outer, y_row); x: (outer, x_row), contiguous. Copies x into y's columns [col, col + x_row).
// Instantiated for float, double and int32.
namespace cuda {
template <class T>
void cat_copy(T* y, int64_t y_row, const T* x, int64_t x_row, int64_t col, int64_t outer);
}  // namespace cuda

}  // namespace qk
