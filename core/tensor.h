// Tensor: a cheap handle to (storage, shape, strides, offset, dtype) plus an autograd slot.
//
// Copying a Tensor copies the handle: both copies see the same data and the same .grad.
// Views (reshape, transpose, narrow, expand, ...) share storage and are differentiable; their
// definitions live in ops/view.cpp because each one records an autograd node.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace qk {

namespace autograd {
struct Node;
}

struct TensorImpl {
    std::shared_ptr<Storage> storage;
    Shape shape;
    Shape strides;  // in elements; 0 along a broadcast (expanded) dim
    int64_t offset = 0;
    DType dtype = DType::f32;
    bool requires_grad = false;
    std::shared_ptr<TensorImpl> grad;         // accumulated gradient (leaves)
    std::shared_ptr<autograd::Node> grad_fn;  // the op that produced this tensor, if recorded
    // Leaves: called once per backward pass that reaches this leaf, as soon as its .grad holds
    // every contribution of that pass (data-parallel training starts reducing it then).
    std::vector<std::function<void()>> grad_ready_hooks;
};

class Tensor {
  public:
    Tensor() = default;  // an undefined tensor: no storage; used for "no gradient"
    explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

    // Allocates uninitialised contiguous storage.
    static Tensor empty(const Shape& shape, DType dtype = kF32, Device device = Device::cpu);

    bool defined() const { return impl_ != nullptr; }
    const Shape& shape() const { return impl().shape; }
    const Shape& strides() const { return impl().strides; }
    int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
    int64_t size(int64_t d) const;  // negative d counts from the end
    int64_t numel() const { return numel_of(impl().shape); }
    int64_t offset() const { return impl().offset; }
    DType dtype() const { return impl().dtype; }
    Device device() const { return impl().storage->device(); }
    bool is_contiguous() const;
    const std::shared_ptr<Storage>& storage() const { return impl().storage; }

    // Typed pointer to the first element (storage + offset); checks that T matches dtype.
    template <typename T>
    T* data() const;
    void* raw_data() const;

    // Element access (cpu), converting to double: t.at({i, j}). item(), to_vector() and printing
    // also take cuda tensors: they copy to the host first.
    double at(std::initializer_list<int64_t> index) const;
    void set(std::initializer_list<int64_t> index, double value);
    double item() const;  // the one element of a tensor with numel() == 1
    template <typename T>
    std::vector<T> to_vector() const;  // row-major copy of all elements

    // ---- autograd -------------------------------------------------------------------------
    bool requires_grad() const { return impl().requires_grad; }
    Tensor& requires_grad_(bool on = true);  // only on leaves
    bool is_leaf() const { return impl().grad_fn == nullptr; }
    Tensor grad() const { return Tensor(impl().grad); }
    void set_grad(const Tensor& g);
    void zero_grad() { impl().grad.reset(); }
    // hook() runs during each backward() as soon as this leaf's gradient is complete: after the
    // last op that uses the leaf has added its part, while the rest of the graph is still being
    // walked. Only on leaves that require grad.
    void on_grad_ready(std::function<void()> hook);
    void clear_grad_ready_hooks() { impl().grad_ready_hooks.clear(); }
    const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
    // Reverse-mode pass from this tensor. Without an explicit gradient it must have one element.
    void backward(bool retain_graph = false) const;
    void backward(const Tensor& grad_output, bool retain_graph = false) const;
    Tensor detach() const;  // same data, cut from the graph

    // ---- views (ops/view.cpp): share storage, record autograd nodes ------------------------
    Tensor view(const Shape& shape) const;     // requires contiguous input; -1 infers a size
    Tensor reshape(const Shape& shape) const;  // view when possible, else copies
    Tensor transpose(int64_t dim0, int64_t dim1) const;
    Tensor permute(const Shape& order) const;
    Tensor t() const { return transpose(-2, -1); }
    Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
    Tensor slice(int64_t dim, int64_t start, int64_t end) const {
        return narrow(dim, start, end - start);
    }
    Tensor select(int64_t dim, int64_t index) const;  // narrow + squeeze
    Tensor expand(const Shape& shape) const;          // broadcast with stride 0
    Tensor squeeze(int64_t dim) const;
    Tensor unsqueeze(int64_t dim) const;
    Tensor flatten() const { return reshape({numel()}); }
    Tensor contiguous() const;     // this tensor if already contiguous, else a differentiable copy
    Tensor clone() const;          // always a differentiable copy
    Tensor to(DType dtype) const;  // differentiable cast
    // A copy on `device` (this tensor itself when already there); differentiable: the gradient
    // goes back to this tensor's device.
    Tensor to(Device device) const;

    TensorImpl& impl() const;
    const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
    bool same(const Tensor& other) const { return impl_ == other.impl_; }

  private:
    std::shared_ptr<TensorImpl> impl_;
};

// A view of `base`'s storage with the given geometry (no autograd); used by the view ops.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

// Copies src into dst element by element (shapes equal, any strides, dtypes may differ, devices
// may differ: a cross-device copy goes through a contiguous staging copy). No autograd.
void copy_into(const Tensor& dst, const Tensor& src);

// copy_into(dst[i], src[i]) for every i. On cuda, the copies between two dtypes that the packed
// kernel takes share one launch: a gradient's pieces put in place, q, k and v rounded together.
void copy_into_all(const std::vector<Tensor>& dst, const std::vector<Tensor>& src);

// Whether kernels that write t's values run now: not while a dry-run launch ledger is open and t
// is on cuda (cuda/ledger.h records those launches without running them). A copy made or
// rewritten then holds nothing: it serves later dry runs only (Storage::CastCopy).
bool writes_take_effect(const Tensor& t);

// Records that t's values were written in place (advances its storage's version, so copies made
// from the old values are not used again). The library's in-place writes call it themselves.
void mark_written(const Tensor& t);

// Whether t is its storage's whole buffer, contiguous from its start (a parameter, a fresh
// result): the tensors whose storage can keep a cast copy of them.
bool is_whole_buffer(const Tensor& t);

// `t` cast to `dtype` (no autograd). A tensor that is its whole buffer (a parameter) keeps the
// result beside its storage and returns it again until its values are written
// (Storage::cast_copy): bf16 training rounds each weight once, not at every GEMM. Anything else
// is cast afresh.
Tensor cast_once(const Tensor& t, DType dtype);

// Whether cast_once(t, dtype) would now return a kept copy, with no cast of its own.
bool has_kept_cast(const Tensor& t, DType dtype);

// Keeps `cast`, t's values cast to cast.dtype() by the kernel that wrote t (softmax's rounded
// copy), as t's cast copy: cast_once(t, cast.dtype()) returns it until t is written. t must be
// its whole buffer and cast a contiguous tensor of t's shape on t's device.
void keep_cast(const Tensor& t, const Tensor& cast);

std::string to_string(const Tensor& t);

// Launchers of cuda/copy.cu (device pointers; built only with the CUDA backend).
namespace cuda {
// dst, src: device buffers read through their strides over `shape` (rank <= 8 after merging
// dims); dtypes may differ.    dst[i] = cast(src[i])
void copy_strided(void* dst, DType dst_dtype, const Shape& dst_strides, const void* src,
                  DType src_dtype, const Shape& src_strides, const Shape& shape);
// Several copy_strided calls of the same dtypes; those that take the packed kernel (innermost
// dims contiguous, sizes and strides multiples of 4) share one launch, up to 4 of them.
struct StridedCopy {
    void* dst;
    Shape dst_strides;
    const void* src;
    Shape src_strides;
    Shape shape;
};
void copy_strided_all(DType dst_dtype, DType src_dtype, const std::vector<StridedCopy>& copies);
// dst: (n) contiguous on the device.    dst[i] = value
void fill(void* dst, DType dtype, int64_t n, double value);
}  // namespace cuda

}  // namespace qk

template <>
struct fmt::formatter<qk::Tensor> : fmt::formatter<std::string_view> {
    auto format(const qk::Tensor& t, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(qk::to_string(t), ctx);
    }
};
