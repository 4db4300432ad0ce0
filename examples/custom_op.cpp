// custom_op: how to add a differentiable op from outside the library, read top to bottom.
//
//   In this repository:  meson compile -C build && ./build/examples/custom_op
//   Against an installed qk:  c++ -std=c++20 -O2 custom_op.cpp $(pkg-config --cflags --libs qk)
//
// The op is swish (also called SiLU), the activation of many recent MLPs:
//
//     y = swish(x) = x · σ(x),        σ(x) = 1 / (1 + e^-x),   σ'(x) = σ(x) (1 - σ(x))
//
// Its derivative, by the product rule:
//
//     dy/dx = σ(x) + x · σ(x) (1 - σ(x))  =  σ(x) · (1 + x (1 - σ(x)))
//
// Backward, per element (the chain rule; dy is the gradient of the loss with respect to y):
//
//     dx = dy · σ(x) · (1 + x (1 - σ(x)))
//
// Saved for the backward: x. σ(x) is recomputed there, trading one exp for not storing a
// second tensor.
//
// Could we just write `x * sigmoid(x)`? Yes: a composite of library ops needs no backward at all
// (each piece brings its own) and is the reference we test against below. A fused op is what you
// write when the composite is too slow or keeps too much memory: it makes one pass instead of two
// and saves one tensor instead of two.
//
// The steps: (1) the CPU kernels, (2) the autograd node, written two ways, (3) gradcheck in
// float64, (4) using the op in a small computation with backward().
#include <cmath>

#include "qk.h"

using namespace qk;

// ---- 1. The kernels: plain loops on raw pointers to contiguous data ------------------------
// Templated on the element type: float for training, double for gradcheck.
namespace kernels {

template <class T>
T sigmoid(T x) {
    return T(1) / (T(1) + std::exp(-x));
}

// y: (n), x: (n).   y = x σ(x)
template <class T>
void swish_forward(T* y, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

// dx: (n), dy: (n), x: (n).   dx = dy σ (1 + x (1 - σ))
template <class T>
void swish_backward(T* dx, const T* dy, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const T s = sigmoid(x[i]);
        dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
    }
}

}  // namespace kernels

// Tensor-level wrappers: allocate the output, pick the kernel for the dtype and device.
// dispatch_float turns the runtime dtype into T (and throws a qk::Error for int32).
Tensor run_swish_forward(const Tensor& x) {  // x contiguous
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    QK_CHECK(x.device() == Device::cpu, "swish: only a cpu kernel exists, x is on {}", x.device());
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        kernels::swish_forward(y.data<T>(), x.data<T>(), x.numel());
    });
    return y;
}

Tensor run_swish_backward(const Tensor& dy_any, const Tensor& x) {  // x contiguous
    Tensor dy = dy_any.contiguous();  // upstream gradients may be views with any strides
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        kernels::swish_backward(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
    });
    return dx;
}

// ---- 2a. The autograd node, the short way: autograd::record --------------------------------
// record(name, output, inputs, backward) attaches a node to `output` when some input requires
// grad (and grad mode is on); otherwise it drops the lambda and returns output untouched. The
// lambda gets dy and returns one gradient per input, in order, each of that input's shape.
//
// Two rules for what the lambda captures:
//   * save tensors detached: a saved tensor that kept its grad_fn could form a reference cycle;
//   * capture by value: the lambda outlives this function (it runs during backward()).
Tensor swish(const Tensor& x_in) {
    QK_CHECK(is_compute_dtype(x_in.dtype()),
             "swish: x must be float32 or float64, got {} of shape {}", x_in.dtype(), x_in.shape());
    // The library's rule for inputs (autograd/node.h, docs/architecture.md#autograd): detached,
    // then contiguous, since a raw-pointer kernel needs contiguous data and copying a detached
    // tensor records no node of its own; the node is recorded on the caller's x_in.
    Tensor x = autograd::contiguous_input(x_in);
    Tensor y = run_swish_forward(x);
    return autograd::record("swish", y, {x_in}, [x = autograd::saved(x)](const Tensor& dy) {
        return std::vector<Tensor>{run_swish_backward(dy, x)};
    });
}

// ---- 2b. The same node written by hand: a struct deriving from autograd::Node ---------------
// Worth it when the node needs state that a lambda expresses badly, or to see what record() does.
// The pure virtual backward() means a node without a backward does not compile.
struct SwishNode final : autograd::Node {
    Tensor x;  // saved input, detached

    std::string name() const override { return "swish_node"; }
    std::vector<Tensor> backward(const Tensor& dy) override { return {run_swish_backward(dy, x)}; }
    // Called after backward() (unless retain_graph): free what was saved as early as possible.
    void release() override { x = Tensor(); }
};

Tensor swish_by_hand(const Tensor& x_in) {
    QK_CHECK(is_compute_dtype(x_in.dtype()),
             "swish: x must be float32 or float64, got {} of shape {}", x_in.dtype(), x_in.shape());
    Tensor x = autograd::contiguous_input(x_in);
    Tensor y = run_swish_forward(x);
    if (!autograd::needs_recording({x_in})) return y;  // inference: no node, nothing saved
    auto node = std::make_shared<SwishNode>();
    node->x = x;
    // attach() records one edge per input (its grad_fn, or the leaf itself) and makes the node
    // y's grad_fn; the engine later calls node->backward(dy) and routes the gradients.
    return autograd::attach(y, node, {x_in});
}

// ---- 3. Check the backward against finite differences ---------------------------------------
// gradcheck wants float64 leaves with requires_grad. It perturbs each input element by ±eps and
// compares sum(f(x) · r) — r a fixed random probe, so every term of the backward is exercised —
// with what backward() computed.
bool check_gradients() {
    Generator gen(0);
    Tensor x = normal({4, 5}, 0, 3, kF64, gen).requires_grad_();
    bool all_ok = true;
    auto report = [&](const char* what, const autograd::GradcheckResult& r) {
        fmt::print("  gradcheck {:<34} {}  (max |analytic - numeric| = {:.2e})\n", what,
                   r.ok ? "ok  " : "FAIL", r.max_abs_error);
        if (!r.ok) fmt::print("{}", r.report);
        all_ok = all_ok && r.ok;
    };
    report("swish (record)", gradcheck([&] { return swish(x); }, {x}));
    report("swish (hand-written Node)", gradcheck([&] { return swish_by_hand(x); }, {x}));
    report("swish of a transposed view", gradcheck([&] { return swish(x.t()); }, {x}));
    report("swish inside a bigger expression",
           gradcheck([&] { return swish(x * x - 1.0) * swish_by_hand(x); }, {x}));

    // And the forward against the composite reference.
    Tensor composite = x * sigmoid(x);
    double worst = 0;
    auto a = swish(x).to_vector<double>(), b = composite.to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    fmt::print("  forward vs x * sigmoid(x): max |diff| = {:.2e}\n", worst);
    return all_ok && worst < 1e-12;
}

// ---- 4. Use it: fit y = swish(a·x + b) to data made with a = 1.5, b = 0.5 ------------------
// Plain gradient descent in float32: forward, backward(), then update the parameters under
// NoGradGuard (the update itself must not be recorded) and reset their gradients, which
// otherwise accumulate across backward() calls.
void fit_a_line_through_swish() {
    Tensor xs = from_vector({-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3});
    Tensor targets;
    {
        NoGradGuard no_grad;
        targets = swish(xs * 1.5 + 0.5);
    }
    Tensor a = full({1}, 0.5).requires_grad_(), b = zeros({1}).requires_grad_();
    const double lr = 0.2;
    for (int step = 0; step <= 150; ++step) {
        Tensor diff = swish(a * xs + b) - targets;
        Tensor loss = mean(diff * diff);
        loss.backward();
        if (step % 25 == 0)
            fmt::print("  step {:3d}  loss {:.3e}  a {:.4f}  b {:.4f}\n", step, loss.item(),
                       a.item(), b.item());
        NoGradGuard no_grad;
        add_(a, a.grad() * -lr);
        add_(b, b.grad() * -lr);
        a.zero_grad();
        b.zero_grad();
    }
}

int main() {
    fmt::print("1-3. swish(x) = x * sigmoid(x): kernels, two autograd nodes, gradcheck\n");
    const bool ok = check_gradients();

    fmt::print("\nBad input gives a qk::Error that names the op:\n");
    try {
        swish(from_ids({1, 2, 3}));
    } catch (const Error& e) {
        fmt::print("  {}\n", e.what());
    }

    fmt::print("\n4. Gradient descent through swish, recovering a = 1.5, b = 0.5:\n");
    fit_a_line_through_swish();
    fmt::print("\n{}\n", ok ? "All checks passed." : "SOME CHECKS FAILED.");
    return ok ? 0 : 1;
}
