// Warp and block reductions shared by the row kernels (cuda/softmax.cu, cuda/loss.cu,
// cuda/norm.cu), plus the few device math overloads they need for float and double.
//
// Determinism: every sum here is a fixed tree. warp_sum is an xor butterfly, after which all 32
// lanes hold the same bits (lane l adds a + b where its partner adds b + a); block_sum adds the
// warps' sums in warp order. The result never depends on the order in which threads or blocks
// run, so the emulator's forward/reverse/random run orders give bit-identical outputs.
//
// Block sizes must be multiples of 32: the shuffles use the full mask.
#pragma once

#include <cmath>

#include "cuda/emu/cuda_compat.h"

namespace qk::cuda {

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const T other = __shfl_xor_sync(kFullMask, v, offset);
        v = other > v ? other : v;
    }
    return v;
}

// The sum (kMax: the max) of v over the block, returned to every thread. The first barrier keeps
// a previous call's readers of `partial` from seeing this call's writes, so calls may follow one
// another; every warp then reduces the (at most 32) warp results itself, so no third barrier.
template <class T, bool kMax>
__device__ __forceinline__ T block_reduce(T v, T identity) {
    __shared__ T partial[kWarp];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int warps = (blockDim.x + kWarp - 1) / kWarp;
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : identity;
    return kMax ? warp_max(v) : warp_sum(v);
}

template <class T>
__device__ __forceinline__ T block_sum(T v) {
    return block_reduce<T, false>(v, T(0));
}

template <class T>
__device__ __forceinline__ T block_max(T v) {
    return block_reduce<T, true>(v, -INFINITY);
}

// The column kernels (cuda/norm.cu's parameter gradients, cuda/reduce.cu's v3 and its combine) run
// blocks of 32 columns × kLaneRows row lanes: lane (x, y) holds a partial of column x. This
// combines them down the lanes with `op` in lane order (a fixed tree), into lane row 0; the other
// rows get their own value back. Every thread of the block must call it (it has barriers); the
// first barrier keeps a previous call's readers from seeing this call's writes.
inline constexpr int kLaneRows = 8;

template <class T, class Op>
__device__ __forceinline__ T combine_lane_rows(T v, Op op) {
    __shared__ T lanes[kLaneRows][kWarp];
    __syncthreads();
    lanes[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0)
        for (int y = 1; y < kLaneRows; ++y) v = op(v, lanes[y][threadIdx.x]);
    return v;
}

// A column kernel's lane walks rows first, first + step, ... < end of its chunk (step kLaneRows).
// Each row gives it one value per operand (4 bytes), so a plain loop, which waits for each load
// before the next iteration's, keeps one load in flight per lane: a third of what an H200's memory
// needs to stay busy (measured: such kernels streamed 1.7–2.6 TB/s). This issues load(r) for
// kRowsInFlight rows before visiting the first, then visit(r, loaded) in row order, so every sum
// is added in the order the plain loop adds it (the same bits).
inline constexpr int kRowsInFlight = 4;

template <class Load, class Visit>
__device__ __forceinline__ void walk_rows(int64_t first, int64_t end, int64_t step, Load load,
                                          Visit visit) {
    using Loaded = decltype(load(first));
    for (int64_t r = first; r < end; r += step * kRowsInFlight) {
        Loaded loaded[kRowsInFlight]{};  // (zeroed: compilers cannot see the two guards agree)
        QK_UNROLL
        for (int i = 0; i < kRowsInFlight; ++i)
            if (r + i * step < end) loaded[i] = load(r + i * step);
        QK_UNROLL
        for (int i = 0; i < kRowsInFlight; ++i)
            if (r + i * step < end) visit(r + i * step, loaded[i]);
    }
}

// A two-stage column reduction in one launch: block (bx, k) of a grid (tiles, chunks) writes its
// partials of tile bx's 32 columns, then counts its arrival on the tile's counter, and the block
// that arrives last combines the tile's partials in chunk order (combine_chunks), so the result
// does not depend on which block that was (llm.c finishes its layernorm gradients this way).
// counters: one per tile (cuda::tile_counters), zero before the launch; the last block resets
// its own. Every thread of the block must call it.
__device__ __forceinline__ bool arrived_last(unsigned* counters) {
    __shared__ bool last;
    __threadfence();  // this block's partials are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
        if (last) counters[blockIdx.x] = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// In the last block: column 32·blockIdx.x + x of partial (chunks, n) combined over its chunks,
// lane row y taking chunks y, y + 8, ... and row 0 then the 8 rows in order (into lane row 0).
template <class T, class Op>
__device__ __forceinline__ T combine_chunks(const T* partial, int64_t chunks, int64_t n, Op op,
                                            T identity) {
    const int64_t c = int64_t(blockIdx.x) * kWarp + threadIdx.x;
    T acc = identity;
    if (c < n)
        for (int64_t k = threadIdx.y; k < chunks; k += kLaneRows)
            acc = op(acc, __ldcg(partial + k * n + c));
    return combine_lane_rows(acc, op);
}

// a + b with b rounded on its own first: never fused with the multiply that made b (nvcc's
// --fmad, like g++'s default contraction, would make a + s·t one FMA), so that adding into a
// buffer gives the bits of storing b and adding it afterwards (the norms' add_into_dx).
__device__ __forceinline__ float dev_add_unfused(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double dev_add_unfused(double a, double b) { return __dadd_rn(a, b); }

// Math overloads that pick expf or exp by type: the C names exist in device code under nvcc and
// on the host under the emulation alike.
__device__ __forceinline__ float dev_exp(float x) { return expf(x); }
__device__ __forceinline__ double dev_exp(double x) { return exp(x); }
__device__ __forceinline__ float dev_log(float x) { return logf(x); }
__device__ __forceinline__ double dev_log(double x) { return log(x); }
__device__ __forceinline__ float dev_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double dev_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float dev_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dev_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float dev_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double dev_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float dev_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double dev_abs(double x) { return fabs(x); }

}  // namespace qk::cuda
