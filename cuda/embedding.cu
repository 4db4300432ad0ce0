// CUDA embedding: the gather forward and the scatter-add backward.
// Twin of ops/embedding.cpp (cpu::embedding_forward / cpu::embedding_backward), whose header
// derives the math: y[n, :] = weight[ids[n], :] and dweight[v, :] = Σ_{n : ids[n] = v} dy[n, :].
// Every array is contiguous; ids are int32 and already checked to lie in [0, V) by the op (on the
// host: a kernel cannot throw, and a bad id would read or write outside the table).
//
// Work split: one thread per element of y (or dy), flat index i = n * C + c, kThreads = 256
// threads per block, grid = ceil(N * C / 256) blocks. Consecutive threads take consecutive c of
// one row, so a warp reads 32 neighbours of one weight row and writes 32 neighbours of one y row
// (coalesced); rows shorter than a warp simply let a warp span two rows.
//
// Backward: the cpu splits dweight by columns so that no element has two writers. On the GPU the
// natural split is by positions (one thread per dy element, fully parallel), and two positions
// with the same id then add into the same dweight element: the adds are atomicAdd. Float atomics
// make the *order* of the additions, hence the last bits of a sum over a repeated id, depend on
// the scheduling (from run to run on a GPU, from run order to run order in the emulator). Ids
// that occur once get exactly one add onto 0 and are bit-exact. The tests compare with a
// tolerance and check the distinct-ids case bitwise. A deterministic variant (sort positions by
// id, then one thread per (id, column) walks its positions in order) would cost a sort per step;
// the embedding gradient feeds AdamW, which does not need bitwise reproducibility.
#include <cstdint>

#include "cuda/runtime.h"
#include "ops/embedding.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 256;

// y: (N, C) out; weight: (V, C); ids: (N), each in [0, V).
template <class T>
__global__ void embedding_forward_kernel(T* y, const T* weight, const int32_t* ids, int64_t N,
                                         int64_t C) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N * C) return;
    const int64_t n = i / C, c = i - n * C;
    y[i] = weight[int64_t(ids[n]) * C + c];
}

// dweight: (V, C), zeroed by the caller, accumulated into; dy: (N, C); ids: (N).
//   dweight[ids[n], c] += dy[n, c]
template <class T>
__global__ void embedding_backward_kernel(T* dweight, const T* dy, const int32_t* ids, int64_t N,
                                          int64_t C) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N * C) return;
    const int64_t n = i / C, c = i - n * C;
    atomicAdd(dweight + int64_t(ids[n]) * C + c, dy[i]);  // repeated ids: order not fixed
}

}  // namespace

template <class T>
void embedding_forward(T* y, const T* weight, const int32_t* ids, int64_t N, int64_t C) {
    if (N * C == 0) return;
    ledger::declare_elements<T>(N * C, N * C);
    QK_LAUNCH((embedding_forward_kernel<T>), blocks_for(N * C, kThreads), kThreads, 0, stream(), y,
              weight, ids, N, C);
    QK_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
}

template <class T>
void embedding_backward(T* dweight, const T* dy, const int32_t* ids, int64_t N, int64_t C) {
    if (N * C == 0) return;
    ledger::declare_elements<T>(2 * N * C, N * C, N * C);
    QK_LAUNCH((embedding_backward_kernel<T>), blocks_for(N * C, kThreads), kThreads, 0, stream(),
              dweight, dy, ids, N, C);
    QK_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
}

template void embedding_forward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_forward<double>(double*, const double*, const int32_t*, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t);

}  // namespace qk::cuda
