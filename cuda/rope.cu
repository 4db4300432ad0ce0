// CUDA rope: rotary position embeddings. Twin of cpu::rope_rotate in ops/rope.cpp, whose header
// derives the math; direction −1 is the backward (the rotation's transpose).
//
// Work split: one thread per pair (i, i + D/2) of a row, kThreads = 256 per block, a grid-stride
// loop over the G·P·D/2 pairs. Consecutive threads take consecutive i of a row, so the reads of
// x's two halves, of the tables and the writes of y each coalesce. No thread shares data with
// another: the same bits under every run order.
#include <cstdint>

#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "ops/rope.h"

namespace qk::cuda {

namespace {

// y, x: (G, P, D); cos, sin: (P, D/2); n_pairs = G·P·D/2.
template <class T>
__global__ void rope_rotate_kernel(T* y, const T* x, const T* cos, const T* sin, int64_t P,
                                   int64_t D, int64_t n_pairs, T sign) {
    const int64_t h = D / 2, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_pairs;
         p += step) {
        const int64_t row = p / h, i = p % h, t = row % P;
        const T c = cos[t * h + i], s = sin[t * h + i] * sign;
        const T a = x[row * D + i], b = x[row * D + i + h];
        y[row * D + i] = a * c - b * s;
        y[row * D + i + h] = b * c + a * s;
    }
}

}  // namespace

template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                 int direction) {
    const int64_t n_pairs = G * P * (D / 2);
    if (n_pairs == 0) return;
    ledger::declare_elements<T>(4 * n_pairs, 2 * n_pairs, 6 * n_pairs);
    QK_LAUNCH((rope_rotate_kernel<T>), grid_for(n_pairs), kThreads, 0, stream(), y, x, cos, sin, P,
              D, n_pairs, T(direction));
    QK_CUDA_CHECK_LAUNCH("rope_rotate_kernel");
}

template void rope_rotate<float>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                 int64_t, int);
template void rope_rotate<double>(double*, const double*, const double*, const double*, int64_t,
                                  int64_t, int64_t, int);

}  // namespace qk::cuda
