// Reductions over given dims, with keepdim.
#pragma once

#include <vector>

#include "core/tensor.h"

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

// Launchers of cuda/reduce.cu (device pointers). x: `shape`, read through x_strides; `kept` is
// the keepdim shape (size 1 on reduced dims); outputs and per-group tensors are contiguous in
// that layout, gradients dx contiguous in x's shape. r below is the group of element i.
namespace cuda {
template <class T>  // out[r] = Σ x[i]
void sum_reduce(T* out, const T* x, const Shape& x_strides, const Shape& shape, const Shape& kept);
template <class T>  // out[r] = max x[i]  (NaN propagates)
void max_reduce(T* out, const T* x, const Shape& x_strides, const Shape& shape, const Shape& kept);
template <class T>  // lse[r] = m + log Σ exp(x[i] − m), m the group max (0 if not finite)
void logsumexp_reduce(T* lse, const T* x, const Shape& x_strides, const Shape& shape,
                      const Shape& kept);
template <class T>  // dx[i] = [x[i] == y[r]] · dy[r] / (number of ties in r)
void max_backward(T* dx, const T* x, const Shape& x_strides, const T* y, const T* dy,
                  const Shape& shape, const Shape& kept);
template <class T>  // dx[i] = dy[r] · exp(x[i] − lse[r])  (0 where lse = −inf)
void logsumexp_backward(T* dx, const T* x, const Shape& x_strides, const T* lse, const T* dy,
                        const Shape& shape, const Shape& kept);
// The kernel ladder's switch, for tests: 1 = one thread per output, 2 = one block per output,
// 3 = column tiles in row chunks, 4 = groups split into chunks (3 and 4: sum and max), 0 = choose
// by layout and size (the default).
void set_reduce_version(int version);
}  // namespace cuda

}  // namespace qk
