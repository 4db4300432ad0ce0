// CUDA fp8_quantize: twin of cpu::fp8_quantize in ops/fp8.cpp (the scaling recipe: ops/fp8.h).
//
// Work split: a grid-stride loop, kThreads = 256 per block, one element per thread per turn; each
// block reduces its amax, its NaN count and its saturation count (fixed trees, cuda/warp_reduce.h)
// into one slot of a per-block array, and the host combines the blocks in block order. The
// rounding is minifloat's FastRounder, the same code as on the host: q is bit-identical to the
// cpu's.
#include <cstdint>
#include <vector>

#include "core/minifloat.h"
#include "core/storage.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "cuda/warp_reduce.h"
#include "ops/fp8.h"

namespace qk::cuda {

namespace {

// q, x: (n); per block b: amax[b], nans[b], saturated[b].
__global__ void fp8_quantize_kernel(float* q, const float* x, int64_t n, float scale,
                                    FastRounder round, float limit, float* block_amax,
                                    double* block_nans, double* block_saturated) {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    float m = 0;
    double nans = 0, saturated = 0;  // counts: exact in double far beyond any tensor's size
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += step) {
        const float a = x[i] < 0 ? -x[i] : x[i];
        if (a != a)
            nans += 1;
        else
            m = a > m ? a : m;
        const float r = round(x[i] * scale);
        q[i] = r;
        saturated += (r < 0 ? -r : r) >= limit ? 1 : 0;  // the largest finite value, or Inf
    }
    m = block_max(m);
    nans = block_sum(nans);
    saturated = block_sum(saturated);
    if (threadIdx.x == 0) {
        block_amax[blockIdx.x] = m;
        block_nans[blockIdx.x] = nans;
        block_saturated[blockIdx.x] = saturated;
    }
}

}  // namespace

void fp8_quantize(float* q, const float* x, int64_t n, float scale, MiniFormat format,
                  Overflow overflow, float* amax, int64_t* saturated) {
    *amax = 0;
    *saturated = 0;
    if (n == 0) return;
    const unsigned blocks = grid_for(n);
    // Scratch from the caching allocator: one float and two doubles per block.
    Storage scratch(blocks * (sizeof(float) + 2 * sizeof(double)), Device::cuda);
    double* block_nans = static_cast<double*>(scratch.data());
    double* block_saturated = block_nans + blocks;
    float* block_amax = reinterpret_cast<float*>(block_saturated + blocks);
    ledger::declare_elements<float>(n, n, 8 * n);
    QK_LAUNCH(fp8_quantize_kernel, blocks, kThreads, 0, stream(), q, x, n, scale,
              FastRounder(format, overflow), static_cast<float>(max_finite(format)), block_amax,
              block_nans, block_saturated);
    QK_CUDA_CHECK_LAUNCH("fp8_quantize_kernel");
    std::vector<float> host_amax(blocks);
    std::vector<double> host_counts(2 * blocks);
    copy_to_host(host_amax.data(), block_amax, blocks * sizeof(float));
    copy_to_host(host_counts.data(), block_nans, 2 * blocks * sizeof(double));
    double nans = 0, count = 0;
    for (unsigned b = 0; b < blocks; ++b) {
        *amax = host_amax[b] > *amax ? host_amax[b] : *amax;
        nans += host_counts[b];
        count += host_counts[blocks + b];
    }
    if (nans > 0) *amax = NAN;
    *saturated = static_cast<int64_t>(count);
}

}  // namespace qk::cuda
