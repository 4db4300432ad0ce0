// Muon (nn/optim/muon.h gives the update). Why orthogonalise: for a weight matrix the gradient's
// momentum is typically dominated by a few directions (its singular values span orders of
// magnitude); replacing M = U S Vᵀ by U Vᵀ gives every direction the same step, which the
// Muon papers find trains the hidden matrices of a transformer faster per token than AdamW.
// Newton–Schulz gets U Vᵀ (approximately) from GEMMs alone, so it runs on either device at
// GEMM speed; an SVD would not.
//
// The iteration is tensor ops under NoGradGuard, the same code on cpu and cuda; the elementwise
// passes around it (momentum, weight) take a shape group's matrices in one pass each (MuonSlot):
// the loops below on the cpu, one launch each on cuda (cuda/multi_tensor.cu).
#include "nn/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "core/threading.h"
#include "nn/optim/optim.h"
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

// 1 / max(‖G_β‖_F, 1e-7) for each matrix of G: (..., m, n), as a (..., 1, 1) tensor on G's
// device. The norms are read on the host (one read for the whole batch) to refuse a non-finite G.
Tensor inverse_norms(const Tensor& G) {
    const Tensor squares = sum(G * G, {-2, -1}).to(kF64).to(Device::cpu);
    std::vector<double> inverse;
    for (int64_t b = 0; b < squares.numel(); ++b) {
        const double frobenius = std::sqrt(squares.data<double>()[b]);
        QK_CHECK(std::isfinite(frobenius),
                 "newton_schulz5: G of shape {} is not finite (‖G‖_F = {} for matrix {})",
                 G.shape(), frobenius, b);
        inverse.push_back(1.0 / std::max(frobenius, 1e-7));
    }
    Shape shape(G.shape().begin(), G.shape().end() - 2);
    shape.insert(shape.end(), {1, 1});
    return from_vector(inverse, shape, G.dtype()).to(G.device());
}

// The iteration on X₀: (..., k, l), k <= l, already scaled to ‖X₀‖_F <= 1.
Tensor iterate(Tensor X, int steps, Precision precision) {
    auto mm = [&](const Tensor& a, const Tensor& b, double alpha = 1.0) {
        if (precision != Precision::full) return matmul(a, b, precision, alpha);
        return alpha == 1.0 ? matmul(a, b) : matmul(a, b) * alpha;
    };
    for (int i = 0; i < steps; ++i) {
        Tensor A = mm(X, X.transpose(-2, -1));  // (..., k, k)
        Tensor B = A * kB + mm(A, A, kC);       // b·A + c·A²
        X = X * kA + mm(B, X);                  // a·X + B·X
    }
    return X;
}

}  // namespace

Tensor newton_schulz5(const Tensor& G, int steps, Precision precision) {
    QK_CHECK(G.dim() == 2 || G.dim() == 3,
             "newton_schulz5: G must be a matrix (m, n) or a batch of them (b, m, n), got shape {}",
             G.shape());
    QK_CHECK(is_compute_dtype(G.dtype()),
             "newton_schulz5: G must be float32 or float64, got {} of shape {}", G.dtype(),
             G.shape());
    QK_CHECK(steps >= 0, "newton_schulz5: steps must be >= 0, got {}", steps);
    QK_CHECK(precision == Precision::full || G.dtype() == kF32,
             "newton_schulz5: {} products take a float32 G, got {} of shape {}",
             precision_name(precision), G.dtype(), G.shape());
    NoGradGuard no_grad;
    const bool tall = G.size(-2) > G.size(-1);
    Tensor X = (tall ? G.transpose(-2, -1) : G) * inverse_norms(G);  // (..., k, l), k <= l
    if (X.dim() == 3 && X.device() == Device::cpu) {
        // The cpu's batched GEMM loops over the matrices anyway, and one matrix's iterates stay
        // in cache where a batch's do not (16 of 192 x 192 take 2.4 MB an iterate): one matrix at
        // a time, 1.5-2x faster here; a GPU takes the whole batch per launch.
        for (int64_t b = 0; b < X.size(0); ++b)
            copy_into(X.select(0, b), iterate(X.select(0, b).clone(), steps, precision));
    } else {
        X = iterate(X, steps, precision);
    }
    return tall ? X.transpose(-2, -1).contiguous() : X;
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
        QK_CHECK(m.param.defined() && m.param.dim() == 2 && m.param.is_contiguous(),
                 "Muon: '{}' must be a contiguous 2-D parameter, got shape {}", m.name,
                 m.param.defined() ? m.param.shape() : Shape{});
        QK_CHECK(m.rows < 0 ||
                     (m.row_begin >= 0 && m.rows > 0 && m.row_begin + m.rows <= m.param.size(0)),
                 "Muon: '{}' rows [{}, {}) lie outside its {} rows", m.name, m.row_begin,
                 m.row_begin + m.rows, m.param.size(0));
        const Tensor block = block_of(m.param, m);
        momentum_.push_back(zeros(block.shape(), block.dtype(), block.device()));
    }
    for (size_t i = 0; i < matrices_.size(); ++i) {  // groups of one shape, dtype and device
        const Tensor& b = momentum_[i];
        auto same = [&](const std::vector<size_t>& group) {
            const Tensor& first = momentum_[group.front()];
            return first.shape() == b.shape() && first.dtype() == b.dtype() &&
                   first.device() == b.device();
        };
        auto it = std::find_if(shape_groups_.begin(), shape_groups_.end(), same);
        if (it == shape_groups_.end())
            shape_groups_.push_back({i});
        else
            it->push_back(i);
    }
}

namespace {

// The two passes on the cpu: loops over each slot, a parallel region per slot as the tensor ops
// they replace had.
constexpr int64_t kParallelPass = 1 << 16;  // below this many values a slot stays on one thread

template <class T>
void momentum_on_cpu(const std::vector<MuonSlot<T>>& slots, T mu) {
    for (const MuonSlot<T>& s : slots) {
        auto range = [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) {
                const T m = mu * s.m[i] + s.g[i];  // M ← μ·M + G
                s.m[i] = m;
                s.u[i] = s.g[i] + mu * m;  // U = G + μ·M
            }
        };
        parallel_for(s.n, range, s.n >= kParallelPass);
    }
}

template <class T>
void weight_on_cpu(const std::vector<MuonSlot<T>>& slots, T keep) {
    for (const MuonSlot<T>& s : slots) {
        auto range = [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i) s.w[i] = s.w[i] * keep - s.o[i] * s.rate;
            if constexpr (std::is_same_v<T, float>)
                if (s.half) round_into_half(s.half, s.half_dtype, s.w, lo, hi);
        };
        parallel_for(s.n, range, s.n >= kParallelPass);
    }
}

// A shape group's two passes on its device: the cpu loops, or their one-launch cuda twins.
template <class T>
void momentum_pass(Device device, const std::vector<MuonSlot<T>>& slots, T mu) {
    if (device == Device::cpu) return momentum_on_cpu(slots, mu);
#ifdef QK_WITH_CUDA
    qk::cuda::muon_momentum_all(slots, mu);
#else
    throw_built_without_cuda("Muon");
#endif
}

template <class T>
void weight_pass(Device device, const std::vector<MuonSlot<T>>& slots, T keep) {
    if (device == Device::cpu) return weight_on_cpu(slots, keep);
#ifdef QK_WITH_CUDA
    qk::cuda::muon_weight_all(slots, keep);
#else
    throw_built_without_cuda("Muon");
#endif
}

// The slots of a shape group's matrices (momentum, gradient block, place in U, weight block and,
// where it is current, the weight's cast copy); o is filled in after the iteration.
template <class T>
std::vector<MuonSlot<T>> group_slots(const std::vector<const MuonMatrix*>& matrices,
                                     const std::vector<Tensor>& momentum,
                                     const std::vector<Tensor>& grads, const Tensor& U, T rate) {
    std::vector<MuonSlot<T>> slots;
    const int64_t n = U.size(1) * U.size(2);
    for (size_t j = 0; j < matrices.size(); ++j) {
        const MuonMatrix& m = *matrices[j];
        const int64_t offset = (m.rows < 0 ? 0 : m.row_begin) * U.size(2);  // rows of a block
        MuonSlot<T> slot{momentum[j].data<T>(),
                         grads[j].data<T>(),
                         U.data<T>() + j * n,
                         m.param.data<T>() + offset,
                         nullptr,
                         rate,
                         n};
        // A current copy stays current with these rows rewritten; a stale one is left to the
        // next GEMM that reads the weight, which rounds it again.
        const Storage::CastCopy* copy = half_copy_of(m.param);
        if (copy && has_kept_cast(m.param, copy->dtype)) {
            slot.half = static_cast<char*>(copy->storage->data()) + 2 * offset;
            slot.half_dtype = copy->dtype;
        }
        slots.push_back(slot);
    }
    return slots;
}

// After a group's passes: p is written, and so is its cast copy where the copy was current (the
// rows the group did not write were current too, and did not change). A parameter whose blocks
// sit in several groups (q, and k, v under GQA) is marked after each.
void mark_updated(const Tensor& p) {
    const Storage::CastCopy* copy = half_copy_of(p);
    if (copy && has_kept_cast(p, copy->dtype))
        written_with_half_copy(p);
    else
        mark_written(p);
}

}  // namespace

void Muon::step(double lr) {
    NoGradGuard no_grad;
    ++step_;
    for (const std::vector<size_t>& group : shape_groups_) {
        std::vector<const MuonMatrix*> stepped;  // the group's matrices that have a gradient
        std::vector<Tensor> momentum, grads;     // theirs; the gradients' blocks contiguous
        for (size_t i : group) {
            const MuonMatrix& m = matrices_[i];
            if (!m.param.grad().defined()) continue;
            QK_CHECK(m.param.grad().device() == m.param.device(),
                     "Muon: '{}' is on {} but its gradient on {}", m.name, m.param.device(),
                     m.param.grad().device());
            stepped.push_back(&m);
            momentum.push_back(momentum_[i]);
            grads.push_back(block_of(m.param.grad(), m).contiguous());
        }
        if (stepped.empty()) continue;
        const Tensor& first = momentum.front();
        const int64_t rows = first.size(0), cols = first.size(1);
        // U for every matrix of the group, written where the batched iteration reads it.
        const Tensor U =
            Tensor::empty({int64_t(stepped.size()), rows, cols}, first.dtype(), first.device());
        const double rate = lr * 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
        dispatch_float(first.dtype(), [&](auto tag) {
            using T = decltype(tag);
            std::vector<MuonSlot<T>> slots = group_slots(stepped, momentum, grads, U, T(rate));
            momentum_pass(first.device(), slots, T(options_.momentum));
            // One batched iteration for the group: (n, m, k) → O, each matrix on its own.
            const Tensor O = newton_schulz5(U, options_.ns_steps, options_.precision).contiguous();
            const int64_t n = rows * cols;
            for (size_t j = 0; j < slots.size(); ++j) slots[j].o = O.data<T>() + int64_t(j) * n;
            weight_pass(first.device(), slots, T(1 - lr * options_.weight_decay));
        });
        // Marked group by group, so that an iteration that throws (a non-finite U) leaves the
        // groups before it marked as written.
        for (const MuonMatrix* m : stepped) mark_updated(m->param);
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
