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
    s = s * dev_exp(m - m_new) + s_other * dev_exp(m_other - m_new);
    m = m_new;
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
    // Pass 1: the capped logits z (staged in yr) and this lane's online (max, sum).
    T m = -INFINITY, s = 0;
    T bad = 0;  // 1 when a visible z is NaN or +inf: the row is NaN, as on the cpu
    for (int64_t j = lane; j < n; j += kWarp) {
        T z = xr[j];
        if (cap > 0) {
            z = cap * dev_tanh(z / cap);
            yr[j] = z;  // read back in pass 2 by this same lane: no barrier needed
        }
        if (z != z || z == T(INFINITY)) bad = 1;
        if (z > m) {
            s = s * dev_exp(m - z) + T(1);  // exp(−inf) = 0 on the first finite z
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
    const T row_lse = bad != T(0) ? T(NAN) : m + dev_log(s);
    const T inv_s = T(1) / s;
    const T* zr = cap > 0 ? yr : xr;
    // Pass 2: write the row. Masked entries (j >= n) come out as 0 or −inf; a row with a NaN or
    // +inf visible is NaN where visible; one with nothing finite visible is all 0 or −inf.
    for (int64_t j = lane; j < Tk; j += kWarp) {
        T value;
        if (j >= n || (m == -INFINITY && bad == T(0)))
            value = kLog ? T(-INFINITY) : T(0);
        else if (bad != T(0))
            value = T(NAN);
        else
            value = kLog ? zr[j] - row_lse : dev_exp(zr[j] - m) * inv_s;
        yr[j] = value;
        store_half(half_out, r * Tk + j, value, half_is_bf16);
    }
    if (lane == 0) lse[r] = m == -INFINITY && bad == T(0) ? T(-INFINITY) : row_lse;
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

// Elements a launch reads per (rows, Tk) matrix: a causal row r reads its visible_keys only (it
// writes every key, the masked ones 0). Row r is query r mod Tq.
int64_t visible_elements(int64_t rows, int64_t Tq, int64_t Tk, bool causal) {
    if (!causal || Tq == 0) return rows * Tk;
    int64_t per_query_block = 0;  // the Tq rows of one (batch, head)
    for (int64_t i = 0; i < Tq; ++i)
        per_query_block += std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk);
    return per_query_block * (rows / Tq);
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
