// CUDA fused attention, FlashAttention-2's algorithm. Twin of ops/attention_cpu.cpp; the math,
// the names (r, s, z, p, D_i, ds) and the edge cases are derived in ops/attention.cpp.
//
// Work split. A block is 128 threads (4 warps) and owns one head bh (blockIdx.y) and one tile:
//   forward   kRows = 16 query rows; it walks the key tiles of kCols = 32 keys from the tile's
//             first visible key (0 but under a sliding window) up to its last (the causal mask's
//             upper triangle, and the keys left behind by a window, are never visited).
//             Shared memory: the query tile (16 × D), one key tile then its value tile (32 × D,
//             reusing one buffer), and the 16 × 32 block of logits / probabilities.
//             Step 1: the 512 dots of the block, 4 per thread. Step 2: the online softmax, warp w
//             taking rows w, w + 4, ..., one key per lane, so the row max and sums are warp
//             shuffles. Step 3: each thread updates its own (row, d) outputs, kept in registers,
//             o ← α·o + Σ_c p_c v_c.
//   backward  two kernels, so that every gradient has one writer and a fixed summation order (no
//             atomics: results are bit-identical run to run and under the emulator's run orders):
//             dk/dv: one block per key tile of 32 keys of one key/value head, walking the query
//                    tiles that see it, for every query head that reads it (one without
//                    grouped-query attention); each thread keeps its (key, d) entries of dk and dv
//                    in registers;
//             dq:    one block per query tile of 16 rows, walking its key tiles;
//             both recompute the block's dots r and dp = dO·v per (row, key) pair, and from the
//             saved lse and D_i = dO·O (a small kernel first) get p and ds directly, one pair per
//             thread, with no reduction. dq is written without the factor g, which a last kernel
//             (one block per head) applies while summing ∂loss/∂g = Σ_i q_i · (Σ_j ds_ij k_j),
//             the same Σ ds·r grouped by rows.
// The inner products over D read k and v from global memory (cached) where shared memory is
// short; D is at most 128 (float) or 64 (double), so that each block fits in 48 KB.
#include <algorithm>
#include <cstdint>

#include "core/storage.h"
#include "cuda/attention_common.h"
#include "cuda/runtime.h"

namespace qk::cuda {

namespace {

constexpr int kThreads = 128, kWarps = kThreads / kWarp;
constexpr int kRows = 16;  // query rows per tile
constexpr int kCols = 32;  // keys per tile: one per lane
constexpr int kMaxD = 128;
constexpr int kPairsPerThread = kRows * kCols / kThreads;       // 4
constexpr int kRowOutputsPerThread = kRows * kMaxD / kThreads;  // 16: (row, d) entries
constexpr int kKeyOutputsPerThread = kCols * kMaxD / kThreads;  // 32: (key, d) entries

// dst: (kTileRows, D) shared = rows [first, first + n) of src: (·, D) global; zeros past n.
template <class T>
__device__ void load_tile(T* dst, const T* src, int64_t n, int tile_rows, int64_t D) {
    for (int64_t idx = threadIdx.x; idx < tile_rows * D; idx += kThreads)
        dst[idx] = idx / D < n ? src[idx] : T(0);
}

template <class T>
__device__ __forceinline__ T dot(const T* a, const T* b, int64_t D) {
    T acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += a[d] * b[d];
    return acc;
}

// ---- forward ---------------------------------------------------------------------------------

// One online-softmax step of row r (this warp's), lane = key c of the tile: the row's running
// (m, l, w, max |s|) are the same in every lane. p_row: the raw dots in, exp(z − m_new) out.
template <class T>
__device__ void online_softmax_row(T* p_row, T* alpha_out, bool visible, T g, T cap, bool fp8, T& m,
                                   T& l, T& w, T& max_abs, T& saturated) {
    const int lane = threadIdx.x % kWarp;
    const T s = g * p_row[lane];
    const T z = logit_used(capped(s, cap), fp8);
    if (fp8) saturated += warp_sum(visible && (z < 0 ? -z : z) >= T(448) ? T(1) : T(0));
    const T tile_max = warp_max(visible ? z : T(-INFINITY));
    const T tile_abs = warp_max(visible ? (s < 0 ? -s : s) : T(0));
    const T m_new = tile_max > m ? tile_max : m;
    const T m_ref = m_new == T(-INFINITY) ? T(0) : m_new;  // nothing finite yet: e = 0, not NaN
    const T alpha = dev_exp(m - m_ref);
    const T e = visible ? dev_exp(z - m_ref) : T(0);
    l = l * alpha + warp_sum(e);
    w = w * alpha + warp_sum(e > T(0) ? e * z : T(0));
    m = m_new;
    max_abs = tile_abs > max_abs ? tile_abs : max_abs;
    p_row[lane] = e;
    if (lane == 0) *alpha_out = alpha;
}

template <class T>
__global__ void attention_forward_kernel(T* out, double* lse, T* max_abs_s, T* entropy,
                                         T* saturated, const T* q, const T* k, const T* v,
                                         const T* scale, int64_t scale_stride, T cap,
                                         AttentionShape sh) {
    QK_DYNAMIC_SHARED(double, smem);  // double: aligned for either T
    const int64_t D = sh.D, bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
    T* q_s = reinterpret_cast<T*>(smem);  // (kRows, D)
    T* kv_s = q_s + kRows * D;            // (kCols, D): the key tile, then the value tile
    T* p_s = kv_s + kCols * D;            // (kRows, kCols)
    T* alpha_s = p_s + kRows * kCols;     // (kRows)
    T* l_s = alpha_s + kRows;             // (kRows)
    const int64_t rows = sh.Tq - i0 < kRows ? sh.Tq - i0 : kRows;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const T g = scale[(bh % sh.heads) * scale_stride];
    const int64_t kv_first = sh.kv_head(bh) * sh.Tk;  // this head's first key row in k and v
    load_tile(q_s, q + (bh * sh.Tq + i0) * D, rows, kRows, D);
    T m[kRows / kWarps], l[kRows / kWarps], w[kRows / kWarps], max_abs[kRows / kWarps],
        sat[kRows / kWarps];
    for (int rr = 0; rr < kRows / kWarps; ++rr)
        m[rr] = -INFINITY, l[rr] = w[rr] = max_abs[rr] = sat[rr] = 0;
    T o[kRowOutputsPerThread] = {};
    const int64_t last_key = sh.end_key(i0 + rows - 1);
    for (int64_t j0 = sh.first_key(i0) / kCols * kCols; j0 < last_key; j0 += kCols) {
        const int64_t cols = last_key - j0 < kCols ? last_key - j0 : kCols;
        __syncthreads();  // the previous tile's readers of kv_s and p_s are done
        load_tile(kv_s, k + (kv_first + j0) * D, cols, kCols, D);
        __syncthreads();
        for (int u = 0; u < kPairsPerThread; ++u) {  // step 1: r = q · k
            const int idx = threadIdx.x + u * kThreads, r = idx / kCols, c = idx % kCols;
            p_s[idx] = dot(q_s + r * D, kv_s + c * D, D);
        }
        __syncthreads();
        for (int rr = 0; rr < kRows / kWarps; ++rr) {  // step 2: online softmax, a warp per row
            const int r = warp + rr * kWarps;
            const bool visible = r < rows && lane < cols && sees(i0 + r, j0 + lane, sh);
            online_softmax_row(p_s + r * kCols, alpha_s + r, visible, g, cap, sh.fp8_logits, m[rr],
                               l[rr], w[rr], max_abs[rr], sat[rr]);
        }
        load_tile(kv_s, v + (kv_first + j0) * D, cols, kCols, D);  // kv_s is free since step 1
        __syncthreads();
        for (int u = 0; u < kRowOutputsPerThread; ++u) {  // step 3: o ← α·o + Σ_c p_c v_c
            const int64_t idx = threadIdx.x + u * kThreads, r = idx / D, d = idx % D;
            if (idx >= kRows * D) break;
            T acc = o[u] * alpha_s[r];
            for (int c = 0; c < cols; ++c) acc += p_s[r * kCols + c] * kv_s[c * D + d];
            o[u] = acc;
        }
    }
    for (int rr = 0; rr < kRows / kWarps; ++rr) {  // the rows' statistics
        const int r = warp + rr * kWarps;
        if (lane != 0) continue;
        l_s[r] = l[rr];
        if (r >= rows) continue;
        const int64_t row = bh * sh.Tq + i0 + r;
        const bool nan_row = l[rr] != l[rr];
        const double row_lse = l[rr] > T(0) ? double(m[rr]) + log(double(l[rr]))
                                            : (nan_row ? double(l[rr]) : -INFINITY);
        lse[row] = row_lse;
        if (max_abs_s) {
            max_abs_s[row] = nan_row ? l[rr] : max_abs[rr];
            entropy[row] = l[rr] > T(0) ? T(row_lse - double(w[rr]) / double(l[rr]))
                                        : (nan_row ? l[rr] : T(0));
        }
        if (saturated) saturated[row] = sat[rr];
    }
    __syncthreads();
    for (int u = 0; u < kRowOutputsPerThread; ++u) {
        const int64_t idx = threadIdx.x + u * kThreads, r = idx / D;
        if (idx >= kRows * D) break;
        if (r < rows) out[(bh * sh.Tq + i0) * D + idx] = l_s[r] > T(0) ? o[u] / l_s[r] : T(0);
    }
}

// ---- backward --------------------------------------------------------------------------------

// delta: (rows) out, D_i = dO_i · O_i; one warp per row.
template <class T>
__global__ void attention_delta_kernel(T* delta, const T* dout, const T* out, int64_t rows,
                                       int64_t D) {
    const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
    if (row >= rows) return;
    T acc = 0;
    for (int64_t d = threadIdx.x % kWarp; d < D; d += kWarp)
        acc += dout[row * D + d] * out[row * D + d];
    acc = warp_sum(acc);
    if (threadIdx.x % kWarp == 0) delta[row] = acc;
}

// The probabilities and logit gradient of one (row i, key j) pair: p_ij and ds_ij (0 if masked).
// q_row, dout_row: row i's q and dO (shared); k_row, v_row: key j's k and v. The row's float64
// lse comes split in two T, lse_hi + lse_lo, as on the cpu.
template <class T>
__device__ void pair_grad(T& p, T& ds, bool visible, const T* q_row, const T* dout_row,
                          const T* k_row, const T* v_row, int64_t D, T g, T cap, bool fp8, T lse_hi,
                          T lse_lo, T row_delta) {
    p = ds = 0;
    if (!visible || lse_hi == T(-INFINITY)) return;
    probability_and_grad(p, ds, dot(q_row, k_row, D), dot(dout_row, v_row, D), g, cap, fp8, lse_hi,
                         lse_lo, row_delta);
}

template <class T>
__global__ void attention_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k,
                                      const T* v, const double* lse, const T* delta, const T* scale,
                                      int64_t scale_stride, T cap, AttentionShape sh) {
    QK_DYNAMIC_SHARED(double, smem);
    const int64_t D = sh.D, kvh = blockIdx.y, j0 = int64_t(blockIdx.x) * kCols;
    T* q_s = reinterpret_cast<T*>(smem);  // (kRows, D)
    T* do_s = q_s + kRows * D;            // (kRows, D)
    T* p_s = do_s + kRows * D;            // (kRows, kCols)
    T* ds_s = p_s + kRows * kCols;        // (kRows, kCols), g·ds
    T* lse_hi_s = ds_s + kRows * kCols;   // (kRows)
    T* lse_lo_s = lse_hi_s + kRows;       // (kRows)
    T* delta_s = lse_lo_s + kRows;        // (kRows)
    const int64_t cols = sh.Tk - j0 < kCols ? sh.Tk - j0 : kCols;
    T dk_acc[kKeyOutputsPerThread] = {}, dv_acc[kKeyOutputsPerThread] = {};
    const auto [first_row, end_row, first_bh, group] = key_tile_readers(kvh, j0, cols, sh);
    for (int64_t bh = first_bh; bh < first_bh + group; ++bh) {  // the query heads reading kvh
        const T g = scale[(bh % sh.heads) * scale_stride];
        for (int64_t i0 = first_row; i0 < end_row; i0 += kRows) {
            const int64_t rows = sh.Tq - i0 < kRows ? sh.Tq - i0 : kRows;
            __syncthreads();
            load_tile(q_s, q + (bh * sh.Tq + i0) * D, rows, kRows, D);
            load_tile(do_s, dout + (bh * sh.Tq + i0) * D, rows, kRows, D);
            if (threadIdx.x < kRows) {
                const bool in = threadIdx.x < rows;
                const double row_lse = in ? lse[bh * sh.Tq + i0 + threadIdx.x] : -INFINITY;
                lse_hi_s[threadIdx.x] = T(row_lse);
                lse_lo_s[threadIdx.x] = in ? T(row_lse - double(T(row_lse))) : T(0);
                delta_s[threadIdx.x] = in ? delta[bh * sh.Tq + i0 + threadIdx.x] : T(0);
            }
            __syncthreads();
            for (int u = 0; u < kPairsPerThread; ++u) {
                const int idx = threadIdx.x + u * kThreads, r = idx / kCols, c = idx % kCols;
                const bool visible = r < rows && c < cols && sees(i0 + r, j0 + c, sh);
                const int64_t key = kvh * sh.Tk + j0 + (c < cols ? c : 0);
                T p, ds;
                pair_grad(p, ds, visible, q_s + r * D, do_s + r * D, k + key * D, v + key * D, D, g,
                          cap, sh.fp8_logits, lse_hi_s[r], lse_lo_s[r], delta_s[r]);
                p_s[idx] = p;
                ds_s[idx] = g * ds;
            }
            __syncthreads();
            for (int u = 0; u < kKeyOutputsPerThread;
                 ++u) {  // dv_c += Σ_r p_rc dO_r, dk_c += Σ g ds q
                const int64_t idx = threadIdx.x + u * kThreads, c = idx / D, d = idx % D;
                if (idx >= kCols * D) break;
                for (int r = 0; r < kRows; ++r) {
                    dv_acc[u] += p_s[r * kCols + c] * do_s[r * D + d];
                    dk_acc[u] += ds_s[r * kCols + c] * q_s[r * D + d];
                }
            }
        }
    }
    for (int u = 0; u < kKeyOutputsPerThread; ++u) {
        const int64_t idx = threadIdx.x + u * kThreads;
        if (idx >= kCols * D) break;
        if (idx / D < cols) {
            dk[(kvh * sh.Tk + j0) * D + idx] = dk_acc[u];
            dv[(kvh * sh.Tk + j0) * D + idx] = dv_acc[u];
        }
    }
}

// dq_unscaled: (BH, Tq, D) out, Σ_j ds_ij k_j (the factor g comes in attention_scale_kernel).
template <class T>
__global__ void attention_dq_kernel(T* dq_unscaled, const T* dout, const T* q, const T* k,
                                    const T* v, const double* lse, const T* delta, const T* scale,
                                    int64_t scale_stride, T cap, AttentionShape sh) {
    QK_DYNAMIC_SHARED(double, smem);
    const int64_t D = sh.D, bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
    T* q_s = reinterpret_cast<T*>(smem);  // (kRows, D)
    T* do_s = q_s + kRows * D;            // (kRows, D)
    T* k_s = do_s + kRows * D;            // (kCols, D)
    T* ds_s = k_s + kCols * D;            // (kRows, kCols)
    const int64_t rows = sh.Tq - i0 < kRows ? sh.Tq - i0 : kRows;
    const T g = scale[(bh % sh.heads) * scale_stride];
    load_tile(q_s, q + (bh * sh.Tq + i0) * D, rows, kRows, D);
    load_tile(do_s, dout + (bh * sh.Tq + i0) * D, rows, kRows, D);
    T dq_acc[kRowOutputsPerThread] = {};
    // Each of this thread's pairs keeps its row (warp + u·kWarps) over every key tile: read the
    // rows' lse (split in two T, as on the cpu) and D_i once.
    T lse_hi[kPairsPerThread], lse_lo[kPairsPerThread], row_delta[kPairsPerThread];
    for (int u = 0; u < kPairsPerThread; ++u) {
        const int r = (threadIdx.x + u * kThreads) / kCols;
        const int64_t row = bh * sh.Tq + i0 + (r < rows ? r : 0);
        lse_hi[u] = T(lse[row]);
        lse_lo[u] = T(lse[row] - double(lse_hi[u]));
        row_delta[u] = delta[row];
    }
    const int64_t last_key = sh.end_key(i0 + rows - 1), kv_first = sh.kv_head(bh) * sh.Tk;
    for (int64_t j0 = sh.first_key(i0) / kCols * kCols; j0 < last_key; j0 += kCols) {
        const int64_t cols = last_key - j0 < kCols ? last_key - j0 : kCols;
        __syncthreads();
        load_tile(k_s, k + (kv_first + j0) * D, cols, kCols, D);
        __syncthreads();
        for (int u = 0; u < kPairsPerThread; ++u) {
            const int idx = threadIdx.x + u * kThreads, r = idx / kCols, c = idx % kCols;
            const bool visible = r < rows && c < cols && sees(i0 + r, j0 + c, sh);
            const int64_t key = kv_first + j0 + (c < cols ? c : 0);
            T p, ds;
            pair_grad(p, ds, visible, q_s + r * D, do_s + r * D, k_s + c * D, v + key * D, D, g,
                      cap, sh.fp8_logits, lse_hi[u], lse_lo[u], row_delta[u]);
            ds_s[idx] = ds;
        }
        __syncthreads();
        for (int u = 0; u < kRowOutputsPerThread; ++u) {  // dq_r += Σ_c ds_rc k_c
            const int64_t idx = threadIdx.x + u * kThreads, r = idx / D, d = idx % D;
            if (idx >= kRows * D) break;
            for (int c = 0; c < cols; ++c) dq_acc[u] += ds_s[r * kCols + c] * k_s[c * D + d];
        }
    }
    for (int u = 0; u < kRowOutputsPerThread; ++u) {
        const int64_t idx = threadIdx.x + u * kThreads;
        if (idx >= kRows * D) break;
        if (idx / D < rows) dq_unscaled[(bh * sh.Tq + i0) * D + idx] = dq_acc[u];
    }
}

// Block (bh, s) takes slice s of head bh's Tq·D values: partial[bh, s] = Σ q · dq' over the slice
// (when wanted), then dq = g · dq' in place. Slices, not one block per head: B·H blocks (96-192
// at the 124M shape) could not fill an H100's 132 SMs twice over.
template <class T, class Q>
__global__ void attention_scale_kernel(T* dq, T* partial, const Q* q, const T* scale,
                                       int64_t scale_stride, AttentionShape sh, int64_t per_slice) {
    const int64_t bh = blockIdx.x, n = sh.Tq * sh.D, first = bh * n;
    const int64_t begin = int64_t(blockIdx.y) * per_slice;
    const int64_t end = begin + per_slice < n ? begin + per_slice : n;
    const T g = scale[(bh % sh.heads) * scale_stride];
    T acc = 0;
    for (int64_t idx = begin + threadIdx.x; idx < end; idx += kThreads) {
        acc += T(q[first + idx]) * dq[first + idx];
        dq[first + idx] *= g;
    }
    acc = block_sum(acc);
    if (partial && threadIdx.x == 0) partial[bh * gridDim.y + blockIdx.y] = acc;
}

// dscale: (BH) out; partial: (BH, slices). One thread per head adds its slices in order.
template <class T>
__global__ void attention_scale_combine_kernel(T* dscale, const T* partial, int64_t heads,
                                               int64_t slices) {
    const int64_t bh = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (bh >= heads) return;
    T acc = 0;
    for (int64_t s = 0; s < slices; ++s) acc += partial[bh * slices + s];
    dscale[bh] = acc;
}

}  // namespace

// Ledger costs (cuda/ledger.h). One query row against one key column is a D-long dot product
// (2D FLOPs) and, for the output, a D-long axpy (2D more); a causal mask keeps about half of the
// pairs. Each query tile re-reads the K and V tiles it needs (through L2, counted as DRAM here).
double attention_pairs(const AttentionShape& sh) {
    return double(sh.batch_heads) * double(sh.Tq) * double(sh.Tk) * (sh.causal ? 0.5 : 1.0);
}
double tiles_bytes(const AttentionShape& sh, int64_t size_of, int64_t tile_rows, int64_t other) {
    const double tiles = double((other + tile_rows - 1) / tile_rows);
    return double(size_of) * double(sh.batch_heads) * double(sh.D) * tiles * double(sh.Tk) *
           (sh.causal ? 0.5 : 1.0);
}

template <class T>
void attention_forward(T* out, double* lse, T* max_abs_s, T* entropy, T* saturated, const T* q,
                       const T* k, const T* v, const T* scale, int64_t scale_stride, T cap,
                       const AttentionShape& sh) {
    if (sh.batch_heads == 0 || sh.Tq == 0) return;
    const dim3 grid(static_cast<unsigned>((sh.Tq + kRows - 1) / kRows),
                    static_cast<unsigned>(sh.batch_heads));
    const size_t smem = sizeof(T) * ((kRows + kCols) * sh.D + kRows * kCols + 2 * kRows);
    ledger::declare(2 * tiles_bytes(sh, sizeof(T), kRows, sh.Tq) +
                        double(sizeof(T)) * 2.0 * double(sh.batch_heads * sh.Tq * sh.D),
                    4 * double(sh.D) * attention_pairs(sh) + 8 * attention_pairs(sh), 0,
                    sizeof(T) == 8);
    QK_LAUNCH((attention_forward_kernel<T>), grid, kThreads, smem, stream(), out, lse, max_abs_s,
              entropy, saturated, q, k, v, scale, scale_stride, cap, sh);
    QK_CUDA_CHECK_LAUNCH("attention_forward_kernel");
}

// D_i = dO_i · O_i for every row (the backward's first step, both kernels).
template <class T>
void attention_delta(T* delta, const T* dout, const T* out, const AttentionShape& sh) {
    const int64_t rows = sh.batch_heads * sh.Tq;
    if (rows == 0) return;
    ledger::declare_elements<T>(2 * rows * sh.D, rows, 2 * rows * sh.D);
    QK_LAUNCH((attention_delta_kernel<T>), blocks_for(rows, kWarps), kThreads, 0, stream(), delta,
              dout, out, rows, sh.D);
    QK_CUDA_CHECK_LAUNCH("attention_delta_kernel");
}

// The backward's last step, both kernels: dq = g · dq' in place and ∂loss/∂g per head.
template <class T, class Q>
void attention_finish_dq(T* dq, T* dscale, const Q* q, const T* scale, int64_t scale_stride,
                         const AttentionShape& sh) {
    if (sh.batch_heads == 0) return;
    // Slices of at least 4,096 values, enough of them to fill the GPU.
    const int64_t n = sh.Tq * sh.D;
    const auto [per_slice, slices] = pieces_for(n, sh.batch_heads, 4096);
    Storage scratch(dscale ? sizeof(T) * size_t(sh.batch_heads * slices) : 0, Device::cuda);
    T* partial = dscale ? static_cast<T*>(scratch.data()) : nullptr;
    ledger::declare(double(sizeof(T)) * 2 * double(sh.batch_heads * n) +
                        double(sizeof(Q)) * double(sh.batch_heads * n),
                    3 * double(sh.batch_heads * n), 0, sizeof(T) == 8);
    QK_LAUNCH((attention_scale_kernel<T, Q>),
              dim3(static_cast<unsigned>(sh.batch_heads), static_cast<unsigned>(slices)), kThreads,
              0, stream(), dq, partial, q, scale, scale_stride, sh, per_slice);
    QK_CUDA_CHECK_LAUNCH("attention_scale_kernel");
    if (!dscale) return;
    ledger::declare_elements<T>(sh.batch_heads * slices, sh.batch_heads, sh.batch_heads * slices);
    QK_LAUNCH((attention_scale_combine_kernel<T>), blocks_for(sh.batch_heads, kThreads), kThreads,
              0, stream(), dscale, partial, sh.batch_heads, slices);
    QK_CUDA_CHECK_LAUNCH("attention_scale_combine_kernel");
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* dscale, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const double* lse, const T* scale,
                        int64_t scale_stride, T cap, const AttentionShape& sh) {
    if (sh.batch_heads == 0) return;
    attention_delta(delta, dout, out, sh);
    if (sh.Tk > 0) {
        const dim3 grid(static_cast<unsigned>((sh.Tk + kCols - 1) / kCols),
                        static_cast<unsigned>(sh.batch_heads / sh.heads * sh.kv_heads));
        const size_t smem = sizeof(T) * (2 * kRows * sh.D + 2 * kRows * kCols + 3 * kRows);
        // Per key tile: q and dout of every query tile that sees it; s, dP recomputed, dv, dk.
        ledger::declare(2 * tiles_bytes(sh, sizeof(T), kCols, sh.Tk) +
                            double(sizeof(T)) * 4.0 * double(sh.batch_heads * sh.Tk * sh.D),
                        8 * double(sh.D) * attention_pairs(sh) + 10 * attention_pairs(sh), 0,
                        sizeof(T) == 8);
        QK_LAUNCH((attention_dkdv_kernel<T>), grid, kThreads, smem, stream(), dk, dv, dout, q, k, v,
                  lse, delta, scale, scale_stride, cap, sh);
        QK_CUDA_CHECK_LAUNCH("attention_dkdv_kernel");
    }
    if (sh.Tq > 0) {
        const dim3 grid(static_cast<unsigned>((sh.Tq + kRows - 1) / kRows),
                        static_cast<unsigned>(sh.batch_heads));
        const size_t smem = sizeof(T) * ((2 * kRows + kCols) * sh.D + kRows * kCols);
        // Per query tile: k and v tiles; s, dP recomputed, dq.
        ledger::declare(2 * tiles_bytes(sh, sizeof(T), kRows, sh.Tq) +
                            double(sizeof(T)) * 3.0 * double(sh.batch_heads * sh.Tq * sh.D),
                        6 * double(sh.D) * attention_pairs(sh) + 10 * attention_pairs(sh), 0,
                        sizeof(T) == 8);
        QK_LAUNCH((attention_dq_kernel<T>), grid, kThreads, smem, stream(), dq, dout, q, k, v, lse,
                  delta, scale, scale_stride, cap, sh);
        QK_CUDA_CHECK_LAUNCH("attention_dq_kernel");
    }
    attention_finish_dq(dq, dscale, q, scale, scale_stride, sh);
}

template void attention_finish_dq<float, bf16>(float*, float*, const bf16*, const float*, int64_t,
                                               const AttentionShape&);
template void attention_finish_dq<float, f16>(float*, float*, const f16*, const float*, int64_t,
                                              const AttentionShape&);
template void attention_forward<float>(float*, double*, float*, float*, float*, const float*,
                                       const float*, const float*, const float*, int64_t, float,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, double*, double*, double*, const double*,
                                        const double*, const double*, const double*, int64_t,
                                        double, const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, float*, float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const double*, const float*, int64_t, float,
                                        const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, double*, double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const double*, const double*, int64_t, double,
                                         const AttentionShape&);

}  // namespace qk::cuda
