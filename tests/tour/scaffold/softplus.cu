// tour/softplus.cu — the CUDA twin of the tour's softplus (softplus.cpp): stop 11's exercise,
// the kernels' bodies yours to write (the launchers are given). Built like the library's
// cuda/<family>.cu: by nvcc in the real-CUDA build, by g++ against cuda/emu in the emulation one.
//
// Work split: one thread per element, 256 threads per block, a grid-stride loop so that any n
// fits in the grid. Consecutive threads read consecutive elements: a warp's loads coalesce.
// CPU twin: tour::cpu::softplus_forward / softplus_backward in softplus.cpp.
#include <algorithm>

#include "cuda/runtime.h"
#include "softplus_cuda.h"
#include "softplus_math.h"

namespace tour::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

unsigned grid_for(int64_t n) { return std::min(qk::cuda::blocks_for(n, kThreads), kMaxBlocks); }

// y, x: (n).    y[i] = softplus(x[i])
template <class T>
__global__ void softplus_forward_kernel(T* y, const T* x, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] = x[i] * T(0);  // stop 11: yours to write
}

// dx, dy, x: (n).    dx[i] = dy[i] · σ(x[i])
template <class T>
__global__ void softplus_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dx[i] = dy[i] * T(0) * x[i];  // stop 11: yours to write
}

}  // namespace

template <class T>
void softplus_forward(T* y, const T* x, int64_t n) {
    if (n == 0) return;
    QK_LAUNCH(softplus_forward_kernel<T>, grid_for(n), kThreads, 0, qk::cuda::stream(), y, x, n);
    QK_CUDA_CHECK_LAUNCH("softplus_forward_kernel");
}

template <class T>
void softplus_backward(T* dx, const T* dy, const T* x, int64_t n) {
    if (n == 0) return;
    QK_LAUNCH(softplus_backward_kernel<T>, grid_for(n), kThreads, 0, qk::cuda::stream(), dx, dy, x,
              n);
    QK_CUDA_CHECK_LAUNCH("softplus_backward_kernel");
}

template void softplus_forward<float>(float*, const float*, int64_t);
template void softplus_forward<double>(double*, const double*, int64_t);
template void softplus_backward<float>(float*, const float*, const float*, int64_t);
template void softplus_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace tour::cuda
