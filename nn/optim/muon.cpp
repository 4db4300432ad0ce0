// Muon (nn/optim/muon.h gives the update). Why orthogonalise: for a weight matrix the gradient's
// momentum is typically dominated by a few directions (its singular values span orders of
// magnitude); replacing M = U S Vᵀ by U Vᵀ gives every direction the same step, which the
// Muon papers find trains the hidden matrices of a transformer faster per token than AdamW.
// Newton–Schulz gets U Vᵀ (approximately) from GEMMs alone, so it runs on either device at
// GEMM speed; an SVD would not.
//
// Everything here is tensor ops under NoGradGuard: the same code on cpu and cuda.
#include "nn/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace {

// Keller Jordan's coefficients: a maximal slope at zero under the constraint that φ stays within
// a band around 1 on (0, 1].
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

// The rows of the parameter this matrix stands for (a view: writes reach the parameter).
Tensor block_of(const Tensor& t, const MuonMatrix& m) {
    return m.rows < 0 ? t : t.narrow(0, m.row_begin, m.rows);
}

}  // namespace

Tensor newton_schulz5(const Tensor& G, int steps) {
    QK_CHECK(G.dim() == 2, "newton_schulz5: G must be a matrix (m, n), got shape {}", G.shape());
    QK_CHECK(is_compute_dtype(G.dtype()),
             "newton_schulz5: G must be float32 or float64, got {} of shape {}", G.dtype(),
             G.shape());
    QK_CHECK(steps >= 0, "newton_schulz5: steps must be >= 0, got {}", steps);
    NoGradGuard no_grad;
    const bool tall = G.size(0) > G.size(1);
    const double frobenius = std::sqrt(sum(G * G).item());
    QK_CHECK(std::isfinite(frobenius), "newton_schulz5: G of shape {} is not finite (‖G‖_F = {})",
             G.shape(), frobenius);
    Tensor X = (tall ? G.t() : G) * (1.0 / std::max(frobenius, 1e-7));  // (k, l), k <= l
    for (int i = 0; i < steps; ++i) {
        Tensor A = matmul(X, X.t());            // (k, k)
        Tensor B = A * kB + matmul(A, A) * kC;  // b·A + c·A²
        X = X * kA + matmul(B, X);              // a·X + B·X
    }
    return tall ? X.t().contiguous() : X;
}

Muon::Muon(std::vector<MuonMatrix> matrices, MuonOptions options)
    : matrices_(std::move(matrices)), options_(options) {
    QK_CHECK(options_.momentum >= 0 && options_.momentum < 1,
             "Muon: momentum must be in [0, 1), got {}", options_.momentum);
    QK_CHECK(std::isfinite(options_.weight_decay) && options_.weight_decay >= 0,
             "Muon: weight_decay must be finite and >= 0, got {}", options_.weight_decay);
    QK_CHECK(options_.ns_steps >= 1 && options_.ns_steps <= 100,
             "Muon: ns_steps must be in [1, 100], got {}", options_.ns_steps);
    for (const MuonMatrix& m : matrices_) {
        QK_CHECK(m.param.defined() && m.param.dim() == 2,
                 "Muon: '{}' must be a 2-D parameter, got shape {}", m.name,
                 m.param.defined() ? m.param.shape() : Shape{});
        QK_CHECK(m.rows < 0 ||
                     (m.row_begin >= 0 && m.rows > 0 && m.row_begin + m.rows <= m.param.size(0)),
                 "Muon: '{}' rows [{}, {}) lie outside its {} rows", m.name, m.row_begin,
                 m.row_begin + m.rows, m.param.size(0));
        const Tensor block = block_of(m.param, m);
        momentum_.push_back(zeros(block.shape(), block.dtype(), block.device()));
    }
}

void Muon::step(double lr) {
    NoGradGuard no_grad;
    ++step_;
    const double mu = options_.momentum;
    for (size_t i = 0; i < matrices_.size(); ++i) {
        const MuonMatrix& m = matrices_[i];
        if (!m.param.grad().defined()) continue;
        Tensor W = block_of(m.param, m), G = block_of(m.param.grad(), m);
        copy_into(momentum_[i], momentum_[i] * mu + G);  // M ← μ·M + G
        const Tensor U = G + momentum_[i] * mu;          // Nesterov
        const Tensor O = newton_schulz5(U, options_.ns_steps);
        const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(W.size(0), W.size(1))));
        copy_into(W, W * (1 - lr * options_.weight_decay) - O * (lr * scale));
    }
}

void Muon::zero_grad() {
    for (MuonMatrix& m : matrices_) m.param.zero_grad();
}

void Muon::load_state(const std::vector<Tensor>& state, int64_t steps) {
    QK_CHECK(state.size() == momentum_.size(),
             "Muon: the saved state has {} momentum buffers, this optimizer {}", state.size(),
             momentum_.size());
    for (size_t i = 0; i < state.size(); ++i) {
        QK_CHECK(state[i].shape() == momentum_[i].shape(),
                 "Muon: momentum of '{}' is {} in the saved state, {} here", matrices_[i].name,
                 state[i].shape(), momentum_[i].shape());
        copy_into(momentum_[i], state[i]);
    }
    step_ = steps;
}

}  // namespace qk::nn
