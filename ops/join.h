// Joining and splitting along a dim.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace qk {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Pieces of `size` along dim (the last one may be shorter); views of x.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
// n pieces as equal as possible (like torch.chunk); views of x.
std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim = 0);

}  // namespace qk
