// CUDA layer_norm, rms_norm and lp_normalize, forward and backward with parameter gradients.
// Twin of ops/norm.cpp (cpu::layer_norm_*, cpu::rms_norm_*) and ops/lp_normalize.cpp
// (cpu::lp_normalize_*), whose headers derive the math and names the backward terms (direct, mean
// term, rstd term, norm term) that the comments below reuse. Every array is contiguous, x seen as
// (rows, C).
//
// Work split:
//   row kernels (forward, and dx in backward): one warp per row, kWarpsPerBlock = 4 rows per
//     128-thread block. Lane l reads the row's entries l, l + 32, ... (coalesced, any C: the loop
//     strides), the row statistics are warp shuffles (cuda/warp_reduce.h), no shared memory and
//     no __syncthreads. The row stays in L1/L2 between passes, so re-reading it is cheap. Rows of
//     at most 128 values (the per-head QK-norms) and float32 rows of at most 1,024 (the block
//     norms of a GPT-2-sized model) go to cuda/norm_rows.h's kernels instead: held in registers
//     (four short rows a warp, or one wide row), the same sums in the same order; their backward
//     also sums the parameter gradients on the way (below). These loops remain for wider rows
//     and float64.
//   parameter gradients (dweight = Σ_rows dy · xhat, dbias = Σ_rows dy): a deterministic two-stage
//     reduction over rows instead of float atomics (whose order, hence rounding, would change
//     from run to run). Stage 1: blocks of 32 columns × 8 row lanes (a warp reads 128
//     consecutive bytes of a row) over chunks of rows, as many chunks as make ~1,056 blocks (8
//     per SM of an H100) but none under 32 rows; each block writes its chunk's partial sums.
//     Stage 2: a block per 32 columns, its 8 warps each adding every 8th partial of a column, then
//     a fixed tree over the 8. Same bits under every run order, on the emulator and the GPU; the
//     chunk count depends on the shape only, never on the GPU. (Before: 32-row chunks, one thread
//     per column. A per-head QK-norm gain sees B·H·T rows of 64, 196,608 at the 124M shape:
//     stage 2 was one block walking 6,144 partials per column, 0.65 ms a call on an H200, and
//     stage 1's 64-thread blocks could not keep DRAM busy.) Rows held in registers skip both
//     stages: their dx kernel adds each lane's columns over the rows it visits (it holds dy and
//     x already), writes one partial per block and the last block adds them, as llm.c's
//     layernorm_backward does: one read of dy and x instead of two, and one launch.
//
// rms_norm forward keeps a kernel ladder: v1 is one thread per row, the cpu loop verbatim; v2 is
// one warp per row. v2 is faster for two reasons: v1 has only `rows` threads (a few thousand: too
// few to fill a GPU that wants ~100k in flight) and its threads walk rows C elements apart, so a
// warp's 32 loads touch 32 different cache lines; in v2 a warp's 32 loads are 32 neighbours in one
// row (one or two 128-byte transactions), and 32x more threads are in flight.
#include <algorithm>
#include <cstdint>

#include "core/storage.h"
#include "cuda/bf16_convert.h"
#include "cuda/norm_rows.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "ops/norm.h"

namespace qk::cuda {

namespace {

using namespace norm_rows;

constexpr int64_t kMinRowsPerChunk = 32;  // parameter gradients: rows of one chunk, at least

// The tables' elements a rotation reads (cos and sin, positions × C/2 each: from DRAM once, then
// from cache), and its arithmetic per value.
template <class T>
int64_t rotation_reads(const RowRotation<T>& rotation, int64_t C) {
    return rotation.cos ? rotation.positions * C : 0;
}
template <class T>
int64_t rotation_flops(const RowRotation<T>& rotation, int64_t rows, int64_t C) {
    return rotation.cos ? 3 * rows * C : 0;
}

// Only the kernels of rows in registers rotate, and only rows whose pairs sit in one lane
// (norm_rotates): the op rotates other rows itself.
template <class T>
void check_rotation(const RowRotation<T>& rotation, int64_t C) {
    QK_CHECK(!rotation.cos || (norm_rotates(C) && rotation.sin && rotation.positions > 0),
             "cuda norm: a rotation needs rows of 64 or 128 values, cos, sin and positions > 0; "
             "got C = {}, positions {}",
             C, rotation.positions);
}

// ---- layer_norm --------------------------------------------------------------------------

// y: (rows, C) out; mean, rstd: (rows) out; x: rows of C where xs says; weight: (C); bias: (C) or
// null.
template <class T>
__global__ void layer_norm_forward_kernel(T* y, T* mean, T* rstd, const T* x, NormRows xs,
                                          const T* weight, const T* bias, int64_t rows, int64_t C,
                                          T eps, uint16_t* y_half, bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T* xr = x + xs.offset(r);
    T sum = 0;
    for (int64_t c = lane; c < C; c += kWarp) sum += xr[c];
    const T m = warp_sum(sum) / T(C);
    // Second pass, Σ(x − mean)²: no cancellation against mean² (see ops/norm.cpp).
    T sq = 0;
    for (int64_t c = lane; c < C; c += kWarp) sq += (xr[c] - m) * (xr[c] - m);
    const T s = T(1) / dev_sqrt(warp_sum(sq) / T(C) + eps);
    T* yr = y + r * C;
    for (int64_t c = lane; c < C; c += kWarp) {
        const T value = (xr[c] - m) * s * weight[c] + (bias ? bias[c] : T(0));
        yr[c] = value;
        store_half(y_half, r * C + c, value, half_is_bf16);
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = s;
    }
}

// dx: (rows, C) out; dy: (rows, C); x: rows of C where xs says; mean, rstd: (rows); weight: (C).
// add_into_dx: dx += the gradient (ops/norm.h).
template <class T>
__global__ void layer_norm_backward_dx_kernel(T* dx, const T* dy, const T* x, NormRows xs,
                                              const T* mean, const T* rstd, const T* weight,
                                              int64_t rows, int64_t C, bool add_into_dx) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T *xr = x + xs.offset(r), *dyr = dy + r * C;
    const T m = mean[r], s = rstd[r];
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t c = lane; c < C; c += kWarp) {
        const T xhat = (xr[c] - m) * s, dxhat = dyr[c] * weight[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
    }
    const T mean_dxhat = warp_sum(sum_dxhat) / T(C);
    const T mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / T(C);
    T* dxr = dx + r * C;
    for (int64_t c = lane; c < C; c += kWarp) {
        const T xhat = (xr[c] - m) * s, dxhat = dyr[c] * weight[c];
        //                     direct   mean term     rstd term
        const T value = s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        dxr[c] = add_into_dx ? dev_add_unfused(dxr[c], value) : value;
    }
}

// ---- parameter gradients, shared by layer_norm (mean given) and rms_norm (mean null) ---------

// Both stages in one launch. dweight, dbias: (C) out (dbias may be null); partial_dw, partial_db:
// (chunks, C) scratch; counters: one per tile (arrived_last); dy, x: (rows, C); mean: (rows) or
// null for rms_norm; rstd: (rows). grid (ceil(C / 32), chunks), block (32, 8): lane (x, y) of
// block (bx, k) sums rows y, y + 8, ... of chunk k for column 32·bx + x, so a warp reads 128
// consecutive bytes of a row; row 0 of lanes then adds the 8 sums in lane order. The tile's last
// block to finish adds its chunks' partials in chunk order.
template <class T>
__global__ void norm_param_grads_kernel(T* dweight, T* dbias, T* partial_dw, T* partial_db,
                                        unsigned* counters, const T* dy, const T* x, NormRows xs,
                                        const T* mean, const T* rstd, int64_t rows, int64_t C,
                                        int64_t per_chunk) {
    const int64_t c = int64_t(blockIdx.x) * kWarp + threadIdx.x;
    const int64_t r0 = int64_t(blockIdx.y) * per_chunk;
    const int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
    struct Loaded {
        T dy, x, mean, rstd;
    };
    T dw = 0, db = 0;
    if (c < C)
        walk_rows(
            r0 + threadIdx.y, r1, kLaneRows,
            [&](int64_t r) {
                return Loaded{dy[r * C + c], x[xs.offset(r) + c], mean ? mean[r] : T(0), rstd[r]};
            },
            [&](int64_t, Loaded v) {
                const T xhat = (v.x - v.mean) * v.rstd;
                dw += v.dy * xhat;  // dweight = Σ_rows dy · xhat
                db += v.dy;         // dbias = Σ_rows dy
            });
    const auto add = [](T a, T b) { return a + b; };
    dw = combine_lane_rows(dw, add);
    db = combine_lane_rows(db, add);
    if (threadIdx.y == 0 && c < C) {
        partial_dw[int64_t(blockIdx.y) * C + c] = dw;
        if (partial_db) partial_db[int64_t(blockIdx.y) * C + c] = db;
    }
    if (!arrived_last(counters)) return;
    dw = combine_chunks(partial_dw, gridDim.y, C, add, T(0));
    if (dbias) db = combine_chunks(partial_db, gridDim.y, C, add, T(0));
    if (threadIdx.y != 0 || c >= C) return;
    dweight[c] = dw;
    if (dbias) dbias[c] = db;
}

// dweight (and dbias if not null): (C) out, by the kernel above.
template <class T>
void norm_param_grads(T* dweight, T* dbias, const T* dy, const T* x, const NormRows& xs,
                      const T* mean, const T* rstd, int64_t rows, int64_t C) {
    if (rows == 0) {  // no rows: the sums are empty
        fill_zero(dweight, sizeof(T) * size_t(C));
        if (dbias) fill_zero(dbias, sizeof(T) * size_t(C));
        return;
    }
    const int64_t tiles = (C + kWarp - 1) / kWarp;
    const auto [per_chunk, chunks] = pieces_for(rows, tiles, kMinRowsPerChunk);
    // Scratch from the caching allocator; freed at return, safe as the stream orders its reuse.
    Storage scratch(sizeof(T) * size_t(chunks * C) * (dbias ? 2 : 1), Device::cuda);
    T* partial_dw = static_cast<T*>(scratch.data());
    T* partial_db = dbias ? partial_dw + chunks * C : nullptr;
    const int64_t outputs = dbias ? 2 : 1;  // partials written and read back, then the gradients
    ledger::declare_elements<T>(2 * rows * C + 2 * rows + outputs * chunks * C,
                                outputs * (chunks * C + C), 5 * rows * C);
    QK_LAUNCH((norm_param_grads_kernel<T>), dim3(unsigned(tiles), unsigned(chunks)),
              dim3(kWarp, kLaneRows), 0, stream(), dweight, dbias, partial_dw, partial_db,
              tile_counters(tiles), dy, x, xs, mean, rstd, rows, C, per_chunk);
    QK_CUDA_CHECK_LAUNCH("norm_param_grads_kernel");
}

// Chunks of the wide rows' backward: kFillBlocks / 4 of them where the rows allow (rows per chunk
// rounded down, so that the count does not fall below it).
Pieces wide_row_chunks(int64_t rows) {
    const int64_t size = std::max<int64_t>(kBackwardWarps, rows / (kFillBlocks / 4));
    return {size, (rows + size - 1) / size};
}

// The backward of rows held in registers (cuda/norm_rows.h): dx, and dweight (dbias) when given, in
// one launch. mean: null for rms_norm; dweight: null for an rms_norm without weight (dx only).
template <class T, bool kLayerNorm>
void norm_backward_regs(T* dx, T* dweight, T* dbias, const T* dy, const T* x, const NormRows& xs,
                        const T* mean, const T* rstd, const T* weight, int64_t rows, int64_t C,
                        const RowRotation<T>& rotation, bool add_into_dx) {
    // Short rows: chunks for half of kFillBlocks (blocks of 256 threads, four per SM of an H100,
    // each lane 16 or 32 loads in flight), none under one group of rows per warp. Wide rows: two
    // chunks per SM of an H100, at least (each lane 16-64 loads in flight; the last block then adds
    // ~264 partials per column, ~800 loads a thread from L2, where 528 would double that tail),
    // none under a row per warp.
    const RowLayout layout = row_layout<T>(C);
    const auto [per_chunk, chunks] =
        layout.rows == 1 ? wide_row_chunks(rows)
                         : pieces_for(rows, 2, int64_t(kBackwardWarps) * layout.rows);
    const int64_t outputs = dweight ? (dbias ? 2 : 1) : 0;
    Storage scratch(sizeof(T) * size_t(std::max<int64_t>(1, outputs * chunks * C)), Device::cuda);
    T* partial_dw = outputs ? static_cast<T*>(scratch.data()) : nullptr;
    T* partial_db = outputs == 2 ? partial_dw + chunks * C : nullptr;
    ledger::declare_elements<T>((add_into_dx ? 3 : 2) * rows * C + C + (kLayerNorm ? 2 : 1) * rows +
                                    outputs * chunks * C + rotation_reads(rotation, C),
                                rows * C + outputs * (chunks * C + C),
                                15 * rows * C + rotation_flops(rotation, rows, C));
    const dim3 grid(1, unsigned(chunks));
    // Two launch sites for one kernel so that the ledger names short rows (the QK-norms) and wide
    // ones (the block norms) apart: it groups launches by the kernel as written here.
    with_row_layout<T>(C, [&]<int kPerLane, int kRows>(RowsOf<kPerLane>, RowsOf<kRows>) {
        if constexpr (kRows == kShortRows)
            QK_LAUNCH((norm_backward_regs_kernel<T, kPerLane, kShortRows, kLayerNorm>), grid,
                      kBackwardThreads, 0, stream(), dx, dweight, dbias, partial_dw, partial_db,
                      tile_counters(1), dy, x, xs, mean, rstd, weight, rows, C, per_chunk, rotation,
                      add_into_dx);
        else
            QK_LAUNCH((norm_backward_regs_kernel<T, kPerLane, 1, kLayerNorm>), grid,
                      kBackwardThreads, 0, stream(), dx, dweight, dbias, partial_dw, partial_db,
                      tile_counters(1), dy, x, xs, mean, rstd, weight, rows, C, per_chunk, rotation,
                      add_into_dx);
    });
    QK_CUDA_CHECK_LAUNCH("norm_backward_regs_kernel");
}

// ---- rms_norm ------------------------------------------------------------------------------

// v1: one thread per row, the cpu loop. y: (rows, C) out; rstd: (rows) out; x: (rows, C);
// weight: (C) or null.
template <class T>
__global__ void rms_norm_forward_v1_kernel(T* y, T* rstd, const T* x, const T* weight, int64_t rows,
                                           int64_t C, T eps) {
    const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    T ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[r * C + c] * x[r * C + c];
    const T s = T(1) / dev_sqrt(ms / T(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * s * (weight ? weight[c] : T(1));
    rstd[r] = s;
}

// v2: one warp per row (see the header for why it is faster). Same arguments as v1.
template <class T>
__global__ void rms_norm_forward_kernel(T* y, T* rstd, const T* x, NormRows xs, const T* weight,
                                        int64_t rows, int64_t C, T eps, uint16_t* y_half,
                                        bool half_is_bf16) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T* xr = x + xs.offset(r);
    T ss = 0;
    for (int64_t c = lane; c < C; c += kWarp) ss += xr[c] * xr[c];
    const T s = T(1) / dev_sqrt(warp_sum(ss) / T(C) + eps);
    T* yr = y + r * C;
    for (int64_t c = lane; c < C; c += kWarp) {
        const T value = xr[c] * s * (weight ? weight[c] : T(1));
        yr[c] = value;
        store_half(y_half, r * C + c, value, half_is_bf16);
    }
    if (lane == 0) rstd[r] = s;
}

// dx: (rows, C) out; dy: (rows, C); x: rows of C where xs says; rstd: (rows); weight: (C) or null.
template <class T>
__global__ void rms_norm_backward_dx_kernel(T* dx, const T* dy, const T* x, NormRows xs,
                                            const T* rstd, const T* weight, int64_t rows, int64_t C,
                                            bool add_into_dx) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T *xr = x + xs.offset(r), *dyr = dy + r * C;
    const T s = rstd[r];
    T acc = 0;
    for (int64_t c = lane; c < C; c += kWarp)
        acc += dyr[c] * (weight ? weight[c] : T(1)) * (xr[c] * s);  // dxhat · xhat
    const T mean_dxhat_xhat = warp_sum(acc) / T(C);
    T* dxr = dx + r * C;
    for (int64_t c = lane; c < C; c += kWarp) {
        const T xhat = xr[c] * s, dxhat = dyr[c] * (weight ? weight[c] : T(1));
        const T value = s * (dxhat - xhat * mean_dxhat_xhat);  // direct − rstd term
        dxr[c] = add_into_dx ? dev_add_unfused(dxr[c], value) : value;
    }
}

// ---- lp_normalize --------------------------------------------------------------------------

// a^k for a small integer k > 0 by products (the cpu's int_pow, same rounding); k = 0: pow(a, p).
template <class T>
__device__ __forceinline__ T abs_pow(T a, T p, int k) {
    if (k == 0) return dev_pow(a, p);
    T r = a;
    for (int i = 1; i < k; ++i) r *= a;
    return r;
}

// p when it is an integer in 3..8 (the cpu's with_small_int_power), else 0.
template <class T>
__host__ __device__ __forceinline__ int small_int_power(T p) {
    for (int k = 3; k <= 8; ++k)
        if (p == T(k)) return k;
    return 0;
}

// y: (rows, C) out; norm: (rows) out, ‖x_r‖_p; x: (rows, C).
template <class T>
__global__ void lp_normalize_forward_kernel(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p,
                                            T eps) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T* xr = x + r * C;
    T n = 0;
    if (p == T(1)) {
        for (int64_t c = lane; c < C; c += kWarp) n += dev_abs(xr[c]);
        n = warp_sum(n);
    } else {
        // Scale by 1/max|x| first, so that |x|^p neither overflows nor underflows
        // (ops/lp_normalize.cpp).
        T m = 0;
        for (int64_t c = lane; c < C; c += kWarp) m = dev_abs(xr[c]) > m ? dev_abs(xr[c]) : m;
        m = warp_max(m);
        if (!(m > 0)) {
            n = m;  // an all-zero row
        } else {
            const T inv_m = T(1) / m;
            const int k = p == T(2) ? 2 : small_int_power(p);
            T sum = 0;
            for (int64_t c = lane; c < C; c += kWarp) sum += abs_pow(dev_abs(xr[c]) * inv_m, p, k);
            sum = warp_sum(sum);
            n = m * (k == 2 ? dev_sqrt(sum) : dev_pow(sum, T(1) / p));
        }
    }
    const T inv = T(1) / (n > eps ? n : eps);
    T* yr = y + r * C;
    for (int64_t c = lane; c < C; c += kWarp) yr[c] = xr[c] * inv;
    if (lane == 0) norm[r] = n;
}

// dx: (rows, C) out; dy, x: (rows, C); norm: (rows).
template <class T>
__global__ void lp_normalize_backward_kernel(T* dx, const T* dy, const T* x, const T* norm,
                                             int64_t rows, int64_t C, T p, T eps) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = warp_row(rows);
    if (r < 0) return;
    const T *xr = x + r * C, *dyr = dy + r * C;
    T* dxr = dx + r * C;
    const T n = norm[r], inv = T(1) / (n > eps ? n : eps);
    if (!(n > eps)) {  // clamped: y = x / eps, a constant denominator
        for (int64_t c = lane; c < C; c += kWarp) dxr[c] = dyr[c] * inv;
        return;
    }
    T acc = 0;  // Σ dy · y
    for (int64_t c = lane; c < C; c += kWarp) acc += dyr[c] * (xr[c] * inv);
    const T s = warp_sum(acc);
    const int k = small_int_power(p);
    for (int64_t c = lane; c < C; c += kWarp) {
        const T v = xr[c] * inv;  // y
        // g = ∂n/∂x: sign(y) at p = 1 (sign(0) = 0), y at p = 2, else sign(y) |y|^(p−1).
        T g;
        if (p == T(1))
            g = T((v > 0) - (v < 0));
        else if (p == T(2))
            g = v;
        else
            g = (v < 0 ? T(-1) : T(1)) * abs_pow(dev_abs(v), p - T(1), k > 0 ? k - 1 : 0);
        dxr[c] = (dyr[c] - s * g) * inv;  // direct − norm term
    }
}

}  // namespace

// ---- launchers (declared in ops/norm.h) ----------------------------------------------------

namespace {
// A RowAdd goes only where the rows are held in registers (the loops have no add).
template <class T>
void check_row_add(const RowAdd<T>& add, int64_t C) {
    QK_CHECK(!add.delta || (sizeof(T) == 4 && norm_adds_rows(C) && row_layout<T>(C).per_lane),
             "norm forward: the residual add runs only on float32 rows of at most 1,024 values "
             "held in registers, got rows of {} {}-byte values",
             C, sizeof(T));
}
}  // namespace

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const NormRows& x_rows, const T* weight,
                        const T* bias, int64_t rows, int64_t C, T eps, uint16_t* y_half,
                        bool half_is_bf16, const RowRotation<T>& rotation, const RowAdd<T>& add) {
    check_rotation(rotation, C);
    check_row_add(add, C);
    if (rows == 0) return;
    ledger::declare(
        double(sizeof(T)) * double(2 * rows * C + 2 * C + 2 * rows + rotation_reads(rotation, C) +
                                   (add.delta ? 2 * rows * C : 0)) +
            (y_half ? 2.0 * double(rows * C) : 0.0),
        double(8 * rows * C + rotation_flops(rotation, rows, C)), 0, sizeof(T) == 8);
    const bool held =
        with_row_layout<T>(C, [&]<int kPerLane, int kRows>(RowsOf<kPerLane>, RowsOf<kRows>) {
            if constexpr (kRows == kShortRows)
                QK_LAUNCH((layer_norm_forward_regs_kernel<T, kPerLane, kShortRows>),
                          regs_row_blocks(rows, kRows), kRowThreads, 0, stream(), y, mean, rstd, x,
                          x_rows, weight, bias, rows, C, eps, y_half, half_is_bf16, rotation, add);
            else
                QK_LAUNCH((layer_norm_forward_regs_kernel<T, kPerLane, 1>),
                          regs_row_blocks(rows, kRows), kRowThreads, 0, stream(), y, mean, rstd, x,
                          x_rows, weight, bias, rows, C, eps, y_half, half_is_bf16, rotation, add);
        });
    if (!held)
        QK_LAUNCH((layer_norm_forward_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads, 0,
                  stream(), y, mean, rstd, x, x_rows, weight, bias, rows, C, eps, y_half,
                  half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("layer_norm_forward_kernel");
}

template <class T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dy, const T* x,
                         const NormRows& x_rows, const T* mean, const T* rstd, const T* weight,
                         int64_t rows, int64_t C, const RowRotation<T>& rotation,
                         bool add_into_dx) {
    check_rotation(rotation, C);
    if (rows > 0 && row_layout<T>(C).per_lane) {
        norm_backward_regs<T, true>(dx, dweight, dbias, dy, x, x_rows, mean, rstd, weight, rows, C,
                                    rotation, add_into_dx);
        return;
    }
    if (rows > 0) {
        ledger::declare_elements<T>((add_into_dx ? 3 : 2) * rows * C + C + 2 * rows, rows * C,
                                    12 * rows * C);
        QK_LAUNCH((layer_norm_backward_dx_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads,
                  0, stream(), dx, dy, x, x_rows, mean, rstd, weight, rows, C, add_into_dx);
        QK_CUDA_CHECK_LAUNCH("layer_norm_backward_dx_kernel");
    }
    norm_param_grads(dweight, dbias, dy, x, x_rows, mean, rstd, rows, C);
}

template <class T>
void rms_norm_forward_v1(T* y, T* rstd, const T* x, const T* weight, int64_t rows, int64_t C,
                         T eps) {
    if (rows == 0) return;
    ledger::declare_elements<T>(rows * C + C, rows * C + rows, 4 * rows * C);
    QK_LAUNCH((rms_norm_forward_v1_kernel<T>), blocks_for(rows, kRowThreads), kRowThreads, 0,
              stream(), y, rstd, x, weight, rows, C, eps);
    QK_CUDA_CHECK_LAUNCH("rms_norm_forward_v1_kernel");
}

template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const NormRows& x_rows, const T* weight,
                      int64_t rows, int64_t C, T eps, uint16_t* y_half, bool half_is_bf16,
                      const RowRotation<T>& rotation, const RowAdd<T>& add) {
    check_rotation(rotation, C);
    check_row_add(add, C);
    if (rows == 0) return;
    ledger::declare(
        double(sizeof(T)) * double(2 * rows * C + C + rows + rotation_reads(rotation, C) +
                                   (add.delta ? 2 * rows * C : 0)) +
            (y_half ? 2.0 * double(rows * C) : 0.0),
        double(4 * rows * C + rotation_flops(rotation, rows, C)), 0, sizeof(T) == 8);
    const bool held =
        with_row_layout<T>(C, [&]<int kPerLane, int kRows>(RowsOf<kPerLane>, RowsOf<kRows>) {
            if constexpr (kRows == kShortRows)
                QK_LAUNCH((rms_norm_forward_regs_kernel<T, kPerLane, kShortRows>),
                          regs_row_blocks(rows, kRows), kRowThreads, 0, stream(), y, rstd, x,
                          x_rows, weight, rows, C, eps, y_half, half_is_bf16, rotation, add);
            else
                QK_LAUNCH((rms_norm_forward_regs_kernel<T, kPerLane, 1>),
                          regs_row_blocks(rows, kRows), kRowThreads, 0, stream(), y, rstd, x,
                          x_rows, weight, rows, C, eps, y_half, half_is_bf16, rotation, add);
        });
    if (!held)
        QK_LAUNCH((rms_norm_forward_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads, 0,
                  stream(), y, rstd, x, x_rows, weight, rows, C, eps, y_half, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("rms_norm_forward_kernel");
}

template <class T>
void rms_norm_backward(T* dx, T* dweight, const T* dy, const T* x, const NormRows& x_rows,
                       const T* rstd, const T* weight, int64_t rows, int64_t C,
                       const RowRotation<T>& rotation, bool add_into_dx) {
    check_rotation(rotation, C);
    if (rows > 0 && row_layout<T>(C).per_lane) {
        norm_backward_regs<T, false>(dx, dweight, static_cast<T*>(nullptr), dy, x, x_rows,
                                     static_cast<const T*>(nullptr), rstd, weight, rows, C,
                                     rotation, add_into_dx);
        return;
    }
    if (rows > 0) {
        ledger::declare_elements<T>((add_into_dx ? 3 : 2) * rows * C + C + rows, rows * C,
                                    8 * rows * C);
        QK_LAUNCH((rms_norm_backward_dx_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads,
                  0, stream(), dx, dy, x, x_rows, rstd, weight, rows, C, add_into_dx);
        QK_CUDA_CHECK_LAUNCH("rms_norm_backward_dx_kernel");
    }
    if (dweight)
        norm_param_grads(dweight, static_cast<T*>(nullptr), dy, x, x_rows,
                         static_cast<const T*>(nullptr), rstd, rows, C);
}

template <class T>
void lp_normalize_forward(T* y, T* norm, const T* x, int64_t rows, int64_t C, T p, T eps) {
    if (rows == 0) return;
    ledger::declare_elements<T>(rows * C, rows * C + rows, 20 * rows * C);
    QK_LAUNCH((lp_normalize_forward_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads, 0,
              stream(), y, norm, x, rows, C, p, eps);
    QK_CUDA_CHECK_LAUNCH("lp_normalize_forward_kernel");
}

template <class T>
void lp_normalize_backward(T* dx, const T* dy, const T* x, const T* norm, int64_t rows, int64_t C,
                           T p, T eps) {
    if (rows == 0) return;
    ledger::declare_elements<T>(2 * rows * C + rows, rows * C, 20 * rows * C);
    QK_LAUNCH((lp_normalize_backward_kernel<T>), blocks_for(rows, kWarpsPerBlock), kRowThreads, 0,
              stream(), dx, dy, x, norm, rows, C, p, eps);
    QK_CUDA_CHECK_LAUNCH("lp_normalize_backward_kernel");
}

// Every launcher for float and double.
#define QK_CUDA_NORM_INSTANTIATE(launcher)              \
    template decltype(launcher<float>) launcher<float>; \
    template decltype(launcher<double>) launcher<double>;
QK_CUDA_NORM_INSTANTIATE(layer_norm_forward)
QK_CUDA_NORM_INSTANTIATE(layer_norm_backward)
QK_CUDA_NORM_INSTANTIATE(rms_norm_forward_v1)
QK_CUDA_NORM_INSTANTIATE(rms_norm_forward)
QK_CUDA_NORM_INSTANTIATE(rms_norm_backward)
QK_CUDA_NORM_INSTANTIATE(lp_normalize_forward)
QK_CUDA_NORM_INSTANTIATE(lp_normalize_backward)
#undef QK_CUDA_NORM_INSTANTIATE

}  // namespace qk::cuda
