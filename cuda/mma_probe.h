// Host entry points of cuda/mma_probe.cu: the warp-level matrix instructions of cuda/mma.h run on
// their own, for tests (every pointer is device memory).
#pragma once

#include <cstdint>

namespace qk::cuda {

// One mma.sync.m16n8k16 by one warp, lane l's registers at a[4l..4l+3], b[2l..2l+1],
// c[4l..4l+3] in, d[4l..4l+3] out; bf16 inputs (fp16 when fp16).
void mma_probe(float* d, const uint32_t* a, const uint32_t* b, const float* c, bool fp16);

// One ldmatrix of `count` (1, 2, 4) matrices of 8 × 8 16-bit values: matrices (4, 8, 8) in, lane
// l pointing at row l % 8 of matrix l / 8; lane l's registers out at r[count·l ...].
void ldmatrix_probe(uint32_t* r, const uint16_t* matrices, int count, bool trans);

// 512 words through shared memory by cp.async (128 threads, 16 bytes each), read back after a
// barrier by another thread; without `wait` (a planted bug) no thread waits for its copy first.
void cp_async_probe(uint32_t* out, const uint32_t* src, bool wait);

// c (M, N) = a (M, K) · bᵀ with b (N, K), or a · b with b (K, N) when b_rows_are_k; a and b hold
// bf16 bits (fp16 when fp16). M and N multiples of 64, K of 16.
void mma_gemm(float* c, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N, int64_t K,
              bool b_rows_are_k, bool fp16);

}  // namespace qk::cuda
