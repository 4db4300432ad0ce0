// cuda/reduce.cu — reductions over any set of dims on the device (sum, max, logsumexp) and the
// backward kernels of max and logsumexp. sum_to, hence the backward of every broadcasting op,
// runs through sum_reduce. Built as CUDA by nvcc, or as C++ against cuda/emu (cuda/runtime.h).
//
// Layout. x has any strides; the output is contiguous in the keepdim layout ("kept": size 1 on
// reduced dims). The host splits x's dims into the kept ones, which number the outputs r in
// row-major order (exactly the kept layout's linear index), and the reduced ones, which number
// the elements j of one group; two StridedIndex structs turn (r, j) into x's offset
// outer(r) + inner(j). Nothing is permuted or copied, whatever the dims and strides.
//
// Kernel ladder (docs/adding-an-op.md#kernel-ladders):
//   v1, one thread per output: a serial loop over the group, the CPU loop transposed onto
//       threads. Right when groups are small and outputs many (sum_to a (B, 1, C) bias from a
//       (B, 3, C) gradient): every thread is busy and no barrier is needed.
//   v2, one block per output (grid-stride over outputs past 65535): the block's threads stride
//       over the group, each keeping a partial; a warp combines its 32 partials with an xor
//       butterfly of __shfl_xor_sync (registers only, no shared memory, no barrier), lane 0 of
//       each warp writes its warp's result to shared memory, and after one __syncthreads every
//       warp reduces those (at most 32) values the same way, so every thread ends with the
//       result. Right for long groups (a row of logits), where v1 would leave one thread walking
//       thousands of elements while the rest of the GPU idles. Block size: the group rounded up
//       to a power of two, 32 to 256.
//   v3, columns (sum and max): when the outputs are contiguous in x and the reduced dims are not
//       (a bias gradient: the column sums of a (B·T, C) gradient), v2's block walks one column
//       with its threads 4·C bytes apart, so every 4-byte load costs a 32-byte DRAM sector (12 %
//       of the bandwidth used; 9 ms of a 124M-shaped step on an H200). v3's block takes 32
//       neighbouring columns × 8 row lanes, so a warp reads 128 consecutive bytes, and the rows
//       are cut into chunks so that the grid fills the GPU (~1,056 blocks, 8 per SM of an H100:
//       264 blocks of 256 threads measured 670 GB/s on an H200, too few loads in flight);
//       stage 2 combines each column's chunk partials in chunk order.
//   v4, split groups (sum and max): a few outputs with huge groups (a full sum of 12 M values
//       had one block of 256 threads: ~0.5 % of the chip) split each group into chunks, one
//       v2-style block per (output, chunk), and the same stage 2.
// The dispatcher takes v3 for contiguous outputs over strided groups, v4 for fewer than 264
// outputs with groups of 16k or more, else v2 for groups of 32 or more, else v1;
// set_reduce_version() forces one for tests (v3 and v4 apply to sum and max; logsumexp and the
// backward kernels keep the automatic choice). The number of chunks depends on the shape only.
// Sums are fixed trees (the order does not depend on which thread runs first), so the emulator's
// run orders give identical bits; the rungs differ from each other and from the CPU in rounding.
//
// CPU twins: cpu::sum_accumulate, cpu::max_accumulate, cpu::sum_exp_accumulate (with the lse
// finish in logsumexp_into_shape), cpu::max_count_ties + cpu::max_backward and
// cpu::logsumexp_backward, all in ops/reduce.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/storage.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "cuda/warp_reduce.h"
#include "ops/elementwise_math.h"
#include "ops/reduce.h"

namespace qk::cuda {

namespace {

int forced_version = 0;  // 0: choose by group size

struct SumOp {
    template <class T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a + b;
    }
    template <class T>
    __device__ __forceinline__ static T identity() {
        return T(0);
    }
};

// max that lets a NaN in and never lets it out again, as cpu::max_nan.
struct MaxOp {
    template <class T>
    __device__ __forceinline__ T operator()(T acc, T v) const {
        return (v > acc || v != v) ? v : acc;
    }
    template <class T>
    __device__ __forceinline__ static T identity() {
        return -std::numeric_limits<T>::infinity();
    }
};

// The shift logsumexp subtracts: the group max, or 0 where it is ±inf or NaN (m − m is 0 exactly
// when m is finite), as cpu::lse_shift.
template <class T>
__device__ __forceinline__ T lse_shift(T m) {
    return m - m == T(0) ? m : T(0);
}

// v combined over the 32 lanes of the warp; every lane gets the result.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// v combined over the block (blockDim.x a multiple of 32); every thread gets the result.
// The first barrier keeps a previous call's readers of `partial` from seeing this call's writes.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op) {
    __shared__ T partial[32];
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : Op::template identity<T>();
    return warp_reduce(v, op);
}

// What every kernel gets: outputs numbered by outer, group elements by inner; operand 0 is x,
// operand 1 is dx (contiguous in x's shape; used by the backward kernels only).
struct Groups {
    StridedIndex<2> outer, inner;
    int64_t n_out = 1, group = 1;
};

Groups make_groups(const Shape& shape, const Shape& x_strides, const Shape& kept, const char* op) {
    const Shape dx_strides = contiguous_strides(shape);
    Shape outer_shape, inner_shape, outer_x, outer_dx, inner_x, inner_dx;
    for (size_t d = 0; d < shape.size(); ++d) {
        const bool reduced = kept[d] == 1 && shape[d] != 1;
        (reduced ? inner_shape : outer_shape).push_back(shape[d]);
        (reduced ? inner_x : outer_x).push_back(x_strides[d]);
        (reduced ? inner_dx : outer_dx).push_back(dx_strides[d]);
    }
    Groups g;
    g.outer = make_strided_index<2>(outer_shape, {&outer_x, &outer_dx}, op);
    g.inner = make_strided_index<2>(inner_shape, {&inner_x, &inner_dx}, op);
    g.n_out = numel_of(outer_shape);
    g.group = numel_of(inner_shape);
    return g;
}

// ---- v1: one thread per output ----------------------------------------------------------------

// out: (n_out) contiguous (kept layout); x through g.    out[r] = op over group r of x
template <class T, class Op>
__global__ void reduce_v1_kernel(T* out, const T* x, Groups g) {
    const Op op{};
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < g.n_out;
         r += step) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T acc = Op::template identity<T>();
        for (int64_t j = 0; j < g.group; ++j) {
            g.inner.offsets(j, off);
            acc = op(acc, x[base[0] + off[0]]);
        }
        out[r] = acc;
    }
}

// lse: (n_out) contiguous.    lse[r] = shift + log Σ_j exp(x[j] − shift), shift from the max
template <class T>
__global__ void logsumexp_v1_kernel(T* lse, const T* x, Groups g) {
    const MaxOp max_op{};
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < g.n_out;
         r += step) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T m = MaxOp::identity<T>();
        for (int64_t j = 0; j < g.group; ++j) {
            g.inner.offsets(j, off);
            m = max_op(m, x[base[0] + off[0]]);
        }
        const T shift = lse_shift(m);
        T s = 0;
        for (int64_t j = 0; j < g.group; ++j) {
            g.inner.offsets(j, off);
            s += math::exp_fast(x[base[0] + off[0]] - shift);
        }
        lse[r] = shift + std::log(s);
    }
}

// dx: x's shape, contiguous; y, dy: (n_out).    dx[j] = [x[j] == y[r]] · dy[r] / #ties(r)
template <class T>
__global__ void max_backward_v1_kernel(T* dx, const T* x, const T* y, const T* dy, Groups g) {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < g.n_out;
         r += step) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T count = 0;
        for (int64_t j = 0; j < g.group; ++j) {
            g.inner.offsets(j, off);
            count += x[base[0] + off[0]] == y[r] ? T(1) : T(0);
        }
        for (int64_t j = 0; j < g.group; ++j) {
            g.inner.offsets(j, off);
            dx[base[1] + off[1]] = x[base[0] + off[0]] == y[r] ? dy[r] / count : T(0);
        }
    }
}

// ---- v2: one block per output -----------------------------------------------------------------

template <class T, class Op>
__global__ void reduce_v2_kernel(T* out, const T* x, Groups g) {
    const Op op{};
    for (int64_t r = blockIdx.x; r < g.n_out; r += gridDim.x) {  // uniform over the block
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T acc = Op::template identity<T>();
        for (int64_t j = threadIdx.x; j < g.group; j += blockDim.x) {
            g.inner.offsets(j, off);
            acc = op(acc, x[base[0] + off[0]]);
        }
        acc = block_reduce(acc, op);
        if (threadIdx.x == 0) out[r] = acc;
    }
}

template <class T>
__global__ void logsumexp_v2_kernel(T* lse, const T* x, Groups g) {
    for (int64_t r = blockIdx.x; r < g.n_out; r += gridDim.x) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T m = MaxOp::identity<T>();
        for (int64_t j = threadIdx.x; j < g.group; j += blockDim.x) {
            g.inner.offsets(j, off);
            m = MaxOp{}(m, x[base[0] + off[0]]);
        }
        const T shift = lse_shift(block_reduce(m, MaxOp{}));
        T s = 0;
        for (int64_t j = threadIdx.x; j < g.group; j += blockDim.x) {
            g.inner.offsets(j, off);
            s += math::exp_fast(x[base[0] + off[0]] - shift);
        }
        s = block_reduce(s, SumOp{});
        if (threadIdx.x == 0) lse[r] = shift + std::log(s);
    }
}

template <class T>
__global__ void max_backward_v2_kernel(T* dx, const T* x, const T* y, const T* dy, Groups g) {
    for (int64_t r = blockIdx.x; r < g.n_out; r += gridDim.x) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        T count = 0;
        for (int64_t j = threadIdx.x; j < g.group; j += blockDim.x) {
            g.inner.offsets(j, off);
            count += x[base[0] + off[0]] == y[r] ? T(1) : T(0);
        }
        count = block_reduce(count, SumOp{});
        for (int64_t j = threadIdx.x; j < g.group; j += blockDim.x) {
            g.inner.offsets(j, off);
            dx[base[1] + off[1]] = x[base[0] + off[0]] == y[r] ? dy[r] / count : T(0);
        }
    }
}

// ---- elementwise backward ---------------------------------------------------------------------

// dx: contiguous; x, lse/dy through index (x's offset, then the kept one: stride 0 on reduced
// dims); one thread per element.    dx[i] = dy[r] · exp(x[i] − lse[r])  (0 where lse = −inf)
template <class T>
__global__ void logsumexp_backward_kernel(T* dx, const T* x, const T* lse, const T* dy,
                                          StridedIndex<2> index, int64_t n) {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += step) {
        int64_t off[2];
        index.offsets(i, off);
        const T l = lse[off[1]];
        dx[i] = l == -std::numeric_limits<T>::infinity()
                    ? T(0)
                    : dy[off[1]] * math::exp_fast(x[off[0]] - l);
    }
}

// ---- v3 (columns) and v4 (split groups): a stage 1 into partials, then one combine -----------

constexpr int64_t kMinChunk = 64;         // v3: rows per chunk, at least
constexpr int64_t kMinSplitChunk = 4096;  // v4: elements per chunk, at least

// v3, both stages in one launch. out: (n_out); partial: (chunks, n_out) scratch; counters: one
// per tile (arrived_last). grid (ceil(n_out / 32), chunks), block (32, 8): lane (x, y) of block
// (bx, c) reduces elements y, y + 8, ... of chunk c of output 32·bx + x; the tile's last block
// to finish then combines its chunks in order, as reduce_partials_kernel would.
template <class T, class Op>
__global__ void reduce_columns_kernel(T* out, T* partial, unsigned* counters, const T* x, Groups g,
                                      int64_t per_chunk) {
    const Op op{};
    const int64_t r = int64_t(blockIdx.x) * 32 + threadIdx.x;
    const int64_t j0 = int64_t(blockIdx.y) * per_chunk;
    const int64_t j1 = j0 + per_chunk < g.group ? j0 + per_chunk : g.group;
    T acc = Op::template identity<T>();
    if (r < g.n_out) {
        int64_t base[2], off[2];
        g.outer.offsets(r, base);
        walk_rows(
            j0 + threadIdx.y, j1, kLaneRows,
            [&](int64_t j) {
                g.inner.offsets(j, off);
                return x[base[0] + off[0]];
            },
            [&](int64_t, T value) { acc = op(acc, value); });
    }
    acc = combine_lane_rows(acc, op);
    if (threadIdx.y == 0 && r < g.n_out) partial[int64_t(blockIdx.y) * g.n_out + r] = acc;
    if (!arrived_last(counters)) return;
    acc = combine_chunks(partial, gridDim.y, g.n_out, op, Op::template identity<T>());
    if (threadIdx.y == 0 && r < g.n_out) out[r] = acc;
}

// Stage 1 of v4. partial: (chunks, n_out). grid (n_out, chunks), block (v2's size): block (r, c)
// reduces chunk c of output r as v2 reduces a whole group.
template <class T, class Op>
__global__ void reduce_split_kernel(T* partial, const T* x, Groups g, int64_t per_chunk) {
    const Op op{};
    const int64_t r = blockIdx.x, j0 = int64_t(blockIdx.y) * per_chunk;
    const int64_t j1 = j0 + per_chunk < g.group ? j0 + per_chunk : g.group;
    int64_t base[2], off[2];
    g.outer.offsets(r, base);
    T acc = Op::template identity<T>();
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        g.inner.offsets(j, off);
        acc = op(acc, x[base[0] + off[0]]);
    }
    acc = block_reduce(acc, op);
    if (threadIdx.x == 0) partial[int64_t(blockIdx.y) * g.n_out + r] = acc;
}

// Stage 2 of v4. out: (n_out); partial: (chunks, n_out). grid (ceil(n_out / 32)),
// block (32, 8): lane (x, y) combines chunks y, y + 8, ... of output 32·bx + x, then row 0 the 8.
template <class T, class Op>
__global__ void reduce_partials_kernel(T* out, const T* partial, int64_t chunks, int64_t n_out) {
    const Op op{};
    const int64_t r = int64_t(blockIdx.x) * 32 + threadIdx.x;
    T acc = Op::template identity<T>();
    if (r < n_out)
        for (int64_t c = threadIdx.y; c < chunks; c += kLaneRows)
            acc = op(acc, partial[c * n_out + r]);
    acc = combine_lane_rows(acc, op);
    if (threadIdx.y == 0 && r < n_out) out[r] = acc;
}

// Whether the outputs sit next to each other in x while a group's elements do not: v3's case.
bool columns_layout(const Groups& g) {
    const int inner_last = g.inner.rank - 1, outer_last = g.outer.rank - 1;
    return g.n_out >= 32 && g.group >= kMinChunk && outer_last >= 0 && inner_last >= 0 &&
           g.outer.strides[0][outer_last] == 1 && g.inner.strides[0][inner_last] != 1;
}
bool few_huge_groups(const Groups& g) {
    return g.n_out < kFillBlocks && g.group >= 4 * kMinSplitChunk;
}

unsigned v2_threads(const Groups& g);

// v3 (`columns`: one launch, its last blocks finishing) or v4 (stage 1 into scratch partials,
// then stage 2 into out).
template <class T, class Op>
void reduce_in_chunks(T* out, const T* x, const Groups& g, bool columns) {
    const int64_t tiles = columns ? (g.n_out + 31) / 32 : g.n_out;
    const auto [per_chunk, chunks] =
        pieces_for(g.group, tiles, columns ? kMinChunk : kMinSplitChunk);
    QK_CHECK(tiles <= 0x7fffffff && chunks <= 65535,
             "reduce: {} outputs of {} elements cannot be split on one grid", g.n_out, g.group);
    Storage scratch(sizeof(T) * size_t(chunks * g.n_out), Device::cuda);
    T* partial = static_cast<T*>(scratch.data());
    const double partials = double(chunks * g.n_out);
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
    if (columns) {  // the partials written, read back by the last blocks, and out
        ledger::declare(double(sizeof(T)) *
                            (double(g.n_out) * double(g.group) + 2 * partials + double(g.n_out)),
                        double(g.n_out) * double(g.group) + partials, 0, sizeof(T) == 8);
        QK_LAUNCH((reduce_columns_kernel<T, Op>), grid, dim3(32, kLaneRows), 0, stream(), out,
                  partial, tile_counters(tiles), x, g, per_chunk);
        QK_CUDA_CHECK_LAUNCH("reduce_columns_kernel");
        return;
    }
    ledger::declare(double(sizeof(T)) * (double(g.n_out) * double(g.group) + partials),
                    double(g.n_out) * double(g.group), 0, sizeof(T) == 8);
    QK_LAUNCH((reduce_split_kernel<T, Op>), grid, v2_threads(g), 0, stream(), partial, x, g,
              per_chunk);
    QK_CUDA_CHECK_LAUNCH("reduce_split_kernel");
    ledger::declare_elements<T>(chunks * g.n_out, g.n_out, chunks * g.n_out);
    QK_LAUNCH((reduce_partials_kernel<T, Op>), static_cast<unsigned>((g.n_out + 31) / 32),
              dim3(32, kLaneRows), 0, stream(), out, partial, chunks, g.n_out);
    QK_CUDA_CHECK_LAUNCH("reduce_partials_kernel");
}

// Which version runs, and v2's block size: the group rounded up to a power of two in [32, 256].
bool use_v2(const Groups& g) {
    return forced_version == 1 || forced_version == 2 ? forced_version == 2 : g.group >= 32;
}
unsigned v2_threads(const Groups& g) {
    unsigned threads = 32;
    while (threads < 256 && static_cast<int64_t>(threads) < g.group) threads *= 2;
    return threads;
}
unsigned v2_blocks(const Groups& g) {
    return static_cast<unsigned>(g.n_out < 65535 ? g.n_out : 65535);
}

template <class T, class Op>
void reduce(T* out, const T* x, const Shape& x_strides, const Shape& shape, const Shape& kept,
            const char* op) {
    const Groups g = make_groups(shape, x_strides, kept, op);
    if (g.n_out == 0) return;
    const bool v3 = forced_version ? forced_version == 3 : columns_layout(g);
    const bool v4 = forced_version ? forced_version == 4 : !v3 && few_huge_groups(g);
    if ((v3 || v4) && g.group > 0) {
        reduce_in_chunks<T, Op>(out, x, g, v3);
    } else if (use_v2(g)) {
        ledger::declare_elements<T>(g.n_out * g.group, g.n_out, g.n_out * g.group);
        QK_LAUNCH((reduce_v2_kernel<T, Op>), v2_blocks(g), v2_threads(g), 0, stream(), out, x, g);
        QK_CUDA_CHECK_LAUNCH("reduce_v2_kernel");
    } else {
        ledger::declare_elements<T>(g.n_out * g.group, g.n_out, g.n_out * g.group);
        QK_LAUNCH((reduce_v1_kernel<T, Op>), grid_for(g.n_out), kThreads, 0, stream(), out, x, g);
        QK_CUDA_CHECK_LAUNCH("reduce_v1_kernel");
    }
}

}  // namespace

void set_reduce_version(int version) {
    QK_CHECK(version >= 0 && version <= 4, "set_reduce_version: 0 (auto), 1, 2, 3 or 4, got {}",
             version);
    forced_version = version;
}

template <class T>
void sum_reduce(T* out, const T* x, const Shape& x_strides, const Shape& shape, const Shape& kept) {
    reduce<T, SumOp>(out, x, x_strides, shape, kept, "sum");
}

template <class T>
void max_reduce(T* out, const T* x, const Shape& x_strides, const Shape& shape, const Shape& kept) {
    reduce<T, MaxOp>(out, x, x_strides, shape, kept, "max");
}

template <class T>
void logsumexp_reduce(T* lse, const T* x, const Shape& x_strides, const Shape& shape,
                      const Shape& kept) {
    const Groups g = make_groups(shape, x_strides, kept, "logsumexp");
    if (g.n_out == 0) return;
    if (use_v2(g)) {
        ledger::declare_elements<T>(2 * g.n_out * g.group, g.n_out, 4 * g.n_out * g.group);
        QK_LAUNCH((logsumexp_v2_kernel<T>), v2_blocks(g), v2_threads(g), 0, stream(), lse, x, g);
        QK_CUDA_CHECK_LAUNCH("logsumexp_v2_kernel");
    } else {
        ledger::declare_elements<T>(2 * g.n_out * g.group, g.n_out, 4 * g.n_out * g.group);
        QK_LAUNCH((logsumexp_v1_kernel<T>), grid_for(g.n_out), kThreads, 0, stream(), lse, x, g);
        QK_CUDA_CHECK_LAUNCH("logsumexp_v1_kernel");
    }
}

template <class T>
void max_backward(T* dx, const T* x, const Shape& x_strides, const T* y, const T* dy,
                  const Shape& shape, const Shape& kept) {
    const Groups g = make_groups(shape, x_strides, kept, "max backward");
    if (g.n_out == 0 || g.group == 0) return;
    if (use_v2(g)) {
        ledger::declare_elements<T>(g.n_out * (2 * g.group + 2), g.n_out * g.group,
                                    g.n_out * g.group);
        QK_LAUNCH((max_backward_v2_kernel<T>), v2_blocks(g), v2_threads(g), 0, stream(), dx, x, y,
                  dy, g);
        QK_CUDA_CHECK_LAUNCH("max_backward_v2_kernel");
    } else {
        ledger::declare_elements<T>(g.n_out * (2 * g.group + 2), g.n_out * g.group,
                                    g.n_out * g.group);
        QK_LAUNCH((max_backward_v1_kernel<T>), grid_for(g.n_out), kThreads, 0, stream(), dx, x, y,
                  dy, g);
        QK_CUDA_CHECK_LAUNCH("max_backward_v1_kernel");
    }
}

template <class T>
void logsumexp_backward(T* dx, const T* x, const Shape& x_strides, const T* lse, const T* dy,
                        const Shape& shape, const Shape& kept) {
    const int64_t n = numel_of(shape);
    if (n == 0) return;
    Shape k_strides = contiguous_strides(kept);
    for (size_t d = 0; d < kept.size(); ++d)
        if (kept[d] == 1) k_strides[d] = 0;
    const auto index = make_strided_index<2>(shape, {&x_strides, &k_strides}, "logsumexp backward");
    ledger::declare_elements<T>(2 * n, n, 3 * n);
    QK_LAUNCH((logsumexp_backward_kernel<T>), grid_for(n), kThreads, 0, stream(), dx, x, lse, dy,
              index, n);
    QK_CUDA_CHECK_LAUNCH("logsumexp_backward_kernel");
}

#define QK_REDUCE_INSTANTIATE(T)                                                                \
    template void sum_reduce<T>(T*, const T*, const Shape&, const Shape&, const Shape&);        \
    template void max_reduce<T>(T*, const T*, const Shape&, const Shape&, const Shape&);        \
    template void logsumexp_reduce<T>(T*, const T*, const Shape&, const Shape&, const Shape&);  \
    template void max_backward<T>(T*, const T*, const Shape&, const T*, const T*, const Shape&, \
                                  const Shape&);                                                \
    template void logsumexp_backward<T>(T*, const T*, const Shape&, const T*, const T*,         \
                                        const Shape&, const Shape&);
QK_REDUCE_INSTANTIATE(float)
QK_REDUCE_INSTANTIATE(double)

}  // namespace qk::cuda
