// CUDA fused attention backward on tensor cores: FlashAttention-2's backward with bf16 or fp16
// q, k, v and dO, float32 gradients. The math (p from the saved lse, D_i, ds, the cap's factor) is
// derived in ops/attention.cpp; the CUDA-core twin is cuda/attention.cu, the building blocks
// (tiles, the two products) are cuda/attention_mma.h.
//
// As on CUDA cores, two kernels, so that every gradient has one writer and a fixed order (no
// atomics), after D_i = dO_i · O_i (attention_delta_round, which also rounds dO to H):
//   dk/dv  a block per 64 keys of one key/value head, warp w owning keys 16w … 16w + 15; it walks
//          the 64-row query tiles that see them, of every query head of the group, and per tile
//          computes the transposed block: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys × 64 queries per
//          warp), then Pᵀ and dSᵀ pair by pair (each query's lse and D_i from shared memory), and
//          dV += Pᵀ dO, dK += g·dSᵀ Q (g applied once, after the sums, where one g serves every
//          tile of the block) — keys are the rows of every product, so the fragments of Pᵀ and
//          dSᵀ feed the second mma straight from the accumulators, as P does in the forward;
//   dq     a block per 64 query rows, warp w owning rows 16w … 16w + 15, walking their key tiles:
//          S = Q Kᵀ, dP = dO Vᵀ, then P and dS (the row's lse and D_i in registers), and
//          dQ' += dS K; attention_finish_dq then multiplies by g and sums ∂loss/∂g.
// Shared memory: the two tiles the block keeps (k, v or q, dO) and two stages of the two it
// streams, 64 × D each in H: 48 KB at D = 64, 96 KB at D = 128, 192 KB at D = 256 (above the
// default 48 KB: raised per kernel). At D = 256 a dK/dV warp cannot hold 16 × 256 floats of both
// gradients: two warps share each 16 keys, one per gradient (kSplitKeys below). A dQ warp holds
// its 16 × 256 (128 registers a lane, as the forward's output).
//
// Precision: dO is rounded to H (the mma's inputs), and so are P and dS before their second
// product; tests/test_cuda_attention_mma.cpp derives the bound this puts on each gradient.
#include <cstdint>

#include "core/error.h"
#include "cuda/attention_mma.h"
#include "cuda/bf16_convert.h"

namespace qk::cuda {

namespace {

// delta: (rows) out, D_i = dO_i · O_i, and dout_h: (rows, D) out, dO rounded to H, from one read
// of dO: row r = (bh, t) at (bh / heads)·batch + (bh % heads)·head + t·time. out: the forward's,
// row (bh, t) at sh.out_row(bh, t)·D.
// One warp per row, each lane taking every 32nd value, as cuda/attention.cu's delta kernel.
template <class H>
__global__ void attention_delta_round_kernel(float* delta, H* dout_h, const float* dout,
                                             RowStrides s, const float* out, int64_t rows,
                                             AttentionShape sh) {
    const int64_t row = int64_t(blockIdx.x) * tc::kWarps + threadIdx.x / kWarp;
    if (row >= rows) return;
    const int64_t bh = row / sh.Tq, t = row % sh.Tq, D = sh.D;
    const float* dout_row =
        dout + (bh / sh.heads) * s.batch + (bh % sh.heads) * s.head + t * s.time;
    const float* out_row = out + sh.out_row(bh, t) * D;
    float acc = 0;
    for (int64_t d = threadIdx.x % kWarp; d < D; d += kWarp) {
        const float g = dout_row[d];
        dout_h[row * D + d] = convert_element<H>(g);  // the mma's dO
        acc += g * out_row[d];
    }
    acc = warp_sum(acc);
    if (threadIdx.x % kWarp == 0) delta[row] = acc;
}

template <class H>
void attention_delta_round(float* delta, H* dout_h, const float* dout, RowStrides strides,
                           const float* out, const AttentionShape& sh) {
    const int64_t rows = sh.batch_heads * sh.Tq;
    ledger::declare(4.0 * (2 * rows * sh.D + rows) + 2.0 * double(rows * sh.D), 2.0 * rows * sh.D);
    QK_LAUNCH((attention_delta_round_kernel<H>), blocks_for(rows, tc::kWarps), tc::kThreads, 0,
              stream(), delta, dout_h, dout, strides, out, rows, sh);
    QK_CUDA_CHECK_LAUNCH("attention_delta_round_kernel");
}

using tc::kThreads;
constexpr int kTile = tc::kTileRows;
// The dK/dV kernel's statistics a query: lse_hi, lse_lo, lse_lo·log2 e, D_i.
constexpr int kStats = 4;

// The statistics of the 4 pairs a lane holds in one 8-column block of a warp's 16 × 64 block
// (register i: row lane / 4 + 8·(i / 2), column 2·(lane % 4) + i % 2): the query's lse split in
// two floats (as on the cpu), the low one also times log2 e, and D_i.
struct QuadStats {
    float lse_hi[4], lse_lo[4], lse_lo_log2e[4], delta[4];
};

// rule(p, ds, r, dp, stats, i) on every pair of the block, s and dp left holding p and ds. kTested:
// each pair is asked visible(row, column) first and its query's lse checked (0 for both where
// hidden, or where the row sees nothing); otherwise the rule runs unconditionally, a straight line
// of arithmetic with no branch (the tiles off the mask's edge, nearly all of them, where every row
// sees keys: its lse is finite, or NaN from non-finite inputs, which p carries).
template <bool kTested, class Stats, class Visible, class Rule>
__device__ __forceinline__ void each_pair(float (&s)[kTile / 8][4], float (&dp)[kTile / 8][4],
                                          const Stats& stats, const Visible& visible,
                                          const Rule& rule) {
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int block = 0; block < kTile / 8; ++block) {
        const QuadStats st = stats(block);
        QK_UNROLL
        for (int i = 0; i < 4; ++i) {
            float p = 0, ds = 0;
            if (!kTested || (visible(lane / 4 + 8 * (i / 2), 8 * block + 2 * (lane % 4) + i % 2) &&
                             st.lse_hi[i] != -INFINITY))
                rule(p, ds, s[block][i], dp[block][i], st, i);
            s[block][i] = p;
            dp[block][i] = ds;
        }
    }
}

// s holds the warp's dots r, dp the dots dO·v (this lane's share, accumulator layout); s leaves
// holding p, dp holding ds (0 where hidden). stats(block) gives a QuadStats; visible_of() the
// tile's visible(row, column), whether a pair is seen, made on the tested path only (the compiler
// computed a mask made outside ahead of the branch, for the plain tiles too); masked false: every
// pair of the block is visible. Without a cap or FP8 logits on such a block (the common case)
// p = exp(g·r − lse) and ds = p (dp − D_i) are all there is; else each pair goes through the full
// rule. The plain rule's exponent, (g·r − lse_hi) − lse_lo, goes to exp2 as
// (g·r − lse_hi)·log2 e − lse_lo·log2 e: two fused multiply-adds, each rounded once, where the
// subtraction and the multiply by log2 e were two roundings and two instructions.
template <class Stats, class VisibleOf>
__device__ __forceinline__ void probabilities_and_grads(float (&s)[kTile / 8][4],
                                                        float (&dp)[kTile / 8][4], bool masked,
                                                        float g, float cap, bool fp8,
                                                        const Stats& stats,
                                                        const VisibleOf& visible_of) {
    if (!masked && cap == 0 && !fp8) {
        each_pair<false>(
            s, dp, stats, [](int, int) { return true; },
            [&](float& p, float& ds, float r, float d, const QuadStats& st, int i) {
                p = exp2_ftz(fmaf(fmaf(g, r, -st.lse_hi[i]), kLog2e, -st.lse_lo_log2e[i]));
                p = p < 1.0f ? p : 1.0f;  // a p above 1 is rounding: ops/attention.cpp
                ds = p == 0.0f ? 0.0f : p * (d - st.delta[i]);
            });
    } else {
        const auto visible = visible_of();
        each_pair<true>(
            s, dp, stats, [&](int row, int col) { return !masked || visible(row, col); },
            [&](float& p, float& ds, float r, float d, const QuadStats& st, int i) {
                probability_and_grad<float, true>(p, ds, r, d, g, cap, fp8, st.lse_hi[i],
                                                  st.lse_lo[i], st.delta[i]);
            });
    }
}

// acc (16 × D) of this warp's rows first_row + (0 … 15) into dst: (·, D) global, rows < valid.
template <int D>
__device__ void store_rows(float* dst, const float (&acc)[D / 8][4], int64_t first_row,
                           int64_t valid) {
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int64_t row = first_row + lane / 4 + 8 * r;
        if (row >= valid) continue;
        QK_UNROLL
        for (int e = 0; e < D / 4; ++e) {  // 8-column block d, column h of the lane's pair
            const int d = e / 2, h = e % 2;
            dst[row * D + 8 * d + 2 * (lane % 4) + h] = acc[d][2 * r + h];
        }
    }
}

// The dK/dV kernel's warps: 4, each holding both gradients of its 16 keys, up to D = 128. A warp
// cannot hold 2 × 16 × 256 floats: at D = 256 the block has 8 warps, warps w and w + 4 sharing
// keys 16w … 16w + 15, warp w computing Sᵀ and dV, warp w + 4 dPᵀ and dK (its Sᵀ handed over
// through shared memory: 16 KB). Each product is computed once, where two column slices, each
// recomputing Sᵀ and dPᵀ, made 1.5× the tensor work.
template <int D>
constexpr bool kSplitKeys = D > tc::kMaxCols;
template <int D>
constexpr int kDkdvThreads = kSplitKeys<D> ? 2 * kThreads : kThreads;

// At D = 64, three blocks per SM (168 registers, a few spilled) rather than two: the backward is
// bound by the latency of its dependent chains, not by the tensor cores, and more warps hide it
// (measured on an H200: dK/dV 7.1 -> 5.7 ms and dQ 7.5 -> 5.9 ms in the 124M-shaped step).
template <class H, int D>
__global__ void __launch_bounds__(kDkdvThreads<D>, D == 64 ? 3 : 1)
    attention_dkdv_mma_kernel(float* dk, float* dv, const uint16_t* dout, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, const double* lse,
                              const float* delta, const float* scale, int64_t scale_stride,
                              float cap, AttentionShape sh) {
    constexpr bool kSplit = kSplitKeys<D>;
    QK_DYNAMIC_SHARED(double, smem);
    uint16_t* k_s = reinterpret_cast<uint16_t*>(smem);  // (64, D) swizzled: this block's keys
    uint16_t* v_s = k_s + kTile * D;                    // (64, D): their values
    // Two stages, each a query tile, its dO and its rows' lse (hi, lo) and D_i: one is read while
    // the next is copied in.
    uint16_t* stages = v_s + kTile * D;
    auto q_s = [&](int st) { return stages + st * 2 * kTile * D; };     // (64, D)
    auto do_s = [&](int st) { return q_s(st) + kTile * D; };            // (64, D)
    float* stats_s = reinterpret_cast<float*>(stages + 4 * kTile * D);  // (2, kStats, 64)
    float* handover_s =
        stats_s + 2 * kStats * kTile;  // kSplit: (4 warps, 32 values, 32 lanes) of Sᵀ
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int key_warp = warp % tc::kWarps;                // this warp's keys: 16 of the 64
    const bool takes_dv = !kSplit || warp < tc::kWarps;    // split: else this warp takes dK
    const bool loads = !kSplit || threadIdx.x < kThreads;  // the tile loaders' 128 threads
    const int64_t kvh = blockIdx.y, j0 = int64_t(blockIdx.x) * kTile;
    const int64_t cols = sh.Tk - j0 < kTile ? sh.Tk - j0 : kTile;
    if (loads) {
        tc::load_tile_async<D>(k_s, k + (kvh * sh.Tk + j0) * D, cols);
        tc::load_tile_async<D>(v_s, v + (kvh * sh.Tk + j0) * D, cols);
    }
    const auto [first_row, end_row, first_bh, group] = key_tile_readers(kvh, j0, cols, sh);
    // The (head, query tile) pairs in order: tile n is head first_bh + n / per_head.
    const int64_t per_head = end_row > first_row ? (end_row - first_row + kTile - 1) / kTile : 0;
    const int64_t tiles = per_head * group;
    // One g for every tile of the block (a scale number, or one query head per key head): dK is
    // multiplied by it once, at the end, where each tile's g·dSᵀ cost a multiply per pair.
    const bool gain_per_tile = scale_stride != 0 && group > 1;
    const tc::FullyVisibleQueries full_queries = tc::fully_visible_queries(j0, sh);
    const float block_gain = scale[(first_bh % sh.heads) * scale_stride];
    // Tile n's (head, first row), walked: the next tile is the next 64 rows, or the first rows of
    // the next head.
    struct TilePlace {
        int64_t bh, i0;
    };
    auto after = [&](TilePlace at) {
        return at.i0 + kTile < end_row ? TilePlace{at.bh, at.i0 + kTile}
                                       : TilePlace{at.bh + 1, first_row};
    };
    auto load_tile = [&](int st, TilePlace place) {  // q, dO (asynchronous) and a tile's stats
        const int64_t bh = place.bh, i0 = place.i0;
        const int64_t rows = sh.Tq - i0 < kTile ? sh.Tq - i0 : kTile;
        if (loads) {
            tc::load_tile_async<D>(q_s(st), q + (bh * sh.Tq + i0) * D, rows);
            tc::load_tile_async<D>(do_s(st), dout + (bh * sh.Tq + i0) * D, rows);
        }
        mma::cp_async_commit();
        if (threadIdx.x >= kTile) return;
        float* stats = stats_s + st * kStats * kTile;
        const bool in = threadIdx.x < rows;
        const int64_t at = bh * sh.Tq + i0 + threadIdx.x;
        const double row_lse = in ? lse[at] : -INFINITY;
        const float lse_lo = in ? float(row_lse - double(float(row_lse))) : 0.0f;
        stats[threadIdx.x] = float(row_lse);
        stats[kTile + threadIdx.x] = lse_lo;
        stats[2 * kTile + threadIdx.x] = lse_lo * kLog2e;
        stats[3 * kTile + threadIdx.x] = in ? delta[at] : 0.0f;
    };
    if (tiles > 0)
        load_tile(0, {first_bh, first_row});  // one group with the keys and values
    else
        mma::cp_async_commit();
    // This warp's gradients of its 16 keys: dV in `first`, dK in `second`; split, the one it takes
    // in `first`.
    float first[D / 8][4] = {}, second[kSplit ? 1 : D / 8][4] = {};
    TilePlace here{first_bh, first_row};
    for (int64_t n = 0; n < tiles; ++n, here = after(here)) {
        const int st = int(n % 2);
        if (n + 1 < tiles) {
            load_tile(st ^ 1, after(here));
            mma::cp_async_wait<1>();  // this tile's group is in, the next one may not be
        } else {
            mma::cp_async_wait<0>();
        }
        __syncthreads();
        const int64_t bh = here.bh, i0 = here.i0;
        const float g = gain_per_tile ? scale[(bh % sh.heads) * scale_stride] : block_gain;
        const float* stats = stats_s + st * kStats * kTile;  // lse_hi, lse_lo, ·log2 e, D_i
        // s: Sᵀ in, Pᵀ out; dp: dPᵀ in, dSᵀ out.
        auto rule = [&](float(&s)[kTile / 8][4], float(&dp)[kTile / 8][4]) {
            probabilities_and_grads(
                s, dp, !full_queries.has(i0), g, cap, sh.fp8_logits,
                [&](int block) {  // the queries are the columns: two adjacent ones per lane
                    const int c = 8 * block + 2 * (lane % 4);
                    const float2 hi = *reinterpret_cast<const float2*>(stats + c),
                                 lo = *reinterpret_cast<const float2*>(stats + kTile + c),
                                 l2 = *reinterpret_cast<const float2*>(stats + 2 * kTile + c),
                                 dd = *reinterpret_cast<const float2*>(stats + 3 * kTile + c);
                    return QuadStats{{hi.x, hi.y, hi.x, hi.y},
                                     {lo.x, lo.y, lo.x, lo.y},
                                     {l2.x, l2.y, l2.x, l2.y},
                                     {dd.x, dd.y, dd.x, dd.y}};
                },
                [&] {  // the keys are the rows, this warp's 16 of the block's 64
                    const tc::TileMask mask = tc::tile_mask(i0, j0, sh);
                    const int first_key = 16 * key_warp;
                    return [mask, first_key](int r, int c) { return mask.sees(c, first_key + r); };
                });
            if (gain_per_tile) {
                QK_UNROLL
                for (int e = 0; e < kTile / 2; ++e) dp[e / 4][e % 4] *= g;  // g·dsᵀ
            }
        };
        float st_acc[kTile / 8][4] = {}, dpt[kTile / 8][4] = {};
        if constexpr (!kSplit) {
            tc::mma_rows_by_tile<H, D>(st_acc, k_s, 16 * key_warp, q_s(st));  // Sᵀ = K Qᵀ
            tc::mma_rows_by_tile<H, D>(dpt, v_s, 16 * key_warp, do_s(st));    // dPᵀ = V dOᵀ
            rule(st_acc, dpt);
            tc::mma_scores_by_tile<H, D>(first, st_acc, do_s(st));  // dV += Pᵀ dO
            tc::mma_scores_by_tile<H, D>(second, dpt, q_s(st));     // dK += (g) dSᵀ Q
        } else {
            // The dV warp leaves Sᵀ in shared memory, where both warps of the keys read it after
            // the barrier: across it each keeps 32 values a lane, not Sᵀ and dPᵀ both.
            float* handover = handover_s + key_warp * kTile / 2 * kWarp + lane;
            if (takes_dv) {
                tc::mma_rows_by_tile<H, D>(st_acc, k_s, 16 * key_warp, q_s(st));  // Sᵀ = K Qᵀ
                QK_UNROLL
                for (int e = 0; e < kTile / 2; ++e) handover[e * kWarp] = st_acc[e / 4][e % 4];
            } else {
                tc::mma_rows_by_tile<H, D>(dpt, v_s, 16 * key_warp, do_s(st));  // dPᵀ = V dOᵀ
            }
            __syncthreads();
            QK_UNROLL
            for (int e = 0; e < kTile / 2; ++e) st_acc[e / 4][e % 4] = handover[e * kWarp];
            if (takes_dv) {
                float unused[kTile / 8][4] = {};
                rule(st_acc, unused);
                tc::mma_scores_by_tile<H, D>(first, st_acc, do_s(st));  // dV += Pᵀ dO
            } else {
                rule(st_acc, dpt);
                tc::mma_scores_by_tile<H, D>(first, dpt, q_s(st));  // dK += (g) dSᵀ Q
            }
        }
        __syncthreads();  // every warp is done with this stage (and the handover) before reuse
    }
    mma::cp_async_wait<0>();  // a block no query sees still issued its key tile
    const int64_t key_rows = (kvh * sh.Tk + j0) * D;
    auto times_block_gain = [&](float(&dk_sum)[D / 8][4]) {  // dK = g·Σ dSᵀ Q
        QK_UNROLL
        for (int e = 0; e < D / 2; ++e) dk_sum[e / 4][e % 4] *= block_gain;
    };
    if constexpr (kSplit) {
        if (!gain_per_tile && !takes_dv) times_block_gain(first);
        store_rows<D>((takes_dv ? dv : dk) + key_rows, first, 16 * key_warp, cols);
    } else {
        if (!gain_per_tile) times_block_gain(second);
        store_rows<D>(dv + key_rows, first, 16 * key_warp, cols);
        store_rows<D>(dk + key_rows, second, 16 * key_warp, cols);
    }
}

// dq_unscaled: (BH, Tq, D) out, Σ_j ds_ij k_j, times g when times_gain (no gradient for g is
// wanted); otherwise the factor comes in attention_finish_dq, with g's gradient.
template <class H, int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 1)
    attention_dq_mma_kernel(float* dq_unscaled, const uint16_t* dout, const uint16_t* q,
                            const uint16_t* k, const uint16_t* v, const double* lse,
                            const float* delta, const float* scale, int64_t scale_stride, float cap,
                            AttentionShape sh, bool times_gain) {
    QK_DYNAMIC_SHARED(double, smem);
    uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);  // (64, D) swizzled: this block's rows
    uint16_t* do_s = q_s + kTile * D;                   // (64, D): their dO
    uint16_t* kv_s = do_s + kTile * D;  // two stages of a key tile and its values, (64, D) each
    auto k_s = [&](int st) { return kv_s + st * 2 * kTile * D; };
    auto v_s = [&](int st) { return k_s(st) + kTile * D; };
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t bh = blockIdx.y, i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTile;  // long first
    const int64_t rows = sh.Tq - i0 < kTile ? sh.Tq - i0 : kTile;
    const float g = scale[(bh % sh.heads) * scale_stride];
    const int64_t kv_first = sh.kv_head(bh) * sh.Tk;
    const int64_t key_begin = sh.first_key(i0) / kTile * kTile, key_end = sh.end_key(i0 + rows - 1);
    tc::load_tile_async<D>(q_s, q + (bh * sh.Tq + i0) * D, rows);
    tc::load_tile_async<D>(do_s, dout + (bh * sh.Tq + i0) * D, rows);
    auto load_keys = [&](int st, int64_t j0) {
        const int64_t valid = key_end - j0 < kTile ? key_end - j0 : kTile;
        tc::load_tile_async<D>(k_s(st), k + (kv_first + j0) * D, valid);
        tc::load_tile_async<D>(v_s(st), v + (kv_first + j0) * D, valid);
        mma::cp_async_commit();
    };
    if (key_begin < key_end)
        load_keys(0, key_begin);  // one group with q and dO
    else
        mma::cp_async_commit();
    float lse_hi[2], lse_lo[2], lse_lo_log2e[2], row_delta[2];  // this lane's rows g and g + 8
    QK_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + 16 * warp + lane / 4 + 8 * r;
        const double row_lse = i < sh.Tq ? lse[bh * sh.Tq + i] : -INFINITY;
        lse_hi[r] = float(row_lse);
        lse_lo[r] = i < sh.Tq ? float(row_lse - double(lse_hi[r])) : 0.0f;
        lse_lo_log2e[r] = lse_lo[r] * kLog2e;
        row_delta[r] = i < sh.Tq ? delta[bh * sh.Tq + i] : 0.0f;
    }
    float dq_acc[D / 8][4] = {};
    const tc::FullyVisibleKeys full_keys = tc::fully_visible_keys(i0, sh);
    // The block's q and dO as A fragments, read once, as the forward keeps q (at D = 256 they
    // would not fit beside the gradient: read from shared memory at each use).
    constexpr bool kRowsInRegisters = D <= 128;
    uint32_t q_frag[kRowsInRegisters ? D / 16 : 1][4], do_frag[kRowsInRegisters ? D / 16 : 1][4];
    int st = 0;
    for (int64_t j0 = key_begin; j0 < key_end; j0 += kTile, st ^= 1) {
        if (j0 + kTile < key_end) {
            load_keys(st ^ 1, j0 + kTile);
            mma::cp_async_wait<1>();  // this tile's group is in, the next one may not be
        } else {
            mma::cp_async_wait<0>();
        }
        __syncthreads();
        float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
        if constexpr (kRowsInRegisters) {
            if (j0 == key_begin) {
                tc::load_row_fragments<D>(q_frag, q_s, 16 * warp);
                tc::load_row_fragments<D>(do_frag, do_s, 16 * warp);
            }
            tc::mma_rows_by_tile<H, D>(s, q_frag, k_s(st));    // S = Q Kᵀ
            tc::mma_rows_by_tile<H, D>(dp, do_frag, v_s(st));  // dP = dO Vᵀ
        } else {
            tc::mma_rows_by_tile<H, D>(s, q_s, 16 * warp, k_s(st));    // S = Q Kᵀ
            tc::mma_rows_by_tile<H, D>(dp, do_s, 16 * warp, v_s(st));  // dP = dO Vᵀ
        }
        probabilities_and_grads(
            s, dp, !full_keys.has(j0), g, cap, sh.fp8_logits,
            [&](int) {  // the rows are this lane's two
                return QuadStats{
                    {lse_hi[0], lse_hi[0], lse_hi[1], lse_hi[1]},
                    {lse_lo[0], lse_lo[0], lse_lo[1], lse_lo[1]},
                    {lse_lo_log2e[0], lse_lo_log2e[0], lse_lo_log2e[1], lse_lo_log2e[1]},
                    {row_delta[0], row_delta[0], row_delta[1], row_delta[1]}};
            },
            [&] {
                const tc::TileMask mask = tc::tile_mask(i0 + 16 * warp, j0, sh);
                return [mask](int r, int c) { return mask.sees(r, c); };
            });
        tc::mma_scores_by_tile<H, D>(dq_acc, dp, k_s(st));  // dQ' += dS K
        __syncthreads();  // every warp is done with this stage before it is filled again
    }
    mma::cp_async_wait<0>();
    if (times_gain)  // dQ = g·dQ', the product attention_finish_dq would make
        for (auto& cell : dq_acc)
            for (float& value : cell) value *= g;
    store_rows<D>(dq_unscaled + (bh * sh.Tq + i0) * D, dq_acc, 16 * warp, rows);
}

template <class H, int D>
void launch_backward(float* dq, float* dk, float* dv, const float* delta, const H* dout, const H* q,
                     const H* k, const H* v, const double* lse, const float* scale,
                     int64_t scale_stride, float cap, const AttentionShape& sh, bool times_gain) {
    const auto* q16 = reinterpret_cast<const uint16_t*>(q);
    const auto* k16 = reinterpret_cast<const uint16_t*>(k);
    const auto* v16 = reinterpret_cast<const uint16_t*>(v);
    const auto* do16 = reinterpret_cast<const uint16_t*>(dout);
    const size_t tiles = 6 * size_t(kTile) * D * sizeof(H);  // 2 kept + 2 stages of 2
    const double pairs = attention_pairs(sh), h = sizeof(H);
    if (sh.Tk > 0) {
        const dim3 grid(static_cast<unsigned>((sh.Tk + kTile - 1) / kTile),
                        static_cast<unsigned>(sh.batch_heads / sh.heads * sh.kv_heads));
        const size_t handover = kSplitKeys<D> ? size_t(kTile) / 2 * kThreads * sizeof(float) : 0;
        const size_t smem = tiles + 2 * kStats * kTile * sizeof(float) + handover;
        tc::allow_shared_memory(attention_dkdv_mma_kernel<H, D>, smem,
                                "attention backward (dK, dV)");
        // Per key tile: q and dO of every query tile that sees it; k, v once, dk, dv out.
        const double kv_elems = double(grid.y) * double(sh.Tk) * D;
        // ~14 FLOPs a pair on CUDA cores; split, the dV warp computes p again (~5 more).
        ledger::declare(2 * tiles_bytes(sh, sizeof(H), kTile, sh.Tk) + kv_elems * (2 * h + 8),
                        (kSplitKeys<D> ? 19 : 14) * pairs, 8.0 * double(D) * pairs);
        QK_LAUNCH((attention_dkdv_mma_kernel<H, D>), grid, kDkdvThreads<D>, smem, stream(), dk, dv,
                  do16, q16, k16, v16, lse, delta, scale, scale_stride, cap, sh);
        QK_CUDA_CHECK_LAUNCH("attention_dkdv_mma_kernel");
    }
    if (sh.Tq > 0) {
        const dim3 grid(static_cast<unsigned>((sh.Tq + kTile - 1) / kTile),
                        static_cast<unsigned>(sh.batch_heads));
        tc::allow_shared_memory(attention_dq_mma_kernel<H, D>, tiles, "attention backward (dQ)");
        // Per query tile: k and v of every key tile it sees; q, dO once, dq out.
        const double q_elems = double(sh.batch_heads * sh.Tq) * D;
        ledger::declare(2 * tiles_bytes(sh, sizeof(H), kTile, sh.Tq) + q_elems * (2 * h + 4),
                        12 * pairs, 6.0 * double(D) * pairs);
        QK_LAUNCH((attention_dq_mma_kernel<H, D>), grid, kThreads, tiles, stream(), dq, do16, q16,
                  k16, v16, lse, delta, scale, scale_stride, cap, sh, times_gain);
        QK_CUDA_CHECK_LAUNCH("attention_dq_mma_kernel");
    }
}

}  // namespace

template <class H>
void attention_backward_mma(float* dq, float* dk, float* dv, float* dscale, float* delta,
                            const float* dout, RowStrides dout_strides, H* dout_h, const H* q,
                            const H* k, const H* v, const float* out, const double* lse,
                            const float* scale, int64_t scale_stride, float cap,
                            const AttentionShape& sh) {
    QK_CHECK(attention_mma_supports(sh.D),
             "attention on tensor cores: head dim D must be 64, 128 or 256, got {}", sh.D);
    if (sh.batch_heads == 0 || sh.Tq == 0) return;
    attention_delta_round(delta, dout_h, dout, dout_strides, out, sh);
    const auto launch = sh.D == 64    ? launch_backward<H, 64>
                        : sh.D == 128 ? launch_backward<H, 128>
                                      : launch_backward<H, 256>;
    // Without a gradient for g, the dq kernel multiplies by g itself: one launch fewer.
    const bool times_gain = dscale == nullptr;
    launch(dq, dk, dv, delta, dout_h, q, k, v, lse, scale, scale_stride, cap, sh, times_gain);
    if (!times_gain) attention_finish_dq(dq, dscale, q, scale, scale_stride, sh);
}

template void attention_backward_mma<bf16>(float*, float*, float*, float*, float*, const float*,
                                           RowStrides, bf16*, const bf16*, const bf16*, const bf16*,
                                           const float*, const double*, const float*, int64_t,
                                           float, const AttentionShape&);
template void attention_backward_mma<f16>(float*, float*, float*, float*, float*, const float*,
                                          RowStrides, f16*, const f16*, const f16*, const f16*,
                                          const float*, const double*, const float*, int64_t, float,
                                          const AttentionShape&);

}  // namespace qk::cuda
