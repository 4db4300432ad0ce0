// CUDA softmax and log-softmax over the last dim, with the causal mask and the soft-cap fused in.
// Twin of ops/softmax.cpp (cpu::softmax_forward / cpu::softmax_backward); the math, the masked
// and "nothing visible" conventions, and what is saved (y and lse per row) are derived there.
//
// Work split: one warp per row, kWarpsPerBlock rows per block (grid = rows / 4 blocks of 128
// threads). Lane l handles the row's entries l, l + 32, l + 64, ..., so rows longer than 32 loop
// with stride 32 and a warp reads consecutive addresses (coalesced). Rows are attention rows
// (Tk = T keys, a few hundred to a few thousand), which a warp covers in a few dozen steps; the
// reductions are then register shuffles only, with no shared memory and no __syncthreads. (Long
// rows with few of them, the cross-entropy's vocabulary rows, get one block per row instead:
// cuda/loss.cu.)
//
// Forward, per row (lane-strided loops):
//   pass 1  z_j = cap · tanh(x_j / cap) (staged in y when capped, so tanh runs once per element),
//           and an *online* max and sum per lane: on a new max m' the running sum is rescaled,
//           s ← s · exp(m − m') + exp(z − m'); lanes then merge (m, s) pairs by shuffles.
//           One read of x for both statistics, where max-then-sum needs two.
//   pass 2  y_j = exp(z_j − m) / S, or z_j − lse; masked entries 0, or −inf.
// Backward, per row: one warp sum (dot = Σ g·y, or Σ g), then the elementwise dz and the cap
// factor 1 − (z/c)², z recomputed from y and lse as on the cpu.
#include <algorithm>
#include <cstdint>

#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "ops/softmax.h"

namespace qk::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * kWarp;

// Keys row r may see: all Tk, or the causal prefix up to i + (Tk − Tq), i = r mod Tq.
__device__ __forceinline__ int64_t visible_keys(int64_t r, int64_t Tq, int64_t Tk, bool causal) {
    if (!causal) return Tk;
    const int64_t n = r % Tq + (Tk - Tq) + 1;
    return n < Tk ? n : Tk;
}

// Merges another (max, sum of exp(z − max)) pair into (m, s). −inf maxes carry sum 0.
template <class T>
__device__ __forceinline__ void merge_max_sum(T& m, T& s, T m_other, T s_other) {
    const T m_new = m_other > m ? m_other : m;
    if (m_new == -INFINITY) return;  // both empty
    s = dev_add_unfused(s * dev_exp(m - m_new), s_other * dev_exp(m_other - m_new));
    m = m_new;
}

// The soft-capped logit z = c · tanh(x / c), or x when c = 0. The product is rounded on its own
// (_rn: never fused into the z − m after it), so that every kernel that recomputes z from x, the
// materialised attention's backward included, gets the bits the forward got.
__device__ __forceinline__ float capped(float x, float cap) {
    return cap > 0 ? __fmul_rn(cap, dev_tanh(x / cap)) : x;
}
__device__ __forceinline__ double capped(double x, double cap) {
    return cap > 0 ? __dmul_rn(cap, dev_tanh(x / cap)) : x;
}

// A row's statistics, merged over the warp: the max m of its visible z, S = Σ exp(z − m), and
// whether a visible z is NaN or +inf (then the row is NaN, as on the cpu). The rescaling sums are
// not fused into FMAs (dev_add_unfused), whatever the compiler would choose where this is inlined:
// softmax_forward and the materialised attention's kernels get the same m and S, to the bit.
template <class T>
struct RowStats {
    T m, s;
    bool bad;
};

// Pass 1 over the row's n visible logits x (lane-strided), an *online* max and sum per lane (on a
// new max m' the running sum is rescaled, s ← s · exp(m − m') + exp(z − m')), then merged by
// shuffles. z_stage: null, or where to stage the capped z for the second pass (this lane reads
// back only what it wrote: no barrier).
template <class T>
__device__ RowStats<T> row_stats(const T* x, T* z_stage, int64_t n, T cap, int lane) {
    T m = -INFINITY, s = 0;
    T bad = 0;
    for (int64_t j = lane; j < n; j += kWarp) {
        const T z = capped(x[j], cap);
        if (cap > 0 && z_stage) z_stage[j] = z;
        if (z != z || z == T(INFINITY)) bad = 1;
        if (z > m) {
            s = dev_add_unfused(T(1), s * dev_exp(m - z));  // exp(−inf) = 0 on the first z
            m = z;
        } else if (z != -INFINITY) {
            s += dev_exp(z - m);
        }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const T m_other = __shfl_xor_sync(kFullMask, m, offset);
        const T s_other = __shfl_xor_sync(kFullMask, s, offset);
        merge_max_sum(m, s, m_other, s_other);
        const T bad_other = __shfl_xor_sync(kFullMask, bad, offset);
        bad = bad_other > bad ? bad_other : bad;
    }
    return {m, s, bad != T(0)};
}

// y: (rows, Tk) out; lse: (rows) out; x: (rows, Tk); half_out: null or (rows, Tk) out, y rounded.
// cap: 0 = none. Row r is query r mod Tq.
template <class T, bool kLog>
__global__ void softmax_forward_kernel(T* y, T* lse, const T* x, int64_t rows, int64_t Tq,
                                       int64_t Tk, bool causal, T cap, uint16_t* half_out,
                                       bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
    if (r >= rows) return;  // the whole warp leaves together: no shuffle is left waiting
    const int64_t n = visible_keys(r, Tq, Tk, causal);
    const T* xr = x + r * Tk;
    T* yr = y + r * Tk;
    const auto [m, s, bad] = row_stats(xr, yr, n, cap, lane);  // pass 1, z staged in yr
    const T row_lse = bad ? T(NAN) : m + dev_log(s);
    const T inv_s = T(1) / s;
    const T* zr = cap > 0 ? yr : xr;
    // Pass 2: write the row. Masked entries (j >= n) come out as 0 or −inf; a row with a NaN or
    // +inf visible is NaN where visible; one with nothing finite visible is all 0 or −inf.
    for (int64_t j = lane; j < Tk; j += kWarp) {
        T value;
        if (j >= n || (m == -INFINITY && !bad))
            value = kLog ? T(-INFINITY) : T(0);
        else if (bad)
            value = T(NAN);
        else
            value = kLog ? zr[j] - row_lse : dev_exp(zr[j] - m) * inv_s;
        yr[j] = value;
        store_half(half_out, r * Tk + j, value, half_is_bf16);
    }
    if (lane == 0) lse[r] = m == -INFINITY && !bad ? T(-INFINITY) : row_lse;
}

// dx: (rows, Tk) out; dy, y: (rows, Tk); lse: (rows); half_out: null or (rows, Tk) out, dx
// rounded. Same row/mask layout as the forward.
template <class T, bool kLog>
__global__ void softmax_backward_kernel(T* dx, const T* dy, const T* y, const T* lse, int64_t rows,
                                        int64_t Tq, int64_t Tk, bool causal, T cap,
                                        uint16_t* half_out, bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
    if (r >= rows) return;
    const int64_t n = visible_keys(r, Tq, Tk, causal), o = r * Tk;
    const T row_lse = lse[r];
    // Nothing finite visible: gradient 0. A NaN row: NaN where visible, masked entries 0.
    if (row_lse == -INFINITY || row_lse != row_lse) {
        for (int64_t j = lane; j < Tk; j += kWarp) {
            const T value = row_lse != row_lse && j < n ? T(NAN) : T(0);
            dx[o + j] = value;
            store_half(half_out, o + j, value, half_is_bf16);
        }
        return;
    }
    // softmax: dot = Σ_vis g·y;  log_softmax: sum_dy = Σ_vis g. Masked g are 0.
    T acc = 0;
    for (int64_t j = lane; j < n; j += kWarp) acc += kLog ? dy[o + j] : dy[o + j] * y[o + j];
    acc = warp_sum(acc);
    const T inv_cap = cap > 0 ? T(1) / cap : T(0);
    for (int64_t j = lane; j < Tk; j += kWarp) {
        if (j >= n) {  // masked: the output is a constant
            dx[o + j] = 0;
            store_half(half_out, o + j, T(0), half_is_bf16);
            continue;
        }
        const T yj = y[o + j];
        T dz = kLog ? dy[o + j] - dev_exp(yj) * acc : yj * (dy[o + j] - acc);
        if (cap > 0 && (kLog || yj != T(0))) {  // cap factor 1 − (z/c)², z from y and lse
            const T t = ((kLog ? yj : dev_log(yj)) + row_lse) * inv_cap;
            dz *= T(1) - t * t;
        }
        dx[o + j] = dz;
        store_half(half_out, o + j, dz, half_is_bf16);
    }
}

// ---- attention's materialised rows: p and dS written rounded only ----------------------------
//
// For the materialised attention's node (ops/attention_materialized.cpp): the softmax above on
// float32 logits s, where the GEMMs that follow read only the rounded p (p · v, pᵀ · dO) and the
// rounded dS (dS · k, dSᵀ · q). So the forward writes p rounded and no float32 p, and saves each
// row's max m and sum S instead; the backward recomputes p_j = exp(z_j − m) / S from the saved s
// with the same instructions as the forward (so the same bits as the float32 p softmax_forward
// writes), and writes dS rounded only. The rounded values are those of softmax_forward's and
// softmax_backward's half_out, bit for bit.
//
// Causal rows are written block by block, as the block-triangular GEMMs read them: row i, in the
// chunk of `chunk` query rows that holds it, writes every key the chunk's last row sees (its own
// masked ones as 0), and nothing after; non-causal rows write all Tk.

// Keys row r writes: up to the last key its chunk of query rows sees.
__device__ __forceinline__ int64_t written_keys(int64_t r, int64_t Tq, int64_t Tk, bool causal,
                                                int64_t chunk) {
    if (!causal) return Tk;
    const int64_t end = (r % Tq / chunk + 1) * chunk + (Tk - Tq);
    return end < Tk ? end : Tk;
}

// p_half: (rows, Tk) out, written up to written_keys; row_max, row_sum: (rows) out (row_sum NaN
// for a NaN row); s: (rows, Tk), read up to visible_keys. cap: 0 = none.
__global__ void softmax_rounded_forward_kernel(uint16_t* p_half, float* row_max, float* row_sum,
                                               const float* s, int64_t rows, int64_t Tq, int64_t Tk,
                                               bool causal, float cap, int64_t chunk,
                                               bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
    if (r >= rows) return;
    const int64_t n = visible_keys(r, Tq, Tk, causal),
                  width = written_keys(r, Tq, Tk, causal, chunk);
    const float* sr = s + r * Tk;
    const auto [m, sum, bad] = row_stats(sr, static_cast<float*>(nullptr), n, cap, lane);
    const float inv_sum = 1.0f / sum;
    for (int64_t j = lane; j < width; j += kWarp) {
        float p = 0;  // masked, or nothing finite visible
        if (j < n && bad)
            p = NAN;
        else if (j < n && m != -INFINITY)
            p = dev_exp(capped(sr[j], cap) - m) * inv_sum;
        store_half(p_half, r * Tk + j, p, half_is_bf16);
    }
    if (lane == 0) row_max[r] = m, row_sum[r] = bad ? NAN : sum;
}

// ds_half: (rows, Tk) out, written up to written_keys; dp, s: (rows, Tk), read up to
// visible_keys; row_max, row_sum: (rows), the forward's. dS_j = p_j (dP_j − Σ_k dP_k p_k), times
// the cap factor 1 − (z_j/c)², z_j from p_j and lse as softmax_backward_kernel has it.
__global__ void softmax_rounded_backward_kernel(uint16_t* ds_half, const float* dp, const float* s,
                                                const float* row_max, const float* row_sum,
                                                int64_t rows, int64_t Tq, int64_t Tk, bool causal,
                                                float cap, int64_t chunk, bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
    if (r >= rows) return;
    const int64_t n = visible_keys(r, Tq, Tk, causal),
                  width = written_keys(r, Tq, Tk, causal, chunk);
    const int64_t o = r * Tk;
    const float m = row_max[r], sum = row_sum[r];
    const float row_lse = sum != sum ? NAN : m == -INFINITY ? -INFINITY : m + dev_log(sum);
    if (row_lse == -INFINITY || row_lse != row_lse) {  // as softmax_backward_kernel
        for (int64_t j = lane; j < width; j += kWarp)
            store_half(ds_half, o + j, row_lse != row_lse && j < n ? NAN : 0.0f, half_is_bf16);
        return;
    }
    const float inv_sum = 1.0f / sum;
    const auto p = [&](int64_t j) { return dev_exp(capped(s[o + j], cap) - m) * inv_sum; };
    float dot = 0;  // Σ_vis dP·p
    for (int64_t j = lane; j < n; j += kWarp) dot += dp[o + j] * p(j);
    dot = warp_sum(dot);
    const float inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
    for (int64_t j = lane; j < width; j += kWarp) {
        float ds = 0;  // masked: the output is a constant
        if (j < n) {
            const float pj = p(j);
            ds = pj * (dp[o + j] - dot);
            if (cap > 0 && pj != 0.0f) {
                const float t = (dev_log(pj) + row_lse) * inv_cap;
                ds *= 1.0f - t * t;
            }
        }
        store_half(ds_half, o + j, ds, half_is_bf16);
    }
}

// Elements a launch reads per (rows, Tk) matrix: a causal row r reads its visible_keys only (it
// writes every key, the masked ones 0). Row r is query r mod Tq.
int64_t visible_elements(int64_t rows, int64_t Tq, int64_t Tk, bool causal) {
    if (!causal || Tq == 0) return rows * Tk;
    int64_t per_query_block = 0;  // the Tq rows of one (batch, head)
    for (int64_t i = 0; i < Tq; ++i)
        per_query_block += std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk);
    return per_query_block * (rows / Tq);
}

// Elements a launch writes per (rows, Tk) matrix with rows written up to written_keys.
int64_t written_elements(int64_t rows, int64_t Tq, int64_t Tk, bool causal, int64_t chunk) {
    if (!causal || Tq == 0) return rows * Tk;
    int64_t per_query_block = 0;
    for (int64_t i = 0; i < Tq; ++i)
        per_query_block += std::min<int64_t>(Tk, (i / chunk + 1) * chunk + (Tk - Tq));
    return per_query_block * (rows / Tq);
}

// The ledger entry of a softmax_rounded launch: `inputs` float32 (rows, Tk) tensors read over
// the visible keys, the rounded result written up to each row's chunk end, the rows' max and sum.
void declare_rounded_rows(int inputs, double flops_per_value, int64_t rows, int64_t Tq, int64_t Tk,
                          bool causal, int64_t chunk) {
    const double visible = double(visible_elements(rows, Tq, Tk, causal));
    ledger::declare(4.0 * inputs * visible +
                        2.0 * double(written_elements(rows, Tq, Tk, causal, chunk)) +
                        8.0 * double(rows),
                    flops_per_value * visible, 0);
}

}  // namespace

template <class T>
void softmax_forward(T* y, T* lse, const T* x, int64_t rows, int64_t Tq, int64_t Tk, bool causal,
                     T cap, bool is_log, uint16_t* half_out, bool half_is_bf16) {
    if (rows == 0) return;
    const unsigned blocks = blocks_for(rows, kWarpsPerBlock);
    const int64_t visible = visible_elements(rows, Tq, Tk, causal);
    // Bytes: the visible x read, y and lse written (and the rounded copy).
    ledger::declare(double(sizeof(T)) * double(visible + rows * Tk + rows) +
                        (half_out ? 2.0 * double(rows * Tk) : 0.0),
                    6.0 * double(visible), 0, sizeof(T) == 8);
    if (is_log) {
        QK_LAUNCH((softmax_forward_kernel<T, true>), blocks, kThreads, 0, stream(), y, lse, x, rows,
                  Tq, Tk, causal, cap, half_out, half_is_bf16);
    } else {
        QK_LAUNCH((softmax_forward_kernel<T, false>), blocks, kThreads, 0, stream(), y, lse, x,
                  rows, Tq, Tk, causal, cap, half_out, half_is_bf16);
    }
    QK_CUDA_CHECK_LAUNCH("softmax_forward_kernel");
}

template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, const T* lse, int64_t rows, int64_t Tq,
                      int64_t Tk, bool causal, T cap, bool is_log, uint16_t* half_out,
                      bool half_is_bf16) {
    if (rows == 0) return;
    const unsigned blocks = blocks_for(rows, kWarpsPerBlock);
    const int64_t visible = visible_elements(rows, Tq, Tk, causal);
    // Bytes: the visible dy and y and lse read, dx written (and the rounded copy).
    ledger::declare(double(sizeof(T)) * double(2 * visible + rows + rows * Tk) +
                        (half_out ? 2.0 * double(rows * Tk) : 0.0),
                    6.0 * double(visible), 0, sizeof(T) == 8);
    if (is_log) {
        QK_LAUNCH((softmax_backward_kernel<T, true>), blocks, kThreads, 0, stream(), dx, dy, y, lse,
                  rows, Tq, Tk, causal, cap, half_out, half_is_bf16);
    } else {
        QK_LAUNCH((softmax_backward_kernel<T, false>), blocks, kThreads, 0, stream(), dx, dy, y,
                  lse, rows, Tq, Tk, causal, cap, half_out, half_is_bf16);
    }
    QK_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
}

void softmax_rounded_forward(uint16_t* p_half, float* row_max, float* row_sum, const float* s,
                             int64_t rows, int64_t Tq, int64_t Tk, bool causal, float cap,
                             int64_t chunk, bool half_is_bf16) {
    if (rows == 0) return;
    QK_CHECK(chunk > 0, "softmax_rounded_forward: chunk must be > 0, got {}", chunk);
    declare_rounded_rows(1, 6, rows, Tq, Tk, causal, chunk);  // s read
    QK_LAUNCH(softmax_rounded_forward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, 0,
              stream(), p_half, row_max, row_sum, s, rows, Tq, Tk, causal, cap, chunk,
              half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("softmax_rounded_forward_kernel");
}

void softmax_rounded_backward(uint16_t* ds_half, const float* dp, const float* s,
                              const float* row_max, const float* row_sum, int64_t rows, int64_t Tq,
                              int64_t Tk, bool causal, float cap, int64_t chunk,
                              bool half_is_bf16) {
    if (rows == 0) return;
    QK_CHECK(chunk > 0, "softmax_rounded_backward: chunk must be > 0, got {}", chunk);
    declare_rounded_rows(2, 10, rows, Tq, Tk, causal, chunk);  // dP and s read
    QK_LAUNCH(softmax_rounded_backward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, 0,
              stream(), ds_half, dp, s, row_max, row_sum, rows, Tq, Tk, causal, cap, chunk,
              half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("softmax_rounded_backward_kernel");
}

template void softmax_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, bool,
                                     float, bool, uint16_t*, bool);
template void softmax_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                      bool, double, bool, uint16_t*, bool);
template void softmax_backward<float>(float*, const float*, const float*, const float*, int64_t,
                                      int64_t, int64_t, bool, float, bool, uint16_t*, bool);
template void softmax_backward<double>(double*, const double*, const double*, const double*,
                                       int64_t, int64_t, int64_t, bool, double, bool, uint16_t*,
                                       bool);

}  // namespace qk::cuda
