// Launchers of tests/tour/softplus.cu (device pointers, contiguous), float and double.
#pragma once

#include <cstdint>

namespace tour::cuda {
// y, x: (n).    y = softplus(x)
template <class T>
void softplus_forward(T* y, const T* x, int64_t n);
// dx, dy, x: (n).    dx = dy · σ(x)
template <class T>
void softplus_backward(T* dx, const T* dy, const T* x, int64_t n);
}  // namespace tour::cuda
