// for_each_run: the one loop nest behind every strided or broadcasting kernel.
//
// A tensor of shape (d0, ..., dk) is walked as d0*...*d(k-1) runs of dk elements. For each run,
// body(offsets, length) gets the element offset of the run's start in each of N operands; the
// caller steps through the run with the operands' last-dim strides (often 1 or 0, which the
// compiler vectorises when the caller branches on them).
#pragma once

#include <array>
#include <cstdint>

#include "core/shape.h"

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

}  // namespace qk
