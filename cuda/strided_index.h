// StridedIndex: how a kernel finds the elements of strided (views, broadcast) operands.
//
// A kernel gets a logical row-major index i over `shape` (one per thread, grid-stride) and needs
// each operand's element offset: the coordinates of i dotted with that operand's strides. The
// shape and the strides of N operands travel by value in this small struct (kernel arguments live
// in constant memory on the GPU, so every thread reads them without touching global memory), up
// to kMaxDims dims after merging: dims of size 1 are dropped and neighbours that are contiguous
// with each other in every operand become one, so most tensors arrive with rank 1 to 3.
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
    int64_t sizes[kMaxDims] = {};
    int64_t strides[N][kMaxDims] = {};

    // off[k] = the element offset of logical index i in operand k (innermost dim fastest).
    __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
        for (int k = 0; k < N; ++k) off[k] = 0;
        for (int d = rank - 1; d >= 0; --d) {
            const int64_t coord = i % sizes[d];
            i /= sizes[d];
            for (int k = 0; k < N; ++k) off[k] += coord * strides[k][d];
        }
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

}  // namespace qk::cuda
