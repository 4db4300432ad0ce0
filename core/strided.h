// for_each_run: the one loop nest behind every strided or broadcasting kernel.
//
// A tensor of shape (d0, ..., dk) is walked as d0*...*d(k-1) runs of dk elements. For each run,
// body(offsets, length) gets the element offset of the run's start in each of N operands; the
// caller steps through the run with the operands' last-dim strides (often 1 or 0, which the
// compiler vectorises when the caller branches on them).
//
// parallel_for_each_run: the same walk on the pool's threads (core/threading.h), for kernels where
// every output element belongs to exactly one run (elementwise maps and copies; not reductions,
// whose runs share outputs). The threads take contiguous slices of the outermost dim (for a
// rank-1 tensor, slices of its one run), so they write disjoint memory and each element is
// computed exactly as on one thread: the result does not depend on the thread count.
#pragma once

#include <array>
#include <cstdint>

#include "core/shape.h"
#include "core/threading.h"

namespace qk {

template <std::size_t N, typename Body>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, Body&& body) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::array<int64_t, N> offsets{};
    if (rank == 0) {
        body(offsets, int64_t{1});
        return;
    }
    for (int64_t s : shape)
        if (s == 0) return;
    const int64_t length = shape[rank - 1];
    Shape index(rank, 0);
    while (true) {
        body(offsets, length);
        // Odometer increment over the outer dims, updating each operand's offset incrementally.
        int64_t d = rank - 2;
        for (; d >= 0; --d) {
            ++index[d];
            for (std::size_t k = 0; k < N; ++k) offsets[k] += (*strides[k])[d];
            if (index[d] < shape[d]) break;
            for (std::size_t k = 0; k < N; ++k) offsets[k] -= (*strides[k])[d] * shape[d];
            index[d] = 0;
        }
        if (d < 0) return;
    }
}

// Below this many elements a parallel region costs more than it saves (a memory-bound pass
// over 2^17 floats takes ~30 µs here; waking a thread, a few).
constexpr int64_t kParallelElementwise = 1 << 17;

template <std::size_t N, typename Body>
void parallel_for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides,
                           Body&& body) {
    if (shape.empty()) {  // a scalar: one run of one element
        for_each_run<N>(shape, strides, body);
        return;
    }
    auto slab = [&](int64_t lo, int64_t hi) {  // dims 1.. whole, dim 0 from lo to hi
        Shape slice = shape;
        slice[0] = hi - lo;
        for_each_run<N>(slice, strides, [&](std::array<int64_t, N> off, int64_t length) {
            for (std::size_t k = 0; k < N; ++k) off[k] += lo * (*strides[k])[0];
            body(off, length);
        });
    };
    parallel_for(shape[0], slab, numel_of(shape) >= kParallelElementwise);
}

}  // namespace qk
