// StridedIndex: how a kernel finds the elements of strided (views, broadcast) operands.
//
// A kernel gets a logical row-major index i over `shape` (one per thread, grid-stride) and needs
// each operand's element offset: the coordinates of i dotted with that operand's strides. The
// shape and the strides of N operands travel by value in this small struct (kernel arguments live
// in constant memory on the GPU, so every thread reads them without touching global memory), up
// to kMaxDims dims after merging: dims of size 1 are dropped and neighbours that are contiguous
// with each other in every operand become one, so most tensors arrive with rank 1 to 3.
//
// The division is the cost. A 64-bit integer division is a long software sequence on the GPU, and
// one per dim per element held a contiguous float32 -> bf16 cast at ~1 TB/s on an H200 (a quarter
// of its bandwidth). So the outermost dim takes what is left of i with no division at all (a
// contiguous tensor, rank 1 after merging, divides nothing), and below 2^32 elements, which is
// every tensor of a 124M-parameter model's step, the others divide in 32 bits.
#pragma once

#include <array>
#include <cstdint>

#include "core/error.h"
#include "core/shape.h"
#include "cuda/emu/cuda_compat.h"

namespace qk::cuda {

inline constexpr int kMaxDims = 8;

template <int N>
struct StridedIndex {
    int rank = 0;
    bool narrow = false;  // fewer than 2^32 elements: every size and index fits 32 bits
    int64_t sizes[kMaxDims] = {};
    int64_t strides[N][kMaxDims] = {};

    // off[k] = the element offset of logical index i in operand k (innermost dim fastest).
    __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
        for (int k = 0; k < N; ++k) off[k] = 0;
        if (narrow) {
            uint32_t u = static_cast<uint32_t>(i);
            for (int d = rank - 1; d > 0; --d) {
                const uint32_t size = static_cast<uint32_t>(sizes[d]);
                const uint32_t coord = u % size;
                u /= size;
                for (int k = 0; k < N; ++k) off[k] += int64_t(coord) * strides[k][d];
            }
            i = u;
        } else {
            for (int d = rank - 1; d > 0; --d) {
                const int64_t coord = i % sizes[d];
                i /= sizes[d];
                for (int k = 0; k < N; ++k) off[k] += coord * strides[k][d];
            }
        }
        if (rank > 0)  // the outermost dim: what is left of i is its coordinate
            for (int k = 0; k < N; ++k) off[k] += i * strides[k][0];
    }
};

// Host side: the merged index for `shape` read through each operand's strides. `op` names the
// caller in the error for a tensor that still has more than kMaxDims dims after merging.
template <int N>
StridedIndex<N> make_strided_index(const Shape& shape, const std::array<const Shape*, N>& strides,
                                   const char* op) {
    StridedIndex<N> index;
    int rank = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 1) continue;  // never stepped along: its stride does not matter
        bool merges = rank > 0;       // with the dim kept last: outer stride = inner · size
        for (int k = 0; k < N && merges; ++k)
            merges = index.strides[k][rank - 1] == (*strides[k])[d] * shape[d];
        if (merges) {
            index.sizes[rank - 1] *= shape[d];
            for (int k = 0; k < N; ++k) index.strides[k][rank - 1] = (*strides[k])[d];
            continue;
        }
        QK_CHECK(rank < kMaxDims,
                 "{}: shape {} has more than {} dims that cannot be merged; the CUDA kernels "
                 "index at most {}",
                 op, shape, kMaxDims, kMaxDims);
        index.sizes[rank] = shape[d];
        for (int k = 0; k < N; ++k) index.strides[k][rank] = (*strides[k])[d];
        ++rank;
    }
    index.rank = rank;
    int64_t total = 1;
    for (int d = 0; d < rank; ++d) total *= index.sizes[d];
    index.narrow = total < (int64_t{1} << 32);
    return index;
}

// Threads per block of the elementwise kernels, and a grid of enough blocks for n items, capped:
// past the cap each thread loops (grid-stride), which costs nothing on the GPU and keeps the
// emulator's launches bounded.
inline constexpr unsigned kThreads = 256;
inline unsigned grid_for(int64_t n, unsigned threads = kThreads) {
    const int64_t blocks = n <= 0 ? 1 : (n + threads - 1) / threads;
    return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// The elementwise loop with four elements per thread per pass. Little's law: a GPU streams at full
// bandwidth only with enough bytes in flight (~4 TB/s × ~0.6 µs ≈ 2.4 MB on an H200), and one
// 4-byte load per thread is at most 270k threads × 4 B ≈ 1 MB: a cast or copy of one float per
// thread measured ~1.2 TB/s. So each thread issues all four loads before any store; element k of
// a pass is base + k·blockDim.x, so consecutive threads still touch consecutive elements.
// load(i) returns what store(i, value) needs; the two run for every i < n exactly once.
inline constexpr int kUnroll = 4;
inline unsigned grid_for_unrolled(int64_t n) { return grid_for((n + kUnroll - 1) / kUnroll); }

// `block` of `blocks`: this block's place in the grid that shares the loop (the whole launch's,
// or a part of it that serves one of several jobs).
template <class Load, class Store>
__device__ __forceinline__ void unrolled_grid_loop(int64_t n, Load load, Store store,
                                                   unsigned block, unsigned blocks) {
    const int64_t width = static_cast<int64_t>(blockDim.x);
    const int64_t step = static_cast<int64_t>(blocks) * width * kUnroll;
    for (int64_t base = static_cast<int64_t>(block) * width * kUnroll + threadIdx.x; base < n;
         base += step) {
        decltype(load(base)) value[kUnroll]{};  // {}: no "maybe uninitialized" for the tail
        for (int k = 0; k < kUnroll; ++k)
            if (base + k * width < n) value[k] = load(base + k * width);
        for (int k = 0; k < kUnroll; ++k)
            if (base + k * width < n) store(base + k * width, value[k]);
    }
}
template <class Load, class Store>
__device__ __forceinline__ void unrolled_grid_loop(int64_t n, Load load, Store store) {
    unrolled_grid_loop(n, load, store, blockIdx.x, gridDim.x);
}

}  // namespace qk::cuda
