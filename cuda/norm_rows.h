// The row kernels' layout (cuda/norm.cu) and their versions that hold rows in registers: included
// by cuda/norm.cu only.
//
// Row kernels (forward, and dx in backward) give a warp one row, kWarpsPerBlock = 4 rows per
// 128-thread block, and loop over it. Rows of at most 128 values (the QK-norms over a head of D =
// 64 or 128) take the kernels below with kRows = 4 rows a warp, and float32 rows of at most 1,024
// (a block norm of GPT-2's 768) with one row a warp: every lane loads its values of the rows before
// the first sum, and the backward computes the parameter gradients from the same registers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "ops/norm.h"

namespace qk::cuda::norm_rows {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowThreads = kWarpsPerBlock * kWarp;

// The row this warp works on, or -1 past the end (the whole warp leaves together).
__device__ __forceinline__ int64_t warp_row(int64_t rows) {
    const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
    return r < rows ? r : -1;
}

// ---- rows in registers: the per-head norms (C = D <= 128), the block norms (C <= 1,024) --------
//
// A warp per row of 64 values gives each lane two loads and then two five-shuffle sums: on an
// H200 the per-head QK-norms ran at a third of the memory's speed (114 µs a call where their bytes
// take 44), each small block's dependent chain waiting on DRAM, wave after wave. Here a warp takes
// kRows rows at once and every lane loads its kPerLane values of all of them before the first sum,
// kRows·kPerLane loads in flight. Each row's sums and outputs are cuda/norm.cu's one-row kernels',
// term for term and in the same order (values past C are never added): the same bits but where the
// compiler fuses a multiply and an add differently (measured in the emulator: rms_norm's dx at
// C = 100 and 128 differs in the last bit, every other output is identical).

constexpr int kShortRows = 4;  // rows a warp: 8 or 16 loads in flight a lane

// The kRows rows from `first` (those below `rows`): lane l's values l, l + 32, ... of each, 0 past
// C.
template <class T, int kPerLane, int kRows, class RowStart>
__device__ __forceinline__ void load_rows(T (&v)[kRows][kPerLane], const RowStart& row_start,
                                          int64_t first, int64_t rows, int64_t C) {
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        const T* xr = first + r < rows ? row_start(first + r) : nullptr;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + kWarp * i;
            v[r][i] = xr && c < C ? xr[c] : T(0);
        }
    }
}

// The residual add (RowAdd): v += this lane's values of delta's rows, and the sums written to
// add.sum. One float addition, as the add op's kernel makes it: the same bits.
template <class T, int kRows, int kPerLane>
__device__ __forceinline__ void add_rows(T (&v)[kRows][kPerLane], const RowAdd<T>& add,
                                         int64_t first, int64_t rows, int64_t C) {
    if (!add.delta) return;
    T d[kRows][kPerLane];
    load_rows(
        d, [&](int64_t r) { return add.delta + r * C; }, first, rows, C);
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) QK_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + kWarp * i;
        v[r][i] = v[r][i] + d[r][i];
        if (first + r < rows && c < C) add.sum[(first + r) * C + c] = v[r][i];
    }
}

// write(row, r, i, c) for each of this lane's values (i: column c = lane + 32·i < C) of the group's
// rows r that exist (row = first + r < rows): the kernels' output pass.
template <int kRows, int kPerLane, class Write>
__device__ __forceinline__ void each_row_value(int64_t first, int64_t rows, int64_t C,
                                               const Write& write) {
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        const int64_t row = first + r;
        if (row >= rows) break;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + kWarp * i;
            if (c >= C) break;
            write(row, r, i, c);
        }
    }
}

// Turns this lane's pairs of row `row` by the row's angles (ops/rope.cpp's formula, sign −1 the
// inverse): with C = 32·kPerLane (norm_rotates), value i (column c = lane + 32·i < C/2) pairs with
// value i + kPerLane/2 (column c + C/2), both in this lane.
template <class T, int kPerLane>
__device__ __forceinline__ void rotate_pairs(T (&v)[kPerLane], const RowRotation<T>& rot,
                                             int64_t row, int64_t C, T sign) {
    const int lane = threadIdx.x % kWarp;
    const int64_t h = C / 2, t = row % rot.positions;
    QK_UNROLL
    for (int i = 0; i < kPerLane / 2; ++i) {
        const int c = lane + kWarp * i;
        const T co = rot.cos[t * h + c], si = rot.sin[t * h + c] * sign;
        const T a = v[i], b = v[i + kPerLane / 2];
        v[i] = a * co - b * si;
        v[i + kPerLane / 2] = b * co + a * si;
    }
}

// The forward kernels' output pass: each value x of column c < C in row r of the group becomes
// y = value(r, c, x), each row is turned by rot (if any), and the rows that exist are written to
// y: (rows, C) and, when y_half is not null, rounded beside it.
template <class T, int kPerLane, int kRows, class Value>
__device__ __forceinline__ void store_rows(T* y, uint16_t* y_half, bool half_is_bf16,
                                           T (&v)[kRows][kPerLane], const RowRotation<T>& rot,
                                           int64_t first, int64_t rows, int64_t C,
                                           const Value& value) {
    const int lane = threadIdx.x % kWarp;
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + kWarp * i;
            if (c < C) v[r][i] = value(r, c, v[r][i]);
        }
        if (rot.cos) rotate_pairs(v[r], rot, first + r, C, T(1));
    }
    each_row_value<kRows, kPerLane>(first, rows, C, [&](int64_t row, int r, int i, int c) {
        y[row * C + c] = v[r][i];
        store_half(y_half, row * C + c, v[r][i], half_is_bf16);
    });
}

// The warp's row group (kRows rows from the returned first), or -1 past the end.
template <int kRows>
__device__ __forceinline__ int64_t warp_row_group(int64_t rows) {
    const int64_t group = warp_row((rows + kRows - 1) / kRows);
    return group < 0 ? -1 : group * kRows;
}

// cuda/norm.cu's layer_norm_forward_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void layer_norm_forward_regs_kernel(T* y, T* mean, T* rstd, const T* x, NormRows xs,
                                               const T* weight, const T* bias, int64_t rows,
                                               int64_t C, T eps, uint16_t* y_half,
                                               bool half_is_bf16, RowRotation<T> rot,
                                               RowAdd<T> add) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T v[kRows][kPerLane], m[kRows], s[kRows];
    load_rows(
        v, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
    add_rows(v, add, first, rows, C);
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        T sum = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i)
            if (lane + kWarp * i < C) sum += v[r][i];
        m[r] = warp_sum(sum) / T(C);
    }
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {  // second pass, Σ(x − mean)², as above
        T sq = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i)
            if (lane + kWarp * i < C) sq += (v[r][i] - m[r]) * (v[r][i] - m[r]);
        s[r] = T(1) / dev_sqrt(warp_sum(sq) / T(C) + eps);
    }
    store_rows(y, y_half, half_is_bf16, v, rot, first, rows, C, [&](int r, int c, T x) {
        return (x - m[r]) * s[r] * weight[c] + (bias ? bias[c] : T(0));
    });
    QK_UNROLL
    for (int r = 0; r < kRows; ++r)
        if (lane == 0 && first + r < rows) {
            mean[first + r] = m[r];
            rstd[first + r] = s[r];
        }
}

// cuda/norm.cu's rms_norm_forward_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void rms_norm_forward_regs_kernel(T* y, T* rstd, const T* x, NormRows xs,
                                             const T* weight, int64_t rows, int64_t C, T eps,
                                             uint16_t* y_half, bool half_is_bf16,
                                             RowRotation<T> rot, RowAdd<T> add) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T v[kRows][kPerLane], s[kRows];
    load_rows(
        v, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
    add_rows(v, add, first, rows, C);
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        T ss = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i)
            if (lane + kWarp * i < C) ss += v[r][i] * v[r][i];
        s[r] = T(1) / dev_sqrt(warp_sum(ss) / T(C) + eps);
    }
    store_rows(y, y_half, half_is_bf16, v, rot, first, rows, C,
               [&](int r, int c, T x) { return x * s[r] * (weight ? weight[c] : T(1)); });
    QK_UNROLL
    for (int r = 0; r < kRows; ++r)
        if (lane == 0 && first + r < rows) rstd[first + r] = s[r];
}

// ---- rows in registers, backward: dx and the parameter gradients from one read -----------------
//
// dweight = Σ_rows dy · xhat and dbias = Σ_rows dy read the dy and x that dx reads; on its own
// (cuda/norm.cu's norm_param_grads) that is a second pass over both, which for the per-head norms
// took as long as dx itself. As llm.c's layernorm_backward does, the dx kernel sums them on the
// way: a lane's columns (lane + 32·i) are the same in every row it visits, so its share of the sums
// stays in registers. Block k of the grid (1, chunks) takes the rows of chunk k, its warp w the
// groups of kRows rows w, w + 8, ... of the chunk; the block's 8 warps add their sums in warp
// order into the chunk's partials, and the block that arrives last adds the chunks' partials in
// chunk order (arrived_last): a fixed order, the same bits under every run order. The chunk count
// depends on the shape only (pieces_for), never on the GPU.

constexpr int kBackwardWarps = 8, kBackwardThreads = kBackwardWarps * kWarp;

// partial_row: (C) out, the block's column sums: sums[i] of every warp's lane (column lane + 32·i),
// added in warp order. Every thread of the block calls it (barriers).
template <class T, int kPerLane>
__device__ void store_chunk_sums(T* partial_row, const T (&sums)[kPerLane], int64_t C) {
    __shared__ T by_warp[kBackwardWarps][kPerLane * kWarp];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    __syncthreads();  // a previous call's readers are done with by_warp
    QK_UNROLL
    for (int i = 0; i < kPerLane; ++i) by_warp[warp][lane + kWarp * i] = sums[i];
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += kBackwardThreads) {
        T acc = by_warp[0][c];
        for (int w = 1; w < kBackwardWarps; ++w) acc += by_warp[w][c];
        partial_row[c] = acc;
    }
}

// sum_chunk_partials for rows wider than half the block (the block norms): each thread takes
// columns t, t + 256, ... (at most kMaxWideColumns) and every chunk in order, four chunks' loads
// in flight (walk_rows).
constexpr int kMaxWideColumns = 4;  // C <= 1,024

template <class T>
__device__ void sum_wide_chunk_partials(T* out, const T* partial, int64_t chunks, int64_t C) {
    struct Loaded {
        T v[kMaxWideColumns];
    };
    T acc[kMaxWideColumns] = {};
    walk_rows(
        0, chunks, 1,
        [&](int64_t k) {
            Loaded loaded;
            QK_UNROLL
            for (int j = 0; j < kMaxWideColumns; ++j) {
                const int64_t c = threadIdx.x + int64_t(j) * kBackwardThreads;
                loaded.v[j] = c < C ? __ldcg(partial + k * C + c) : T(0);
            }
            return loaded;
        },
        [&](int64_t, const Loaded& loaded) {
            QK_UNROLL
            for (int j = 0; j < kMaxWideColumns; ++j) acc[j] += loaded.v[j];
        });
    QK_UNROLL
    for (int j = 0; j < kMaxWideColumns; ++j) {
        const int64_t c = threadIdx.x + int64_t(j) * kBackwardThreads;
        if (c < C) out[c] = acc[j];
    }
}

// In the block that arrived last: out: (C) = Σ_k partial[k][c] over the chunks in order. Each
// column's chunks are split into `runs` interleaved runs (thread t: column t % C, run t / C) so
// that the block's threads share the reads; the runs are then added in run order.
template <class T>
__device__ void sum_chunk_partials(T* out, const T* partial, int64_t chunks, int64_t C) {
    if (C > kBackwardThreads / 2) return sum_wide_chunk_partials(out, partial, chunks, C);
    __shared__ T by_run[kBackwardThreads];
    const int runs = int(kBackwardThreads / C);  // C <= 128: at least 2
    const int c = int(threadIdx.x % C), run = int(threadIdx.x / C);
    T acc = 0;
    if (run < runs)
        for (int64_t k = run; k < chunks; k += runs) acc += __ldcg(partial + k * C + c);
    __syncthreads();  // a previous call's readers are done with by_run
    by_run[threadIdx.x] = acc;
    __syncthreads();
    if (run != 0) return;
    for (int r = 1; r < runs; ++r) acc += by_run[r * C + c];
    out[c] = acc;
}

// layer_norm (kLayerNorm) or rms_norm backward for rows of C <= 32·kPerLane values: dx, and when
// dweight is given the parameter gradients. dx: (rows, C) out; dweight, dbias: (C) out or null;
// partial_dw, partial_db: (chunks, C) scratch or null; counters: one (arrived_last); dy: (rows, C);
// x: rows of C where xs says; mean: (rows) (layer_norm) or null; rstd: (rows); weight: (C) or null
// (rms_norm); add_into_dx: dx += the gradient. dx's terms and order are cuda/norm.cu's one-row
// kernels'.
template <class T, int kPerLane, int kRows, bool kLayerNorm>
__global__ void __launch_bounds__(kBackwardThreads)
    norm_backward_regs_kernel(T* dx, T* dweight, T* dbias, T* partial_dw, T* partial_db,
                              unsigned* counters, const T* dy, const T* x, NormRows xs,
                              const T* mean, const T* rstd, const T* weight, int64_t rows,
                              int64_t C, int64_t per_chunk, RowRotation<T> rot, bool add_into_dx) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int64_t chunk = blockIdx.y, r0 = chunk * per_chunk;
    const int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
    const bool sums_wanted = dweight != nullptr, bias_wanted = kLayerNorm && dbias != nullptr;
    T dw_sum[kPerLane] = {}, db_sum[kPerLane] = {};
    for (int64_t first = r0 + int64_t(warp) * kRows; first < r1; first += kBackwardWarps * kRows) {
        T xv[kRows][kPerLane], dyv[kRows][kPerLane], m[kRows], s[kRows], mean_dxhat[kRows],
            mean_dxhat_xhat[kRows];
        load_rows(
            xv, [&](int64_t r) { return x + xs.offset(r); }, first, r1, C);
        load_rows(
            dyv, [&](int64_t r) { return dy + r * C; }, first, r1, C);
        QK_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const int64_t row = first + r < r1 ? first + r : first;  // past the end: any row's
            // With a rotation dy is the rotated y's: turned back, it is the norm output's.
            if (rot.cos) rotate_pairs(dyv[r], rot, row, C, T(-1));
            m[r] = kLayerNorm ? mean[row] : T(0);
            s[r] = rstd[row];
            T sum_dxhat = 0, sum_dxhat_xhat = 0;
            QK_UNROLL
            for (int i = 0; i < kPerLane; ++i) {
                const int c = lane + kWarp * i;
                if (c >= C) break;
                if constexpr (kLayerNorm) {
                    const T xhat = (xv[r][i] - m[r]) * s[r], dxhat = dyv[r][i] * weight[c];
                    sum_dxhat += dxhat;
                    sum_dxhat_xhat += dxhat * xhat;
                } else {
                    sum_dxhat_xhat += dyv[r][i] * (weight ? weight[c] : T(1)) * (xv[r][i] * s[r]);
                }
            }
            mean_dxhat[r] = kLayerNorm ? warp_sum(sum_dxhat) / T(C) : T(0);
            mean_dxhat_xhat[r] = warp_sum(sum_dxhat_xhat) / T(C);
        }
        each_row_value<kRows, kPerLane>(first, r1, C, [&](int64_t row, int r, int i, int c) {
            if constexpr (kLayerNorm) {
                const T xhat = (xv[r][i] - m[r]) * s[r], dxhat = dyv[r][i] * weight[c];
                //                     direct   mean term        rstd term
                const T value = s[r] * (dxhat - mean_dxhat[r] - xhat * mean_dxhat_xhat[r]);
                dx[row * C + c] = add_into_dx ? dev_add_unfused(dx[row * C + c], value) : value;
                if (sums_wanted) dw_sum[i] += dyv[r][i] * xhat;  // dweight = Σ_rows dy · xhat
                if (bias_wanted) db_sum[i] += dyv[r][i];         // dbias = Σ_rows dy
            } else {
                const T xhat = xv[r][i] * s[r], dxhat = dyv[r][i] * (weight ? weight[c] : T(1));
                const T value = s[r] * (dxhat - xhat * mean_dxhat_xhat[r]);  // direct − rstd term
                dx[row * C + c] = add_into_dx ? dev_add_unfused(dx[row * C + c], value) : value;
                if (sums_wanted) dw_sum[i] += dyv[r][i] * xhat;
            }
        });
    }
    if (!sums_wanted) return;  // the same for every block: no barrier is skipped by some
    store_chunk_sums(partial_dw + chunk * C, dw_sum, C);
    if (bias_wanted) store_chunk_sums(partial_db + chunk * C, db_sum, C);
    if (!arrived_last(counters)) return;
    sum_chunk_partials(dweight, partial_dw, gridDim.y, C);
    if (bias_wanted) sum_chunk_partials(dbias, partial_db, gridDim.y, C);
}

// How rows of C values are held in registers: kPerLane values a lane and kRows rows a warp, or
// per_lane = 0 for the one-row kernels (wider rows, or float64 rows above 128: the backward's
// shared-memory sums of 8 warps × 1,024 doubles would not fit in 48 KB).
struct RowLayout {
    int per_lane, rows;
};
template <class T>
RowLayout row_layout(int64_t C) {
    if (C <= 2 * kWarp) return {2, kShortRows};
    if (C <= 4 * kWarp) return {4, kShortRows};
    if (sizeof(T) != 4 || C > 32 * kWarp) return {0, 0};
    return {C <= 8 * kWarp ? 8 : C <= 16 * kWarp ? 16 : C <= 24 * kWarp ? 24 : 32, 1};
}

// Calls launch(RowsOf<kPerLane>{}, RowsOf<kRows>{}) for C's layout, the two numbers as types for
// the kernel's template; false where the one-row kernels run instead.
template <int n>
using RowsOf = std::integral_constant<int, n>;

template <class T, class Launch>
bool with_row_layout(int64_t C, const Launch& launch) {
    switch (row_layout<T>(C).per_lane) {
        case 2:
            launch(RowsOf<2>{}, RowsOf<kShortRows>{});
            return true;
        case 4:
            launch(RowsOf<4>{}, RowsOf<kShortRows>{});
            return true;
        default:
            break;
    }
    if constexpr (sizeof(T) == 4) {
        switch (row_layout<T>(C).per_lane) {
            case 8:
                launch(RowsOf<8>{}, RowsOf<1>{});
                return true;
            case 16:
                launch(RowsOf<16>{}, RowsOf<1>{});
                return true;
            case 24:
                launch(RowsOf<24>{}, RowsOf<1>{});
                return true;
            case 32:
                launch(RowsOf<32>{}, RowsOf<1>{});
                return true;
            default:
                break;
        }
    }
    return false;
}

// The forward grid: 4 warps a block, kRows rows a warp.
inline unsigned regs_row_blocks(int64_t rows, int kRows) {
    return blocks_for((rows + kRows - 1) / kRows, kWarpsPerBlock);
}

}  // namespace qk::cuda::norm_rows
