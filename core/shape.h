// Shapes and strides: sizes and steps in elements, row-major, any rank (rank 0 is a scalar).
#pragma once

#include <cstdint>
#include <vector>

namespace qk {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& shape);          // product of sizes, 1 for a scalar
Shape contiguous_strides(const Shape& shape);  // row-major strides in elements
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);        // -1 -> rank-1, checked
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);  // numpy rules, checked

}  // namespace qk
