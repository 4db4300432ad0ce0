// Reductions.
//
// sum:  y = Σ_{reduced dims} x            backward: dx = expand(dy)   (every x element fed y once)
// mean: y = sum(x) / N                    backward: dx = expand(dy) / N
// sum_to(x, shape) is sum over the dims that broadcasting from `shape` would create; its
// backward is expand(dy) back to x's shape.
//
// Kernel: out is indexed with stride 0 along every reduced dim, so walking x once and doing
// out[off] += x[i] reduces without copying or permuting x.
#include "ops/reduce.h"

#include <algorithm>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/strided.h"
#include "ops/elementwise.h"

namespace qk {

namespace cpu {

// out: zero-initialised, read/written through out_strides (0 on reduced dims);
// x: shape `shape`, any strides.    out[reduce(i)] += x[i]
template <class T>
void sum_accumulate(T* out, const Shape& out_strides, const T* x, const Shape& x_strides,
                    const Shape& shape) {
    const int64_t so = shape.empty() ? 0 : out_strides.back();
    const int64_t sx = shape.empty() ? 0 : x_strides.back();
    for_each_run<2>(shape, {&out_strides, &x_strides}, [&](const auto& off, int64_t n) {
        T* o = out + off[0];
        const T* p = x + off[1];
        if (so == 0) {  // reducing along the run: a sum the compiler may vectorise
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < n; ++i) acc += p[i * sx];
            o[0] += acc;
        } else if (sx == 1 && so == 1) {
            for (int64_t i = 0; i < n; ++i) o[i] += p[i];
        } else {
            for (int64_t i = 0; i < n; ++i) o[i * so] += p[i * sx];
        }
    });
}

}  // namespace cpu

namespace {

// The reduced shape with size 1 on reduced dims (keepdim form), and whether each dim is reduced.
Shape keepdim_shape(const Shape& shape, const Dims& dims, const char* op) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    Shape out = shape;
    if (dims.empty()) {
        std::fill(out.begin(), out.end(), 1);
        return out;
    }
    std::vector<bool> seen(rank, false);
    for (int64_t d : dims) {
        int64_t nd = normalize_dim(d, rank, op);
        QK_CHECK(!seen[nd], "{}: dim {} listed twice in {}", op, d, dims);
        seen[nd] = true;
        out[nd] = 1;
    }
    return out;
}

Shape drop_reduced(const Shape& shape, const Shape& kept, const Dims& dims) {
    Shape out;
    for (size_t i = 0; i < shape.size(); ++i) {
        const bool reduced = dims.empty() ? true
                                          : std::any_of(dims.begin(), dims.end(), [&](int64_t d) {
                                                return normalize_dim(d, shape.size(), "sum") == int64_t(i);
                                            });
        if (!reduced) out.push_back(kept[i]);
    }
    return out;
}

// Sums x (any strides) into a fresh contiguous tensor of shape `target` (keepdim layout, same rank).
Tensor sum_into_shape(const Tensor& x, const Shape& target) {
    Tensor out = zeros(target, x.dtype(), x.device());
    Shape out_strides = contiguous_strides(target);
    for (size_t i = 0; i < target.size(); ++i)
        if (target[i] == 1) out_strides[i] = 0;
    switch (x.device()) {
        case Device::cpu:
            dispatch_float(x.dtype(), [&](auto tag) {
                using T = decltype(tag);
                cpu::sum_accumulate(out.data<T>(), out_strides, x.data<T>(), x.strides(), x.shape());
            });
            break;
        case Device::cuda: QK_CHECK(false, "sum: no CUDA kernel yet");
    }
    return out;
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    QK_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(),
             "sum_to: shape {} does not broadcast to the input's shape {}", shape, x.shape());
    // Pad `shape` on the left to x's rank, reduce, then drop the padding.
    Shape padded(x.dim() - shape.size(), 1);
    padded.insert(padded.end(), shape.begin(), shape.end());
    Tensor y = sum_into_shape(x, padded).view(shape);
    return autograd::record("sum_to", y, {x}, [xs = x.shape()](const Tensor& dy) {
        return std::vector<Tensor>{dy.expand(xs)};
    });
}

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
    const Shape kept = keepdim_shape(x.shape(), dims, "sum");
    Tensor y = sum_into_shape(x, kept);
    if (!keepdim) y = y.view(drop_reduced(x.shape(), kept, dims));
    return autograd::record("sum", y, {x}, [xs = x.shape(), kept](const Tensor& dy) {
        return std::vector<Tensor>{dy.view(kept).expand(xs)};
    });
}

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
    const Shape kept = keepdim_shape(x.shape(), dims, "mean");
    const int64_t count = x.numel() / std::max<int64_t>(numel_of(kept), 1);
    QK_CHECK(count > 0, "mean: reducing shape {} over dims {} averages zero elements", x.shape(), dims);
    return sum(x, dims, keepdim) * (1.0 / static_cast<double>(count));
}

}  // namespace qk
