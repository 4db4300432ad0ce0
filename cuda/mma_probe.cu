// The warp-level matrix instructions of cuda/mma.h on their own: one instruction per warp with
// every lane's registers in and out (so a test can check each fragment position against the PTX
// ISA's table, on a GPU and in the emulator alike), and a small GEMM built from them, the pattern
// the tensor-core attention kernels repeat.
//
// mma_gemm: C (M × N) = A (M × K) · Bᵀ, B given as (N × K) row-major, or A · B with B (K × N)
// row-major (b_rows_are_k). A block of 4 warps owns a 64 × 64 tile of C, warp w its rows
// 16w … 16w + 15; each step of 16 along K loads the A and B tiles into shared memory with cp.async,
// takes the warp's A fragment with one ldmatrix.x4 and each 8-column B fragment with an
// ldmatrix.x2 (.trans when B is (K, N): its rows are k, the fragment wants pairs along k), and
// does 8 mma per warp. Deliberately plain (no double buffering, no swizzle): the attention kernels
// show those.
#include "core/error.h"
#include "cuda/mma.h"
#include "cuda/mma_probe.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"

namespace qk::cuda {

namespace {

template <class H>
__global__ void mma_probe_kernel(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
    const int lane = threadIdx.x;
    uint32_t a_regs[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
    uint32_t b_regs[2] = {b[2 * lane], b[2 * lane + 1]};
    float acc[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
    mma::mma_m16n8k16<H>(acc, a_regs, b_regs, acc);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = acc[i];
}

// matrices: (4, 8, 8) 16-bit values; lane l points at row l % 8 of matrix l / 8.
template <int N, bool kTrans>
__global__ void ldmatrix_probe_kernel(uint32_t* r, const uint16_t* matrices) {
    alignas(16) __shared__ uint16_t tile[4 * 8 * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 4 * 8 * 8; i += kWarp) tile[i] = matrices[i];
    __syncwarp();
    uint32_t regs[N];
    mma::ldmatrix<N, kTrans>(regs, tile + 8 * lane);
    for (int m = 0; m < N; ++m) r[N * lane + m] = regs[m];
}

// 128 threads each copy 16 bytes of src (512 words) into shared memory, commit, wait unless told
// not to (a planted bug), meet at a barrier and read a neighbour's 16 bytes back out.
__global__ void cp_async_probe_kernel(uint32_t* out, const uint32_t* src, bool wait) {
    QK_DYNAMIC_SHARED(double, smem);  // dynamic: the emulator fills it anew for every block
    uint32_t* tile = reinterpret_cast<uint32_t*>(smem);
    const int t = threadIdx.x;
    mma::cp_async_16(tile + 4 * t, src + 4 * t, true);
    mma::cp_async_commit();
    if (wait) mma::cp_async_wait<0>();
    __syncthreads();
    const int other = (t + 37) % 128;
    for (int i = 0; i < 4; ++i) out[4 * other + i] = tile[4 * other + i];
    if (!wait) mma::cp_async_wait<0>();  // nothing in flight at exit
}

constexpr int kTile = 64, kStep = 16, kGemmThreads = 128;

template <class H>
__global__ void mma_gemm_kernel(float* c, const uint16_t* a, const uint16_t* b, int64_t N,
                                int64_t K, bool b_rows_are_k) {
    alignas(16) __shared__ uint16_t a_s[kTile * kStep];  // (64 rows, 16 k)
    alignas(16) __shared__ uint16_t b_s[kTile * kStep];  // (64 n, 16 k), or (16 k, 64 n)
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
    float acc[kTile / 8][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kStep) {
        // 128 threads, 128 chunks of 16 bytes per operand tile.
        const int row = threadIdx.x / 2, half = threadIdx.x % 2;
        mma::cp_async_16(a_s + row * kStep + 8 * half, a + (m0 + row) * K + k0 + 8 * half, true);
        if (b_rows_are_k) {
            const int k = threadIdx.x / 8, chunk = threadIdx.x % 8;
            mma::cp_async_16(b_s + k * kTile + 8 * chunk, b + (k0 + k) * N + n0 + 8 * chunk, true);
        } else {
            mma::cp_async_16(b_s + row * kStep + 8 * half, b + (n0 + row) * K + k0 + 8 * half,
                             true);
        }
        mma::cp_async_commit();
        mma::cp_async_wait<0>();
        __syncthreads();
        uint32_t a_frag[4];
        mma::ldmatrix<4>(a_frag, a_s + (16 * warp + lane % 16) * kStep + 8 * (lane / 16));
        for (int j = 0; j < kTile / 8; ++j) {
            uint32_t b_frag[2];
            // Lanes 0-7 name the 8 rows of the first matrix (k 0-7), lanes 8-15 the second.
            if (b_rows_are_k)
                mma::ldmatrix<2, true>(b_frag, b_s + (lane % 16) * kTile + 8 * j);
            else
                mma::ldmatrix<2>(b_frag, b_s + (8 * j + lane % 8) * kStep + 8 * ((lane / 8) % 2));
            mma::mma_m16n8k16<H>(acc[j], a_frag, b_frag, acc[j]);
        }
        __syncthreads();
    }
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < kTile / 8; ++j)
        for (int r = 0; r < 2; ++r) {
            const int64_t row = m0 + 16 * warp + g + 8 * r, col = n0 + 8 * j + 2 * t;
            c[row * N + col] = acc[j][2 * r];
            c[row * N + col + 1] = acc[j][2 * r + 1];
        }
}

}  // namespace

void mma_probe(float* d, const uint32_t* a, const uint32_t* b, const float* c, bool fp16) {
    if (fp16)
        QK_LAUNCH((mma_probe_kernel<f16>), 1, kWarp, 0, stream(), d, a, b, c);
    else
        QK_LAUNCH((mma_probe_kernel<bf16>), 1, kWarp, 0, stream(), d, a, b, c);
    QK_CUDA_CHECK_LAUNCH("mma_probe_kernel");
}

void ldmatrix_probe(uint32_t* r, const uint16_t* matrices, int count, bool trans) {
    QK_CHECK(count == 1 || count == 2 || count == 4, "ldmatrix_probe: count is 1, 2 or 4, got {}",
             count);
    switch (count * 2 + trans) {
        case 2:
            QK_LAUNCH((ldmatrix_probe_kernel<1, false>), 1, kWarp, 0, stream(), r, matrices);
            break;
        case 3:
            QK_LAUNCH((ldmatrix_probe_kernel<1, true>), 1, kWarp, 0, stream(), r, matrices);
            break;
        case 4:
            QK_LAUNCH((ldmatrix_probe_kernel<2, false>), 1, kWarp, 0, stream(), r, matrices);
            break;
        case 5:
            QK_LAUNCH((ldmatrix_probe_kernel<2, true>), 1, kWarp, 0, stream(), r, matrices);
            break;
        case 8:
            QK_LAUNCH((ldmatrix_probe_kernel<4, false>), 1, kWarp, 0, stream(), r, matrices);
            break;
        default:
            QK_LAUNCH((ldmatrix_probe_kernel<4, true>), 1, kWarp, 0, stream(), r, matrices);
    }
    QK_CUDA_CHECK_LAUNCH("ldmatrix_probe_kernel");
}

void cp_async_probe(uint32_t* out, const uint32_t* src, bool wait) {
    QK_LAUNCH(cp_async_probe_kernel, 1, 128, 512 * sizeof(uint32_t), stream(), out, src, wait);
    QK_CUDA_CHECK_LAUNCH("cp_async_probe_kernel");
}

void mma_gemm(float* c, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N, int64_t K,
              bool b_rows_are_k, bool fp16) {
    QK_CHECK(M % kTile == 0 && N % kTile == 0 && K % kStep == 0 && M > 0 && N > 0 && K > 0,
             "mma_gemm: M and N must be positive multiples of {} and K of {}, got M {} N {} K {}",
             kTile, kStep, M, N, K);
    const dim3 grid(static_cast<unsigned>(N / kTile), static_cast<unsigned>(M / kTile));
    ledger::declare(2.0 * double(M * K + N * K) + 4.0 * double(M * N), 0, 2.0 * double(M) * N * K);
    if (fp16)
        QK_LAUNCH((mma_gemm_kernel<f16>), grid, kGemmThreads, 0, stream(), c, a, b, N, K,
                  b_rows_are_k);
    else
        QK_LAUNCH((mma_gemm_kernel<bf16>), grid, kGemmThreads, 0, stream(), c, a, b, N, K,
                  b_rows_are_k);
    QK_CUDA_CHECK_LAUNCH("mma_gemm_kernel");
}

}  // namespace qk::cuda
