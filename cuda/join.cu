// CUDA cat: copies one contiguous input into its band of columns of the output.
// Twin of ops/join.cpp (cpu::cat_copy), whose header gives the decomposition: with cat along dim
// d, a contiguous x_i of shape (A..., len_i, B...) is a matrix (outer, len_i * inner), outer =
// prod(A), inner = prod(B), and y is (outer, total * inner); row o of x_i goes to columns
// [off_i * inner, (off_i + len_i) * inner) of y's row o. The op calls this once per input.
//
// The backward of cat, and split / chunk forward and backward, need no kernel of their own: the
// gradient of x_i is the view dy.narrow(d, off_i, len_i), split / chunk pieces are narrow views,
// and narrow's backward (ops/view.cpp) and contiguous() run on the strided-copy kernels of
// cuda/copy.cu.
//
// Work split: one thread per element of x_i, flat index i = o * x_row + j, kThreads = 256 threads
// per block, grid = ceil(outer * x_row / 256) blocks. Consecutive threads read consecutive x
// elements and write consecutive y elements within a row (coalesced on both sides; a warp may
// straddle two rows when x_row is short). No thread talks to another: no barriers, and the same
// bits under every run order.
#include <cstdint>

#include "cuda/runtime.h"
#include "ops/join.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 256;

// y: (outer, y_row), written in columns [col, col + x_row); x: (outer, x_row).
template <class T>
__global__ void cat_copy_kernel(T* y, int64_t y_row, const T* x, int64_t x_row, int64_t col,
                                int64_t outer) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= outer * x_row) return;
    const int64_t o = i / x_row, j = i - o * x_row;
    y[o * y_row + col + j] = x[i];
}

}  // namespace

template <class T>
void cat_copy(T* y, int64_t y_row, const T* x, int64_t x_row, int64_t col, int64_t outer) {
    if (outer * x_row == 0) return;
    ledger::declare_elements<T>(outer * x_row, outer * x_row);
    QK_LAUNCH((cat_copy_kernel<T>), blocks_for(outer * x_row, kThreads), kThreads, 0, stream(), y,
              y_row, x, x_row, col, outer);
    QK_CUDA_CHECK_LAUNCH("cat_copy_kernel");
}

template void cat_copy<float>(float*, int64_t, const float*, int64_t, int64_t, int64_t);
template void cat_copy<double>(double*, int64_t, const double*, int64_t, int64_t, int64_t);
template void cat_copy<int32_t>(int32_t*, int64_t, const int32_t*, int64_t, int64_t, int64_t);
template void cat_copy<bf16>(bf16*, int64_t, const bf16*, int64_t, int64_t, int64_t);
template void cat_copy<f16>(f16*, int64_t, const f16*, int64_t, int64_t, int64_t);

}  // namespace qk::cuda
