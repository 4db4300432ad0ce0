#include "core/shape.h"

#include "core/error.h"

namespace qk {

int64_t numel_of(const Shape& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

Shape contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t step = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = step;
        step *= shape[i];
    }
    return strides;
}

int64_t normalize_dim(int64_t dim, int64_t rank, const char* op) {
    QK_CHECK(dim >= -rank && dim < rank, "{}: dim {} is out of range for a tensor of rank {}", op,
             dim, rank);
    return dim < 0 ? dim + rank : dim;
}

// Align shapes on the right; each pair of sizes must be equal or one of them 1.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
    size_t rank = std::max(a.size(), b.size());
    Shape out(rank);
    for (size_t i = 0; i < rank; ++i) {
        int64_t sa = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        int64_t sb = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        QK_CHECK(sa == sb || sa == 1 || sb == 1,
                 "{}: shapes {} and {} cannot broadcast (sizes {} and {} at dim {})", op, a, b, sa,
                 sb, i);
        out[i] = sa == 1 ? sb : sa;
    }
    return out;
}

}  // namespace qk
