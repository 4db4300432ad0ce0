// The row kernels' layout (cuda/norm.cu) and their short-row versions for the per-head norms:
// included by cuda/norm.cu only.
//
// Row kernels (forward, and dx in backward) give a warp one row, kWarpsPerBlock = 4 rows per
// 128-thread block. Rows of at most 128 values (the QK-norms over a head of D = 64 or 128) take
// the kernels below, kRows rows a warp.
#pragma once

#include <cstdint>

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

// ---- short rows: the per-head norms (C = D <= 128) --------------------------------------------
//
// A warp per row of 64 values gives each lane two loads and then two five-shuffle sums: on an
// H200 the per-head QK-norms ran at a third of the memory's speed (114 µs a call where their bytes
// take 44), each small block's dependent chain waiting on DRAM, wave after wave. Here a warp takes
// kRows rows at once and every lane loads its kPerLane values of all of them before the first sum,
// kRows·kPerLane loads in flight. Each row's sums and outputs are cuda/norm.cu's one-row kernels',
// term for term and in the same order (values past C are never added): the same bits but where the
// compiler fuses a multiply and an add differently (measured in the emulator: rms_norm's dx at
// C = 100 and 128 differs in the last bit, every other output is identical).

// The kRows rows from `first` (those below `rows`): lane l's values l, l + 32, ... of each, 0 past
// C.
template <class T, int kPerLane, int kRows, class RowStart>
__device__ __forceinline__ void load_short_rows(T (&v)[kRows][kPerLane], const RowStart& row_start,
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

// write(row, r, i, c) for each of this lane's values (i: column c = lane + 32·i < C) of the group's
// rows r that exist (row = first + r < rows): the kernels' output pass.
template <int kRows, int kPerLane, class Write>
__device__ __forceinline__ void each_short_value(int64_t first, int64_t rows, int64_t C,
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

// The warp's row group (kRows rows from the returned first), or -1 past the end.
template <int kRows>
__device__ __forceinline__ int64_t warp_row_group(int64_t rows) {
    const int64_t group = warp_row((rows + kRows - 1) / kRows);
    return group < 0 ? -1 : group * kRows;
}

// cuda/norm.cu's layer_norm_forward_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void layer_norm_forward_short_kernel(T* y, T* mean, T* rstd, const T* x, NormRows xs,
                                                const T* weight, const T* bias, int64_t rows,
                                                int64_t C, T eps, uint16_t* y_half,
                                                bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T v[kRows][kPerLane], m[kRows], s[kRows];
    load_short_rows(
        v, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
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
    each_short_value<kRows, kPerLane>(first, rows, C, [&](int64_t row, int r, int i, int c) {
        const T value = (v[r][i] - m[r]) * s[r] * weight[c] + (bias ? bias[c] : T(0));
        y[row * C + c] = value;
        store_half(y_half, row * C + c, value, half_is_bf16);
    });
    QK_UNROLL
    for (int r = 0; r < kRows; ++r)
        if (lane == 0 && first + r < rows) {
            mean[first + r] = m[r];
            rstd[first + r] = s[r];
        }
}

// cuda/norm.cu's layer_norm_backward_dx_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void layer_norm_backward_dx_short_kernel(T* dx, const T* dy, const T* x, NormRows xs,
                                                    const T* mean, const T* rstd, const T* weight,
                                                    int64_t rows, int64_t C) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T xv[kRows][kPerLane], dyv[kRows][kPerLane], m[kRows], s[kRows], mean_dxhat[kRows],
        mean_dxhat_xhat[kRows];
    load_short_rows(
        xv, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
    load_short_rows(
        dyv, [&](int64_t r) { return dy + r * C; }, first, rows, C);
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        const int64_t row = first + r < rows ? first + r : first;  // past the end: any row's
        m[r] = mean[row];
        s[r] = rstd[row];
        T sum_dxhat = 0, sum_dxhat_xhat = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + kWarp * i;
            if (c >= C) break;
            const T xhat = (xv[r][i] - m[r]) * s[r], dxhat = dyv[r][i] * weight[c];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * xhat;
        }
        mean_dxhat[r] = warp_sum(sum_dxhat) / T(C);
        mean_dxhat_xhat[r] = warp_sum(sum_dxhat_xhat) / T(C);
    }
    each_short_value<kRows, kPerLane>(first, rows, C, [&](int64_t row, int r, int i, int c) {
        const T xhat = (xv[r][i] - m[r]) * s[r], dxhat = dyv[r][i] * weight[c];
        //                  direct   mean term        rstd term
        dx[row * C + c] = s[r] * (dxhat - mean_dxhat[r] - xhat * mean_dxhat_xhat[r]);
    });
}

// cuda/norm.cu's rms_norm_forward_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void rms_norm_forward_short_kernel(T* y, T* rstd, const T* x, NormRows xs,
                                              const T* weight, int64_t rows, int64_t C, T eps,
                                              uint16_t* y_half, bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T v[kRows][kPerLane], s[kRows];
    load_short_rows(
        v, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        T ss = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i)
            if (lane + kWarp * i < C) ss += v[r][i] * v[r][i];
        s[r] = T(1) / dev_sqrt(warp_sum(ss) / T(C) + eps);
    }
    each_short_value<kRows, kPerLane>(first, rows, C, [&](int64_t row, int r, int i, int c) {
        const T value = v[r][i] * s[r] * (weight ? weight[c] : T(1));
        y[row * C + c] = value;
        store_half(y_half, row * C + c, value, half_is_bf16);
    });
    QK_UNROLL
    for (int r = 0; r < kRows; ++r)
        if (lane == 0 && first + r < rows) rstd[first + r] = s[r];
}

// cuda/norm.cu's rms_norm_backward_dx_kernel, kRows rows a warp.
template <class T, int kPerLane, int kRows>
__global__ void rms_norm_backward_dx_short_kernel(T* dx, const T* dy, const T* x, NormRows xs,
                                                  const T* rstd, const T* weight, int64_t rows,
                                                  int64_t C) {
    const int lane = threadIdx.x % kWarp;
    const int64_t first = warp_row_group<kRows>(rows);
    if (first < 0) return;
    T xv[kRows][kPerLane], dyv[kRows][kPerLane], s[kRows], mean_dxhat_xhat[kRows];
    load_short_rows(
        xv, [&](int64_t r) { return x + xs.offset(r); }, first, rows, C);
    load_short_rows(
        dyv, [&](int64_t r) { return dy + r * C; }, first, rows, C);
    QK_UNROLL
    for (int r = 0; r < kRows; ++r) {
        s[r] = rstd[first + r < rows ? first + r : first];  // past the end: any row's
        T acc = 0;
        QK_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + kWarp * i;
            if (c >= C) break;
            acc += dyv[r][i] * (weight ? weight[c] : T(1)) * (xv[r][i] * s[r]);  // dxhat · xhat
        }
        mean_dxhat_xhat[r] = warp_sum(acc) / T(C);
    }
    each_short_value<kRows, kPerLane>(first, rows, C, [&](int64_t row, int r, int i, int c) {
        const T xhat = xv[r][i] * s[r], dxhat = dyv[r][i] * (weight ? weight[c] : T(1));
        dx[row * C + c] = s[r] * (dxhat - xhat * mean_dxhat_xhat[r]);  // direct − rstd term
    });
}

constexpr int kShortRows = 4;  // rows a warp: 8 or 16 loads in flight a lane

// kPerLane of the short-row kernels for rows of C values: 2 (C <= 64), 4 (C <= 128), or 0 (the
// one-row kernels); and their grid.
inline int short_row_values(int64_t C) { return C <= 2 * kWarp ? 2 : C <= 4 * kWarp ? 4 : 0; }
inline unsigned short_row_blocks(int64_t rows) {
    return blocks_for((rows + kShortRows - 1) / kShortRows, kWarpsPerBlock);
}

}  // namespace qk::cuda::norm_rows
