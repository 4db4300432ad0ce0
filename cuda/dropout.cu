// CUDA dropout: applies a keep mask that was drawn on the cpu.
// Twin of ops/dropout.cpp (cpu::apply_mask), whose header gives the math: out[i] = keep[i] ?
// in[i] * s : 0 with s = 1 / (1 − p), used for the forward (in = x) and the backward (in = dy).
//
// The mask is *not* drawn here: the same seed must give the same tensors on both devices
// (docs/architecture.md#tensors), so the op draws keep[] with Generator::fill on the cpu exactly as
// for a cpu tensor, copies the bytes to the device once, and both passes read that copy. A
// device-side Philox would save the one-byte-per-element copy but would have to reproduce the cpu's
// word order bit for bit.
//
// Work split: one thread per element, kThreads = 256 per block, grid = ceil(n / 256) blocks;
// consecutive threads touch consecutive bytes of keep and elements of in/out (coalesced), no
// communication between threads, the same bits under every run order.
#include <cstdint>

#include "cuda/runtime.h"
#include "ops/dropout.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 256;

// out: (n) out; in: (n); keep: (n), 1 = kept.
template <class T>
__global__ void apply_mask_kernel(T* out, const T* in, const uint8_t* keep, int64_t n, T s) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = keep[i] ? in[i] * s : T(0);
}

}  // namespace

template <class T>
void apply_mask(T* out, const T* in, const uint8_t* keep, int64_t n, T s) {
    if (n == 0) return;
    ledger::declare(double(n) * (2 * sizeof(T) + 1), double(n), 0, sizeof(T) == 8);
    QK_LAUNCH((apply_mask_kernel<T>), blocks_for(n, kThreads), kThreads, 0, stream(), out, in, keep,
              n, s);
    QK_CUDA_CHECK_LAUNCH("apply_mask_kernel");
}

template void apply_mask<float>(float*, const float*, const uint8_t*, int64_t, float);
template void apply_mask<double>(double*, const double*, const uint8_t*, int64_t, double);

}  // namespace qk::cuda
