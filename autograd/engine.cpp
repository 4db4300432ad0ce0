// The backward engine: one topological sort, one reverse walk.
//
//   1. Collect every node reachable from the root's grad_fn and order them so that a node comes
//      after every node that consumes its output (iterative DFS post-order, reversed).
//   2. Walk that order with a table node -> gradient of its output. Each node turns its output
//      gradient into input gradients; each goes to the producing node's table entry or, for a
//      leaf, into leaf.grad. A node that reads only a slab of its input (narrow) returns the
//      slab's gradient; the entry keeps such slabs apart and puts them in place when the
//      producing node runs (gather), so a split's pieces fill one buffer without zero-filling it.
//
// One shortcut: a node that can add its input's gradient into a buffer itself (a norm after a
// residual add, Node::adds_into_input_gradient) is handed the gradient its input already has when
// the engine holds that buffer alone, and adds into it in its own pass: the same sum, one pass
// over the residual stream fewer.
//
// The accumulation rule (micrograd's users tripped on it): gradients are always ADDED, both
// between the uses of a tensor inside one graph (x used twice gets both contributions) and across
// backward calls into a leaf's .grad. Nothing resets .grad but zero_grad() or the optimizer.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "core/factory.h"
#include "ops/elementwise.h"

namespace qk::autograd {

namespace {

thread_local bool grad_mode_enabled = true;

std::vector<Node*> topological_order(Node* root) {
    std::vector<Node*> post_order;
    std::unordered_set<Node*> visited{root};
    std::vector<std::pair<Node*, size_t>> stack{{root, 0}};  // (node, next input to visit)
    while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->inputs.size()) {
            Node* child = node->inputs[next++].fn.get();
            if (child && visited.insert(child).second) stack.push_back({child, 0});
        } else {
            post_order.push_back(node);
            stack.pop_back();
        }
    }
    return {post_order.rbegin(), post_order.rend()};
}

// True when nothing but `grad` can see its memory: then the leaf may keep it without a copy.
bool exclusively_owned(const Tensor& grad, DType dtype) {
    return grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 &&
           grad.is_contiguous() && grad.offset() == 0 && grad.dtype() == dtype &&
           grad.storage()->nbytes() == static_cast<size_t>(grad.numel()) * dtype_size(dtype);
}

void accumulate_into_leaf(TensorImpl& leaf, Tensor grad) {
    if (!leaf.grad) {
        // The first gradient is kept as it is when nothing else can see or change its memory;
        // otherwise a copy (a cast or contiguous() that copied already made one).
        Tensor g = grad.to(leaf.dtype).contiguous();
        const bool copied = !g.same(grad);
        grad = Tensor();  // drop this handle, so that g may be the only one left
        leaf.grad = (copied || exclusively_owned(g, leaf.dtype) ? g : g.clone()).impl_ptr();
    } else {
        Tensor existing(leaf.grad);
        add_(existing, grad);
    }
}

// Adds g into a node's pending output gradient. In place when nothing but the engine holds the
// pending tensor (the usual case: a fresh backward result), which saves allocating, and touching
// for the first time, one more full-size tensor per junction (every residual connection is one).
void accumulate_pending(Tensor& pending, const Tensor& g) {
    if (exclusively_owned(pending, pending.dtype()) && g.dtype() == pending.dtype())
        add_(pending, g);
    else
        pending = pending + g;
}

// Leaves with grad-ready hooks, and how many edges into each the walk has still to pass: the
// hooks of a leaf run when its count reaches 0 (its gradient is then complete), and those of
// leaves that some edges never reached (no gradient flowed through them) at the end of the pass.
class ReadyHooks {
  public:
    explicit ReadyHooks(const std::vector<Node*>& order) {
        for (Node* node : order)
            for (const Edge& edge : node->inputs)
                if (edge.leaf && !edge.leaf->grad_ready_hooks.empty()) {
                    if (uses_left_.find(edge.leaf.get()) == uses_left_.end())
                        leaves_.push_back(edge.leaf.get());
                    ++uses_left_[edge.leaf.get()];
                }
    }
    void edge_passed(const Edge& edge) {
        if (!edge.leaf) return;
        auto found = uses_left_.find(edge.leaf.get());
        if (found != uses_left_.end() && --found->second == 0) run(*edge.leaf);
    }
    void run_the_rest() {
        for (TensorImpl* leaf : leaves_)
            if (uses_left_[leaf] > 0) {
                uses_left_[leaf] = 0;
                run(*leaf);
            }
    }
    static void run(TensorImpl& leaf) {
        for (const auto& hook : leaf.grad_ready_hooks) hook();
    }

  private:
    std::unordered_map<TensorImpl*, int> uses_left_;
    std::vector<TensorImpl*> leaves_;  // in the order the walk meets them
};

void check_gradient(const Node& node, size_t i, const Tensor& grad) {
    const Edge& edge = node.inputs[i];
    Shape expected = edge.shape;
    if (auto slab = node.gradient_slab()) {  // a slab: edge.shape except along slab->dim
        const bool fits = slab->dim < grad.dim() &&
                          grad.dim() == static_cast<int64_t>(expected.size()) &&
                          slab->start + grad.size(slab->dim) <= expected[slab->dim];
        if (fits) expected[slab->dim] = grad.size(slab->dim);
    }
    QK_CHECK(grad.shape() == expected,
             "backward of {}: gradient {} has shape {}, but that input has shape {}", node.name(),
             i, grad.shape(), edge.shape);
}

// A node's output gradient while its consumers are still adding to it: a full-size sum, and the
// slabs that consumers which read only part of it (narrow) handed back.
struct Pending {
    Tensor sum;
    std::vector<std::pair<Slab, Tensor>> slabs;
    Shape shape;  // the full gradient's (the node's output's), for the slabs
    DType dtype = DType::f32;
};

// True when the slabs tile the whole shape along one dim, each exactly once (split's pieces).
bool slabs_tile(std::vector<std::pair<Slab, Tensor>>& slabs, const Shape& shape) {
    const int64_t dim = slabs.front().first.dim;
    std::sort(slabs.begin(), slabs.end(),
              [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
    int64_t next = 0;
    for (const auto& [slab, piece] : slabs) {
        if (slab.dim != dim || slab.start != next) return false;
        next += piece.size(dim);
    }
    return next == shape[dim];
}

// The full gradient: the sum, with each slab added in its place. When the slabs tile the
// gradient, they are copied into a fresh buffer and nothing is zero-filled.
Tensor gather(Pending& pending) {
    if (pending.slabs.empty()) return std::move(pending.sum);
    const Device device = pending.slabs.front().second.device();
    Tensor full = std::move(pending.sum);
    const bool tiled = !full.defined() && slabs_tile(pending.slabs, pending.shape);
    if (tiled) {
        full = Tensor::empty(pending.shape, pending.dtype, device);
    } else if (!full.defined()) {
        full = zeros(pending.shape, pending.dtype, device);
    } else {
        full = full.to(pending.dtype);
        if (!exclusively_owned(full, pending.dtype)) full = full.clone();  // it is added into
    }
    std::vector<Tensor> places, pieces;  // tiled: copied in, together (one launch on cuda)
    for (const auto& [slab, piece] : pending.slabs) {
        Tensor place = full.narrow(slab.dim, slab.start, piece.size(slab.dim));
        if (tiled) {
            places.push_back(place);
            pieces.push_back(piece);
        } else {
            add_(place, piece);
        }
    }
    copy_into_all(places, pieces);
    pending.slabs.clear();
    return full;
}

// The node -> pending output gradient table of the walk.
class GradientTable {
  public:
    GradientTable(const Tensor& root, const Tensor& grad_root) {
        table_.emplace(root.grad_fn().get(), Pending{grad_root, {}, root.shape(), root.dtype()});
    }
    // Adds a consumer's contribution to `producer`'s output gradient.
    void add(Node* producer, Pending incoming) {
        auto [entry, fresh] = table_.try_emplace(producer, std::move(incoming));
        if (fresh) return;
        Pending& pending = entry->second;
        for (auto& piece : incoming.slabs) pending.slabs.push_back(std::move(piece));
        if (!incoming.sum.defined()) return;
        if (pending.sum.defined())
            accumulate_pending(pending.sum, incoming.sum);
        else
            pending.sum = std::move(incoming.sum);
    }
    // `producer`'s pending output gradient when it is one whole buffer that nothing else holds, of
    // the shape and dtype given (a node may then add into it), or null.
    Tensor* sum_to_add_into(Node* producer, const Shape& shape, DType dtype) {
        auto found = table_.find(producer);
        if (found == table_.end()) return nullptr;
        Tensor& sum = found->second.sum;
        const bool usable = sum.defined() && sum.shape() == shape && exclusively_owned(sum, dtype);
        return usable ? &sum : nullptr;
    }
    // Removes and returns `node`'s output gradient (empty if none flowed in): the walk reaches a
    // node after all its consumers, so the gradient is complete, and it is freed once consumed.
    std::optional<Pending> take(Node* node) {
        auto found = table_.find(node);
        if (found == table_.end()) return std::nullopt;
        Pending pending = std::move(found->second);
        table_.erase(found);
        return pending;
    }

  private:
    std::unordered_map<Node*, Pending> table_;
};

Grads call_backward(Node& node, Pending output_gradient, GradientTable& grads) {
    QK_CHECK(!node.released,
             "backward: the graph through '{}' was already freed by an earlier backward(); "
             "call backward(/*retain_graph=*/true) the first time to go through it twice",
             node.name());
    Tensor* into = nullptr;  // input 0's gradient so far, for a node that adds into it
    if (node.adds_into_input_gradient() && !node.inputs.empty() && node.inputs[0].fn) {
        const Edge& edge = node.inputs[0];
        into = grads.sum_to_add_into(edge.fn.get(), edge.shape, edge.dtype);
    }
    Grads dinputs = into ? node.backward_adding(gather(output_gradient), *into)
                         : node.backward(gather(output_gradient));
    QK_CHECK(!into || dinputs.empty() || !dinputs[0].defined(),
             "backward of {}: added into its input's gradient and returned one as well",
             node.name());
    // The gathered dy is a temporary, gone here: an input gradient that is a view of it (a
    // transpose's, a reshape's) then holds its memory alone and is added into without a copy.
    QK_CHECK(dinputs.size() == node.inputs.size(),
             "backward of {}: returned {} gradients for {} inputs", node.name(), dinputs.size(),
             node.inputs.size());
    return dinputs;
}

// Sends the gradient of `node`'s input i where that input came from: the producing node's
// pending entry, or the leaf's .grad. A slab (narrow's gradient) travels as a slab.
void send(const Node& node, size_t i, Tensor g, GradientTable& grads) {
    const Edge& edge = node.inputs[i];
    if (!g.defined() || (!edge.fn && !edge.leaf)) return;  // a constant, or no gradient
    check_gradient(node, i, g);
    Pending incoming{Tensor(), {}, edge.shape, edge.dtype};
    if (const std::optional<Slab> slab = node.gradient_slab())
        incoming.slabs.emplace_back(*slab, std::move(g));
    else
        incoming.sum = std::move(g);
    if (edge.leaf)
        accumulate_into_leaf(*edge.leaf, gather(incoming));
    else
        grads.add(edge.fn.get(), std::move(incoming));
}

void free_saved(Node& node) {
    node.release();
    node.released = true;
}
}  // namespace

Grads Node::backward_adding(const Tensor&, const Tensor&) {
    throw Error(
        fmt::format("backward of {}: this node does not add into its input's gradient", name()));
}

bool grad_enabled() { return grad_mode_enabled; }
void set_grad_enabled(bool on) { grad_mode_enabled = on; }

bool needs_recording(const std::vector<Tensor>& inputs) {
    if (!grad_enabled()) return false;
    for (const Tensor& t : inputs)
        if (t.defined() && t.requires_grad()) return true;
    return false;
}
bool needs_recording(std::initializer_list<Tensor> inputs) {
    return needs_recording(std::vector<Tensor>(inputs));
}

Tensor attach(Tensor output, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs) {
    for (const Tensor& t : inputs) {
        Edge edge;
        if (t.defined()) {
            edge.shape = t.shape();
            edge.dtype = t.dtype();
            if (t.requires_grad()) {
                if (t.grad_fn())
                    edge.fn = t.grad_fn();
                else
                    edge.leaf = t.impl_ptr();
            }
        }
        node->inputs.push_back(std::move(edge));
    }
    output.impl().grad_fn = std::move(node);
    output.impl().requires_grad = true;
    return output;
}

void run_backward(const Tensor& root, const Tensor& grad_root, bool retain_graph) {
    QK_CHECK(root.requires_grad(),
             "backward: this tensor does not require grad (no input of the ops that made it "
             "requires grad, or it was computed under NoGradGuard)");
    QK_CHECK(grad_root.shape() == root.shape(),
             "backward: gradient shape {} differs from the tensor's shape {}", grad_root.shape(),
             root.shape());
    NoGradGuard no_grad;  // the backward pass itself is not recorded
    if (root.is_leaf()) {
        accumulate_into_leaf(root.impl(), grad_root);
        ReadyHooks::run(root.impl());
        return;
    }
    // The walk, as micrograd's: each node, consumers first, turns the gradient of its output
    // into gradients of its inputs, and each is added where that input came from.
    const std::vector<Node*> order = topological_order(root.grad_fn().get());
    GradientTable grads(root, grad_root);
    ReadyHooks hooks(order);  // extra: data-parallel training starts reducing a leaf's gradient
    for (Node* node : order) {
        std::optional<Pending> dy = grads.take(node);
        if (!dy) continue;  // no gradient flowed into this node
        Grads dinputs = call_backward(*node, std::move(*dy), grads);
        for (size_t i = 0; i < dinputs.size(); ++i) {
            send(*node, i, std::move(dinputs[i]), grads);
            hooks.edge_passed(node->inputs[i]);
        }
        if (!retain_graph) free_saved(*node);  // extra: memory back as soon as possible
    }
    hooks.run_the_rest();
}

}  // namespace qk::autograd

namespace qk {

void Tensor::backward(bool retain_graph) const {
    QK_CHECK(numel() == 1,
             "backward: without an explicit gradient the tensor must have one element, got shape "
             "{}; pass backward(grad_output)",
             shape());
    autograd::run_backward(*this, ones(shape(), dtype(), device()), retain_graph);
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
    autograd::run_backward(*this, grad_output, retain_graph);
}

}  // namespace qk
