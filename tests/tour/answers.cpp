// The solutions of docs/tour.md's code exercises (exercises.h), checked by test_tour.cpp.
#include "exercises.h"

namespace tour {

using namespace qk;

// Stop 3: a node written by hand. cube(x) = x³, saved x, dx = 3x²·dy.
struct CubeNode final : autograd::Node {
    Tensor x;  // saved input, detached
    std::string name() const override { return "cube"; }
    std::vector<Tensor> backward(const Tensor& dy) override { return {dy * x * x * 3.0}; }
    void release() override { x = Tensor(); }
};

Tensor cube(const Tensor& x_in) {
    Tensor x = x_in.detach();
    Tensor y = x * x * x;  // computed without recording: x is detached
    if (!autograd::needs_recording({x_in})) return y;
    auto node = std::make_shared<CubeNode>();
    node->x = x;
    return autograd::attach(y, node, {x_in});
}

// Stop 5: why gradcheck uses a random probe. This softmax's backward subtracts the *mean* of dy
// where the true one subtracts the y-weighted sum Σ_j dy_j y_j: the two agree whenever dy is
// uniform, which is exactly the upstream gradient of sum(out).
Tensor softmax_with_wrong_backward(const Tensor& x_in) {
    Tensor x = x_in.detach();
    Tensor y = softmax(x);
    return autograd::record("wrong_softmax", y, {x_in}, [y](const Tensor& dy) {
        return std::vector<Tensor>{y * (dy - mean(dy, {-1}, /*keepdim=*/true))};
    });
}

// Stop 12: a new attention variant from existing ops: cosine attention with a temperature g,
// s = g · (q/‖q‖)·(k/‖k‖). The logits are bounded by g whatever q and k do, and the whole
// variant (normalise, then the fused attention with g as its learnable scale) differentiates.
Tensor cosine_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        AttentionSignals* signals) {
    AttentionOptions options{.causal = true, .scale_tensor = g};
    return attention(lp_normalize(q, 2.0, -1), lp_normalize(k, 2.0, -1), v, options, signals);
}

}  // namespace tour
