// Joining and splitting along a dim.
//
// cat: y = [x_0 | x_1 | ... | x_{k-1}] along dim d; x_i lands in y.narrow(d, off_i, len_i), where
//     len_i = x_i.shape[d] and off_i = len_0 + ... + len_{i-1}.
// Saved: the offsets and lengths only, no data.
// Backward: every element of y is a copy of exactly one element of one x_i, so
//     dx_i = dy.narrow(d, off_i, len_i)                  (a view of dy, nothing copied)
//
// stack(xs, d) = cat(x_i.unsqueeze(d), d): its backward is cat's, then unsqueeze's (a squeeze).
// split / chunk return narrow views of x: nothing is copied, and narrow's backward (ops/view.cpp)
// puts each piece's gradient back in its place, so a piece used downstream is differentiable.
//
// Kernel: a contiguous x_i of shape (A..., len_i, B...) is a matrix (outer, len_i * inner), with
// outer = prod(A) and inner = prod(B); y is (outer, total * inner). Row o of x_i is one run of
// len_i * inner elements that goes to columns [off_i * inner, (off_i + len_i) * inner) of y's row
// o: cat is `outer` memcpy-sized copies per input, one pass over the data. On cuda the same
// decomposition runs as one copy kernel per input (cuda/join.cu); the views need no kernel.
#include "ops/join.h"

#include <algorithm>

#include "autograd/node.h"
#include "core/threading.h"

namespace qk {

namespace cpu {

// Below this many copied elements a parallel region costs more than it saves.
constexpr int64_t kParallelWork = 1 << 15;

// y: (outer, y_row); x: (outer, x_row), contiguous. Copies x into y's columns [col, col + x_row).
template <class T>
void cat_copy(T* y, int64_t y_row, const T* x, int64_t x_row, int64_t col, int64_t outer) {
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o)
            std::copy_n(x + o * x_row, x_row, y + o * y_row + col);
    };
    parallel_for(outer, rows, outer * x_row >= kParallelWork);
}

}  // namespace cpu

namespace {

// Every tensor must match tensor 0 in dtype, device, rank, and every size except along dim d.
// Returns d normalised against the common rank.
int64_t check_catable(const std::vector<Tensor>& tensors, int64_t dim) {
    QK_CHECK(!tensors.empty(), "cat: needs at least one tensor, got an empty list");
    for (size_t i = 0; i < tensors.size(); ++i)
        QK_CHECK(tensors[i].defined(), "cat: tensor {} is undefined", i);
    const Tensor& first = tensors[0];
    QK_CHECK(first.dim() > 0,
             "cat: tensor 0 is a scalar (shape []); cat joins tensors of rank >= 1 "
             "along an existing dim (stack adds a new one)");
    const int64_t d = normalize_dim(dim, first.dim(), "cat");
    for (size_t i = 1; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        QK_CHECK(
            t.dtype() == first.dtype(),
            "cat: tensor {} is {} of shape {}, tensor 0 is {} of shape {} (expected one dtype)", i,
            t.dtype(), t.shape(), first.dtype(), first.shape());
        QK_CHECK(t.device() == first.device(), "cat: tensor {} is on {}, tensor 0 is on {}", i,
                 t.device(), first.device());
        QK_CHECK(t.dim() == first.dim(),
                 "cat: tensor {} has shape {}, tensor 0 has shape {} (expected the same rank)", i,
                 t.shape(), first.shape());
        for (int64_t k = 0; k < first.dim(); ++k)
            QK_CHECK(k == d || t.size(k) == first.size(k),
                     "cat: tensor {} has shape {}, tensor 0 has shape {} (expected equal sizes "
                     "except along dim {})",
                     i, t.shape(), first.shape(), d);
    }
    return d;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
    const int64_t d = check_catable(tensors, dim);
    Shape out_shape = tensors[0].shape();
    std::vector<int64_t> offsets, lengths;
    out_shape[d] = 0;
    for (const Tensor& t : tensors) {
        offsets.push_back(out_shape[d]);
        lengths.push_back(t.size(d));
        out_shape[d] += t.size(d);
    }
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < d; ++k) outer *= out_shape[k];
    for (int64_t k = d + 1; k < static_cast<int64_t>(out_shape.size()); ++k) inner *= out_shape[k];
    Tensor y = Tensor::empty(out_shape, tensors[0].dtype(), tensors[0].device());
    switch (y.device()) {
        case Device::cpu:
            for (size_t i = 0; i < tensors.size(); ++i) {
                const Tensor x = autograd::contiguous_input(tensors[i]);
                dispatch_all(y.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    cpu::cat_copy(y.data<T>(), out_shape[d] * inner, x.data<T>(),
                                  lengths[i] * inner, offsets[i] * inner, outer);
                });
            }
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            for (size_t i = 0; i < tensors.size(); ++i) {
                const Tensor x = autograd::contiguous_input(tensors[i]);
                dispatch_all(y.dtype(), [&](auto tag) {
                    using T = decltype(tag);
                    cuda::cat_copy(y.data<T>(), out_shape[d] * inner, x.data<T>(),
                                   lengths[i] * inner, offsets[i] * inner, outer);
                });
            }
#else
            throw_built_without_cuda("cat");
#endif
            break;
    }
    return autograd::record("cat", y, tensors, [d, offsets, lengths](const Tensor& dy) {
        std::vector<Tensor> dxs;
        for (size_t i = 0; i < offsets.size(); ++i)
            dxs.push_back(dy.narrow(d, offsets[i], lengths[i]));
        return dxs;
    });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
    QK_CHECK(!tensors.empty(), "stack: needs at least one tensor, got an empty list");
    for (size_t i = 0; i < tensors.size(); ++i) {
        QK_CHECK(tensors[i].defined(), "stack: tensor {} is undefined", i);
        QK_CHECK(tensors[i].shape() == tensors[0].shape(),
                 "stack: tensor {} has shape {}, tensor 0 has shape {} (expected equal shapes)", i,
                 tensors[i].shape(), tensors[0].shape());
    }
    const int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
    std::vector<Tensor> unsqueezed;
    for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));  // views, no copies
    return cat(unsqueezed, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
    QK_CHECK(size > 0, "split: piece size must be > 0, got {} (input shape {})", size, x.shape());
    const int64_t d = normalize_dim(dim, x.dim(), "split");
    const int64_t n = x.size(d);
    if (n == 0) return {x.narrow(d, 0, 0)};  // like torch: one empty piece, not none
    std::vector<Tensor> pieces;
    for (int64_t start = 0; start < n; start += size)
        pieces.push_back(x.narrow(d, start, std::min(size, n - start)));
    return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim) {
    QK_CHECK(n > 0, "chunk: number of chunks must be > 0, got {} (input shape {})", n, x.shape());
    const int64_t d = normalize_dim(dim, x.dim(), "chunk");
    // torch.chunk's rule: pieces of ceil(len / n), so there may be fewer than n of them.
    const int64_t size = std::max<int64_t>(1, (x.size(d) + n - 1) / n);
    return split(x, size, d);
}

}  // namespace qk
