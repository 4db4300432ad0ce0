// Node: one recorded op in the autograd graph.
//
// An op whose inputs require grad records a Node on its output. The node keeps, per input, an
// Edge: the input's own grad_fn (an interior tensor) or its TensorImpl (a leaf), plus its shape
// so the engine can check what backward returns. backward(dy) returns one gradient per input, in
// input order; an undefined Tensor means "no gradient for this input".
//
// Saved tensors are always detached (saving an output with its grad_fn would make a cycle).
// release() drops them after backward so that activations are freed as soon as possible.
//
// Library ops use record(): forward and backward side by side, the backward a lambda that
// captures what it saved. Users may also derive from Node directly (examples/custom_op.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/tensor.h"

namespace qk::autograd {

struct Edge {
    std::shared_ptr<Node> fn;          // set when the input was produced by an op
    std::shared_ptr<TensorImpl> leaf;  // set when the input is a leaf that requires grad
    Shape shape;                       // the input's shape: its gradient must have it
    DType dtype = DType::f32;
};

// Where a gradient lands when it covers only a slab of its input: input.narrow(dim, start, len),
// len the gradient's own size along dim; the input's gradient is zero everywhere else.
struct Slab {
    int64_t dim = 0, start = 0;
};

// What a backward returns: one gradient per input, in the inputs' order (an undefined Tensor for
// an input that gets none).
using Grads = std::vector<Tensor>;

struct Node {
    virtual ~Node() = default;
    virtual std::string name() const = 0;
    virtual Grads backward(const Tensor& grad_output) = 0;
    virtual void release() = 0;  // drop saved tensors; backward may not be called afterwards
    // Set for a node of one input whose backward returns only a slab of that input's gradient
    // (narrow): the engine puts the slab in place. The pieces of a split then go back into one
    // buffer, each copied once, instead of one zero-filled input-sized tensor per piece, all added.
    virtual std::optional<Slab> gradient_slab() const { return std::nullopt; }
    // Set for a node that can add its gradient for input 0 into that input's gradient so far, in
    // the pass that computes it: a norm reading a residual stream, whose gradient the residual
    // path has already started (llm.c's layernorm backward adds into dresidual the same way).
    // When the engine holds such a buffer it calls backward_adding instead of backward and skips
    // its own addition; the node returns an undefined gradient for input 0.
    virtual bool adds_into_input_gradient() const { return false; }
    virtual Grads backward_adding(const Tensor& grad_output, const Tensor& input_gradient);

    std::vector<Edge> inputs;
    bool released = false;
};

// Wraps a backward lambda `std::vector<Tensor>(const Tensor& dy)` as a Node.
template <typename BackwardFn>
struct LambdaNode final : Node {
    LambdaNode(std::string op, BackwardFn fn) : op_name(std::move(op)), fn(std::move(fn)) {}
    std::string name() const override { return op_name; }
    Grads backward(const Tensor& dy) override { return (*fn)(dy); }
    void release() override { fn.reset(); }

    std::string op_name;
    std::optional<BackwardFn> fn;  // owns the saved tensors it captured
};

// A backward lambda `std::vector<Tensor>(const Tensor& dy, const Tensor& into)` as a Node that adds
// input 0's gradient into `into` when the engine hands it one (undefined otherwise: a plain
// backward).
template <typename BackwardFn>
struct AddingLambdaNode final : Node {
    AddingLambdaNode(std::string op, BackwardFn fn) : op_name(std::move(op)), fn(std::move(fn)) {}
    std::string name() const override { return op_name; }
    Grads backward(const Tensor& dy) override { return (*fn)(dy, Tensor()); }
    bool adds_into_input_gradient() const override { return true; }
    Grads backward_adding(const Tensor& dy, const Tensor& into) override { return (*fn)(dy, into); }
    void release() override { fn.reset(); }

    std::string op_name;
    std::optional<BackwardFn> fn;
};

// True when an op on these inputs must record a node.
bool needs_recording(std::initializer_list<Tensor> inputs);
bool needs_recording(const std::vector<Tensor>& inputs);

// Makes `node` the grad_fn of `output`, with one edge per input. Returns output.
Tensor attach(Tensor output, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs);

// Inputs and saved tensors: the one rule of every op that records a node.
//  - Up front, the op takes each input once as `Tensor x = contiguous_input(x_in)`: detached, so
//    that the copy contiguous() may make records no node of its own, and contiguous, the layout
//    the kernels read. An op whose kernels read strides (matmul, linear, the binary elementwise
//    ops, the reductions) copies nothing up front; where it may copy later (a GEMM operand in a
//    layout GEMM cannot read) it works from `saved(x_in)`, the detached view.
//  - It records the node on the caller's tensors, record(op, y, {x_in, ...}, ...), so that their
//    gradients reach them directly, not through a copy.
//  - The backward lambda captures every tensor it keeps as `[x = saved(x), y = saved(y)]`,
//    outputs included (an output saved with its grad_fn would make a cycle).
//  - The backward makes dy contiguous itself (`dy_in.contiguous()`) when its kernel reads rows; it
//    runs under NoGradGuard, so that records nothing.
// Both helpers keep an undefined tensor (no bias, no weight) undefined.
inline Tensor saved(const Tensor& t) { return t.defined() ? t.detach() : Tensor(); }
inline Tensor contiguous_input(const Tensor& t) {
    return t.defined() ? t.detach().contiguous() : Tensor();
}

// The usual way an op records itself:
//   return record("tanh", y, {x_in}, [y = saved(y)](const Tensor& dy) { ... return {dx}; });
// Does nothing (and drops the lambda) when grad mode is off or no input requires grad.
template <typename BackwardFn>
Tensor record(std::string op, Tensor output, const std::vector<Tensor>& inputs, BackwardFn&& fn) {
    if (!needs_recording(inputs)) return output;
    auto node = std::make_shared<LambdaNode<std::decay_t<BackwardFn>>>(
        std::move(op), std::forward<BackwardFn>(fn));
    return attach(std::move(output), std::move(node), inputs);
}

// record() for a backward that can add input 0's gradient into a buffer (AddingLambdaNode).
template <typename BackwardFn>
Tensor record_adding(std::string op, Tensor output, const std::vector<Tensor>& inputs,
                     BackwardFn&& fn) {
    if (!needs_recording(inputs)) return output;
    auto node = std::make_shared<AddingLambdaNode<std::decay_t<BackwardFn>>>(
        std::move(op), std::forward<BackwardFn>(fn));
    return attach(std::move(output), std::move(node), inputs);
}

// Runs the reverse pass from `root` with upstream gradient `grad_root` (see engine.cpp).
void run_backward(const Tensor& root, const Tensor& grad_root, bool retain_graph);

}  // namespace qk::autograd
