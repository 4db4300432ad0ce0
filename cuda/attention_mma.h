// The building blocks of the tensor-core attention kernels (cuda/attention_mma.cu, forward, and
// cuda/attention_mma_backward.cu): 64-row tiles of H (bf16 or f16) in shared memory, and the two
// products every kernel is made of, for one warp's 16 rows:
//
//   mma_rows_by_tile    acc (16 × 64) += A · Bᵀ, A: 16 rows × D (fragments, or rows of a tile),
//                       B: a (64, D) tile whose rows are acc's columns — S = Q Kᵀ, dP = dO Vᵀ,
//                       Sᵀ = K Qᵀ, dPᵀ = V dOᵀ. B fragments by ldmatrix without .trans (a row of
//                       the tile is a column of Bᵀ, its D values the k of the product);
//   mma_scores_by_tile  acc (16 × D) += P · B, P: 16 × 64 scores in the float accumulator layout
//                       of the first product, B: a (64, D) tile whose rows are the k of the
//                       product — O += P V, dQ += dS K, dV += Pᵀ dO, dK += dSᵀ Q. P's accumulators
//                       for two adjacent 8-column blocks are, rounded to H, exactly an A fragment
//                       (cuda/mma.h's table), so P never goes through shared memory; B by ldmatrix
//                       .trans (the product wants pairs along the tile's rows).
//
// Tiles: each row of D values is D/8 chunks of 16 bytes, chunk c of row r stored at c ^ (r % 8):
// the 8 rows one ldmatrix reads at one column then sit in 8 different bank groups, not one.
#pragma once

#include <cstdint>

#include "cuda/attention_common.h"
#include "cuda/mma.h"
#include "cuda/runtime.h"

namespace qk::cuda::tc {

constexpr int kWarps = 4, kThreads = kWarps * kWarp;
constexpr int kTileRows = 64;  // rows of every tile: 16 per warp
// The widest pair of gradients (dK and dV of 16 keys) one warp of the backward holds: 16 rows ×
// 128 floats each, 64 registers a lane apiece. At D = 256 two warps share a 16 keys' gradients
// (cuda/attention_mma_backward.cu); the forward keeps its whole 16 × D output (128 registers a
// lane at D = 256), and so does dQ.
constexpr int kMaxCols = 128;

// The element offset of 16-byte chunk `chunk` of row `row` in a (64, D) tile, swizzled.
template <int D>
__device__ __forceinline__ int chunk_at(int row, int chunk) {
    return row * D + ((chunk ^ (row & 7)) * 8);
}

// The address of chunk `chunk` of row `rows8 + lane_row` of the tile at `tile`, rows8 a multiple
// of 8. The swizzle reads only the row's low three bits, so the address is the lane's part plus
// the loop's (a constant once unrolled: the ldmatrix's immediate). Written as one chunk_at, the
// compiler recomputed the whole address for each ldmatrix (docs/cuda.md, "Counting instructions
// without a GPU").
template <int D>
__device__ __forceinline__ mma::SharedAddress chunk_address(mma::SharedAddress tile, int rows8,
                                                            int lane_row, int chunk) {
    return (tile + 2 * chunk_at<D>(lane_row, chunk)) + 2 * rows8 * D;
}

// tile: (64, D) shared = rows [0, valid) of src: (·, D) global, zeros after; asynchronous (the
// caller commits and waits). Thread t copies chunk t % (D/8) of rows t / (D/8) + n·(128 / (D/8)):
// the same chunk in every pass, so the addresses are a few adds, in 32 bits.
template <int D>
__device__ __forceinline__ void load_tile_async(uint16_t* tile, const uint16_t* src,
                                                int64_t valid) {
    constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && kTileRows % kRowsPerPass == 0,
                  "every row and chunk of the tile is one thread's in one pass");
    const int rows = valid < kTileRows ? int(valid) : kTileRows;
    const int chunk = int(threadIdx.x % kChunks), first_row = int(threadIdx.x / kChunks);
    QK_UNROLL
    for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
        const int row = first_row + pass * kRowsPerPass;
        const bool in = row < rows;
        mma::cp_async_16(tile + chunk_at<D>(row, chunk), src + (in ? row * D + chunk * 8 : 0), in);
    }
}

// tile: (64, D) shared, every value negated (the sign bit of each 16-bit value flipped: exact).
template <int D>
__device__ __forceinline__ void negate_tile(uint16_t* tile) {
    auto* words = reinterpret_cast<uint32_t*>(tile);
    for (int i = int(threadIdx.x); i < kTileRows * D / 2; i += kThreads) words[i] ^= 0x80008000u;
}

// The A fragments of rows [first_row, first_row + 16) of a tile, one per 16 columns.
template <int D>
__device__ __forceinline__ void load_row_fragments(uint32_t (&a)[D / 16][4], const uint16_t* tile,
                                                   int first_row) {
    const int lane = threadIdx.x % kWarp;
    const mma::SharedAddress at = mma::shared_address(tile);
    QK_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
        mma::ldmatrix<4>(a[kk], chunk_address<D>(at, first_row, lane % 16, 2 * kk + lane / 16));
}

// acc (16 × 64) += A (16 × D, fragments) · tileᵀ.
template <class H, int D>
__device__ __forceinline__ void mma_rows_by_tile(float (&acc)[kTileRows / 8][4],
                                                 const uint32_t (&a)[D / 16][4],
                                                 const uint16_t* tile) {
    const int lane = threadIdx.x % kWarp;
    const mma::SharedAddress at = mma::shared_address(tile);
    QK_UNROLL
    for (int e = 0; e < D / 16 * kTileRows / 16; ++e) {  // step kk, two 8-row blocks j, j + 1
        const int kk = e / (kTileRows / 16), j = 2 * (e % (kTileRows / 16));
        uint32_t b[4];
        mma::ldmatrix<4>(
            b, chunk_address<D>(at, 8 * j, 8 * (lane / 16) + lane % 8, 2 * kk + (lane / 8) % 2));
        const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
        mma::mma_m16n8k16<H>(acc[j], a[kk], b_lo, acc[j]);
        mma::mma_m16n8k16<H>(acc[j + 1], a[kk], b_hi, acc[j + 1]);
    }
}

// acc (16 × 64) += rows [first_row, first_row + 16) of a_tile · tileᵀ, A read as it goes.
template <class H, int D>
__device__ __forceinline__ void mma_rows_by_tile(float (&acc)[kTileRows / 8][4],
                                                 const uint16_t* a_tile, int first_row,
                                                 const uint16_t* tile) {
    const int lane = threadIdx.x % kWarp;
    const mma::SharedAddress a_at = mma::shared_address(a_tile), at = mma::shared_address(tile);
    QK_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        mma::ldmatrix<4>(a, chunk_address<D>(a_at, first_row, lane % 16, 2 * kk + lane / 16));
        QK_UNROLL
        for (int j = 0; j < kTileRows / 8; j += 2) {
            uint32_t b[4];
            mma::ldmatrix<4>(b, chunk_address<D>(at, 8 * j, 8 * (lane / 16) + lane % 8,
                                                 2 * kk + (lane / 8) % 2));
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma::mma_m16n8k16<H>(acc[j], a, b_lo, acc[j]);
            mma::mma_m16n8k16<H>(acc[j + 1], a, b_hi, acc[j + 1]);
        }
    }
}

// acc (16 × D) += P (16 × 64, accumulator layout, rounded to H here) · tile.
template <class H, int D>
__device__ __forceinline__ void mma_scores_by_tile(float (&acc)[D / 8][4],
                                                   const float (&p)[kTileRows / 8][4],
                                                   const uint16_t* tile) {
    const int lane = threadIdx.x % kWarp;
    const mma::SharedAddress at = mma::shared_address(tile);
    QK_UNROLL
    for (int kk = 0; kk < kTileRows / 16; ++kk) {
        const uint32_t a[4] = {mma::pack<H>(p[2 * kk][0], p[2 * kk][1]),
                               mma::pack<H>(p[2 * kk][2], p[2 * kk][3]),
                               mma::pack<H>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               mma::pack<H>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        QK_UNROLL
        for (int d = 0; d < D / 8; d += 2) {  // two 8-column blocks of the tile at a time
            uint32_t b[4];
            mma::ldmatrix<4, true>(
                b, chunk_address<D>(at, 16 * kk, 8 * ((lane / 8) % 2) + lane % 8, d + lane / 16));
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma::mma_m16n8k16<H>(acc[d], a, b_lo, acc[d]);
            mma::mma_m16n8k16<H>(acc[d + 1], a, b_hi, acc[d + 1]);
        }
    }
}

// Whether every (row, key) pair of rows [i0, i0 + 64) and keys [j0, j0 + 64) is visible: no
// ragged end, no causal diagonal, no window edge crosses the tile (else each pair is tested).
__host__ __device__ __forceinline__ bool tile_fully_visible(int64_t i0, int64_t j0,
                                                            const AttentionShape& sh) {
    return i0 + kTileRows <= sh.Tq && j0 + kTileRows <= sh.end_key(i0) &&
           j0 >= sh.first_key(i0 + kTileRows - 1);
}

// The mask of one tile, for the tested rule's pair-by-pair questions: whether query i_base + qi
// sees key j_base + kj, for offsets 0 <= qi, kj < 64, in 32-bit offsets from the tile's corner.
// Row i sees key j when i < Tq and first_key(i) <= j < end_key(i), that is j < Tk and
//     j <= i + (Tk − Tq)                  (causal)
//     j >= i + (Tk − Tq) + 1 − window     (a window)
// which within the tile are bounds on kj − qi. Asked with 64-bit rows and keys, each pair took a
// dozen compares, which the compiler computed ahead of the branch between the tile's two rules,
// on the plain tiles too.
struct TileMask {
    static constexpr int kFar = 2 * kTileRows;  // beyond any offset and any kj − qi of a tile
    int queries, keys;                          // qi < queries and kj < keys: inside Tq and Tk
    int lowest, highest;                        // lowest <= kj − qi <= highest

    static __host__ __device__ __forceinline__ TileMask everything() {
        return {kFar, kFar, -kFar, kFar};
    }
    __host__ __device__ __forceinline__ bool sees(int qi, int kj) const {
        return qi < queries && kj < keys && kj - qi >= lowest && kj - qi <= highest;
    }
};

__host__ __device__ __forceinline__ TileMask tile_mask(int64_t i_base, int64_t j_base,
                                                       const AttentionShape& sh) {
    constexpr int64_t kFar = TileMask::kFar;
    auto clamp = [](int64_t x) { return int(x < -kFar ? -kFar : x > kFar ? kFar : x); };
    const int64_t diagonal = i_base - j_base + (sh.Tk - sh.Tq);  // kj − qi of j = i + Tk − Tq
    return {clamp(sh.Tq - i_base), clamp(sh.Tk - j_base),
            sh.window > 0 ? clamp(diagonal + 1 - sh.window) : -int(kFar),
            sh.causal ? clamp(diagonal) : int(kFar)};
}

// tile_fully_visible(i0, ·, sh) for a block whose query rows [i0, i0 + 64) are fixed: the key
// tiles [first, end) that lie wholly inside every row's view, found once, so that each tile asks
// two compares (the compiler had recomputed the rows' ends at every tile).
struct FullyVisibleKeys {
    int64_t first, end;  // end <= first: none
    __host__ __device__ __forceinline__ bool has(int64_t j0) const {
        return j0 >= first && j0 + kTileRows <= end;
    }
};
__host__ __device__ __forceinline__ FullyVisibleKeys fully_visible_keys(int64_t i0,
                                                                        const AttentionShape& sh) {
    const int64_t first = sh.first_key(i0 + kTileRows - 1);
    return {first, i0 + kTileRows <= sh.Tq ? sh.end_key(i0) : first};
}

// The same for a block whose keys [j0, j0 + 64) are fixed (dK, dV): the query tiles i0 in
// [first, last] for which tile_fully_visible(i0, j0, sh) holds. Its three conditions, with
// shift = Tk − Tq: i0 + 64 <= Tq; j0 + 64 <= end_key(i0), that is j0 + 64 <= Tk and, causal,
// i0 >= j0 + 63 − shift; j0 >= first_key(i0 + 63), with a window i0 <= j0 − 64 − shift + window.
struct FullyVisibleQueries {
    int64_t first, last;  // last < first: none
    __host__ __device__ __forceinline__ bool has(int64_t i0) const {
        return i0 >= first && i0 <= last;
    }
};
__host__ __device__ __forceinline__ FullyVisibleQueries
fully_visible_queries(int64_t j0, const AttentionShape& sh) {
    const int64_t shift = sh.Tk - sh.Tq;
    if (j0 + kTileRows > sh.Tk) return {1, 0};
    const int64_t first = sh.causal ? j0 + kTileRows - 1 - shift : 0;
    const int64_t by_window = j0 - kTileRows - shift + sh.window;
    const int64_t last =
        sh.window > 0 && by_window < sh.Tq - kTileRows ? by_window : sh.Tq - kTileRows;
    return {first, last};
}

// For a kernel with > 48 KB of dynamic shared memory: raises its limit, or says the GPU is short.
template <class Kernel>
void allow_shared_memory(Kernel* kernel, size_t bytes, const char* name) {
    QK_CHECK(bytes <= max_shared_memory_per_block(),
             "{}: needs {} bytes of shared memory per block, this GPU gives at most {} (head dim "
             "256 needs an H100-class GPU; use --attention naive)",
             name, bytes, max_shared_memory_per_block());
    if (bytes > 48 * 1024)
        QK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
}

}  // namespace qk::cuda::tc
