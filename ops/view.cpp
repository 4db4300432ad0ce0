// View ops: a new (shape, strides, offset) over the same storage, no data moved.
//
// Each view is differentiable, and its backward is the inverse rearrangement of dy:
//     view / reshape:  dx = dy.reshape(x.shape)
//                      (reshape is a view whenever the strides allow one, contiguous or not;
//                      only a reshape that no strides can express, e.g. merging a transposed
//                      pair of dims, copies)
//     transpose:       dx = dy.transpose(d0, d1)            (its own inverse)
//     permute(order):  dx = dy.permute(inverse(order))
//     narrow:          dx = zeros(x.shape), dx[narrowed region] = dy   (the engine places dy in
//                      dx: the pieces of a split share one buffer, see autograd/node.h)
//     expand:          dx = sum_to(dy, x.shape)             (stride 0 fed many outputs)
//     squeeze/unsqueeze: the other one
// contiguous(), clone(), to(dtype) and to(device) copy; their backward passes dy through (cast
// back for to(dtype), moved back to the source device for to(device)).
#include <numeric>
#include <optional>

#include "autograd/node.h"
#include "core/factory.h"
#include "ops/reduce.h"

namespace qk {

using autograd::Grads;

namespace {

// narrow's backward hands dy back as the gradient of the slab [start, start + length) along dim
// of x; the engine writes it into x's gradient (zeros elsewhere), see Node::gradient_slab.
struct NarrowNode final : autograd::Node {
    explicit NarrowNode(autograd::Slab slab) : slab(slab) {}
    std::string name() const override { return "narrow"; }
    Grads backward(const Tensor& dy) override { return {dy}; }
    void release() override {}  // saves nothing
    std::optional<autograd::Slab> gradient_slab() const override { return slab; }

    autograd::Slab slab;
};

Shape infer_size(Shape shape, int64_t numel, const char* op, const Shape& from) {
    int64_t known = 1, infer_at = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            QK_CHECK(infer_at < 0, "{}: more than one -1 in target shape {}", op, shape);
            infer_at = static_cast<int64_t>(i);
        } else {
            QK_CHECK(shape[i] >= 0, "{}: negative size in target shape {}", op, shape);
            known *= shape[i];
        }
    }
    if (infer_at >= 0) {
        QK_CHECK(known > 0 && numel % known == 0,
                 "{}: cannot infer -1 in {} for {} elements (from {})", op, shape, numel, from);
        shape[infer_at] = numel / known;
    }
    QK_CHECK(numel_of(shape) == numel, "{}: shape {} has {} elements, the input {} has {}", op,
             shape, numel_of(shape), from, numel);
    return shape;
}

// The strides that read a tensor of `shape`/`strides` as `target` without moving data, if any
// exist (the algorithm of PyTorch's computeStride). The old dims split into chunks that are
// contiguous among themselves (each dim's stride = the next one's stride × size); a new shape is
// a view iff its dims regroup the elements of each chunk separately, and then each new dim's stride
// is (the chunk's innermost stride) × (the sizes of the new dims inside it that follow).
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& target) {
    Shape out(target.size(), 0);
    int64_t view_d = static_cast<int64_t>(target.size()) - 1;
    int64_t chunk_stride = strides.back(), chunk_numel = 1, view_numel = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        chunk_numel *= shape[d];
        const bool chunk_ends =
            d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunk_numel * chunk_stride);
        if (!chunk_ends) continue;
        while (view_d >= 0 && (view_numel < chunk_numel || target[view_d] == 1)) {
            out[view_d] = view_numel * chunk_stride;
            view_numel *= target[view_d--];
        }
        if (view_numel != chunk_numel) return std::nullopt;
        if (d > 0) {
            chunk_stride = strides[d - 1];
            chunk_numel = view_numel = 1;
        }
    }
    if (view_d != -1) return std::nullopt;
    return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
    Shape shape = infer_size(shape_in, numel(), "view", this->shape());
    QK_CHECK(is_contiguous(),
             "view: input of shape {} with strides {} is not contiguous; use "
             "reshape() (which copies) or contiguous() first",
             this->shape(), strides());
    Tensor y = make_view(*this, shape, contiguous_strides(shape), offset());
    return autograd::record("view", y, {*this}, [xs = this->shape()](const Tensor& dy) {
        return Grads{dy.reshape(xs)};
    });
}

Tensor Tensor::reshape(const Shape& shape_in) const {
    if (is_contiguous()) return view(shape_in);
    // Not contiguous: still a view when the strides allow one, e.g. splitting the last dim of a
    // narrowed (B, T, 3C) tensor's (B, T, C) piece into heads (B, T, H, D).
    const Shape shape = infer_size(shape_in, numel(), "reshape", this->shape());
    std::optional<Shape> st =
        numel() > 0 ? view_strides(this->shape(), strides(), shape) : std::nullopt;
    if (!st) return contiguous().view(shape);
    Tensor y = make_view(*this, shape, *st, offset());
    return autograd::record("reshape", y, {*this}, [xs = this->shape()](const Tensor& dy) {
        return Grads{dy.reshape(xs)};
    });
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
    int64_t d0 = normalize_dim(dim0, dim(), "transpose"),
            d1 = normalize_dim(dim1, dim(), "transpose");
    Shape shape = this->shape(), st = strides();
    std::swap(shape[d0], shape[d1]);
    std::swap(st[d0], st[d1]);
    Tensor y = make_view(*this, shape, st, offset());
    return autograd::record("transpose", y, {*this},
                            [d0, d1](const Tensor& dy) { return Grads{dy.transpose(d0, d1)}; });
}

Tensor Tensor::permute(const Shape& order) const {
    QK_CHECK(static_cast<int64_t>(order.size()) == dim(),
             "permute: order {} has {} entries, tensor has rank {}", order, order.size(), dim());
    Shape shape(dim()), st(dim()), inverse(dim(), -1);
    for (int64_t i = 0; i < dim(); ++i) {
        int64_t from = normalize_dim(order[i], dim(), "permute");
        QK_CHECK(inverse[from] < 0, "permute: dim {} repeats in order {}", from, order);
        inverse[from] = i;
        shape[i] = this->shape()[from];
        st[i] = strides()[from];
    }
    Tensor y = make_view(*this, shape, st, offset());
    return autograd::record("permute", y, {*this},
                            [inverse](const Tensor& dy) { return Grads{dy.permute(inverse)}; });
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
    int64_t d = normalize_dim(dim_in, dim(), "narrow");
    QK_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d],
             "narrow: range [{}, {}) is outside dim {} of size {} (shape {})", start,
             start + length, d, shape()[d], shape());
    Shape shape = this->shape();
    shape[d] = length;
    Tensor y = make_view(*this, shape, strides(), offset() + start * strides()[d]);
    if (!autograd::needs_recording({*this})) return y;
    return autograd::attach(y, std::make_shared<NarrowNode>(autograd::Slab{d, start}), {*this});
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
    int64_t d = normalize_dim(dim_in, dim(), "select");
    QK_CHECK(index >= -shape()[d] && index < shape()[d],
             "select: index {} out of range for dim {} of size {}", index, d, shape()[d]);
    if (index < 0) index += shape()[d];
    return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
    QK_CHECK(shape.size() >= this->shape().size(),
             "expand: cannot expand shape {} to fewer dims {}", this->shape(), shape);
    const size_t lead = shape.size() - this->shape().size();
    Shape st(shape.size(), 0);
    for (size_t i = 0; i < this->shape().size(); ++i) {
        const int64_t from = this->shape()[i], to = shape[lead + i];
        QK_CHECK(from == to || from == 1, "expand: shape {} cannot expand to {} (dim {}: {} -> {})",
                 this->shape(), shape, lead + i, from, to);
        st[lead + i] = from == to ? strides()[i] : 0;
    }
    Tensor y = make_view(*this, shape, st, offset());
    return autograd::record("expand", y, {*this}, [xs = this->shape()](const Tensor& dy) {
        return Grads{sum_to(dy, xs)};
    });
}

Tensor Tensor::squeeze(int64_t dim_in) const {
    int64_t d = normalize_dim(dim_in, dim(), "squeeze");
    QK_CHECK(shape()[d] == 1, "squeeze: dim {} has size {}, expected 1 (shape {})", d, shape()[d],
             shape());
    Shape shape = this->shape(), st = strides();
    shape.erase(shape.begin() + d);
    st.erase(st.begin() + d);
    Tensor y = make_view(*this, shape, st, offset());
    return autograd::record("squeeze", y, {*this},
                            [d](const Tensor& dy) { return Grads{dy.unsqueeze(d)}; });
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
    int64_t d = normalize_dim(dim_in, dim() + 1, "unsqueeze");
    Shape shape = this->shape(), st = strides();
    int64_t stride = d < dim() ? shape[d] * st[d] : 1;
    shape.insert(shape.begin() + d, 1);
    st.insert(st.begin() + d, stride);
    Tensor y = make_view(*this, shape, st, offset());
    return autograd::record("unsqueeze", y, {*this},
                            [d](const Tensor& dy) { return Grads{dy.squeeze(d)}; });
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
    Tensor y = Tensor::empty(shape(), dtype(), device());
    copy_into(y, *this);
    return autograd::record("clone", y, {*this}, [](const Tensor& dy) { return Grads{dy}; });
}

Tensor Tensor::to(DType target) const {
    if (target == dtype()) return *this;
    Tensor y = Tensor::empty(shape(), target, device());
    copy_into(y, *this);
    return autograd::record("to", y, {*this},
                            [from = dtype()](const Tensor& dy) { return Grads{dy.to(from)}; });
}

Tensor Tensor::to(Device target) const {
    if (target == device()) return *this;
    Tensor y = Tensor::empty(shape(), dtype(), target);
    copy_into(y, *this);
    return autograd::record("to_device", y, {*this},
                            [from = device()](const Tensor& dy) { return Grads{dy.to(from)}; });
}

}  // namespace qk
