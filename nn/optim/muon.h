// Muon: momentum orthogonalised by a Newton–Schulz iteration, for the 2-D hidden weights of a
// transformer (Keller Jordan 2024), with the update scaled to AdamW's RMS (Moonlight, 2025).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace qk::nn {

// The quintic Newton–Schulz iteration, `steps` times on X₀ = G / max(‖G‖_F, 1e-7):
//   A = X Xᵀ,   X ← a·X + (b·A + c·A²)·X,   (a, b, c) = (3.4445, −4.7750, 2.0315)
// run on Gᵀ when G has more rows than columns (so that A is the smaller Gram matrix), and
// transposed back. On the singular values it is the scalar map φ(σ) = aσ + bσ³ + cσ⁵ applied
// `steps` times: the coefficients make φ steep at 0 (a = 3.4445) so that small singular values
// grow fast, at the price of not converging to 1: after 5 steps every σ/‖G‖_F ≥ 0.002 lands in
// [0.68, 1.21] (tests/test_muon.cpp checks both facts). G: (m, n), or a batch (b, m, n) of
// matrices each orthogonalised on its own (each its own ‖G‖_F) by batched GEMMs, one launch per
// product for the whole batch; float32 or float64, any device (the iteration is GEMMs). The
// norms come to the host once per call, to refuse a non-finite G. Not differentiable (an
// optimizer's tool). With precision bf16 or fp16 (float32 G) every product reads its operands
// rounded to the half type and sums in float32 (matmul's mixed form), as modded-nanogpt runs the
// iteration in bf16: the result only needs to be near-orthogonal (the map above already leaves
// σ anywhere in [0.68, 1.21]), and bf16 GEMMs run several times faster.
Tensor newton_schulz5(const Tensor& G, int steps = 5, Precision precision = Precision::full);

struct MuonOptions {
    double momentum = 0.95;  // μ
    double weight_decay = 0.1;
    int ns_steps = 5;
    Precision precision = Precision::full;  // of the Newton–Schulz GEMMs (the model's)
};

// One matrix Muon updates: rows [row_begin, row_begin + rows) of a 2-D parameter (the whole of
// it when rows = -1). A transformer's c_attn.weight (3C, C) is given as three C × C blocks, q, k
// and v, each orthogonalised on its own (as modded-nanogpt does).
struct MuonMatrix {
    Tensor param;
    int64_t row_begin = 0, rows = -1;
    std::string name;  // for error messages and checkpoints
};

// One matrix's two elementwise passes as the kernels see them (n values each, contiguous, one
// device), around the batched Newton–Schulz iteration of its shape group:
//   momentum pass  m ← μ·m + g,  u = g + μ·m      (u: its matrix in the batch the iteration takes)
//   weight pass    w ← w·keep − o·rate            (keep = 1 − lr·wd, rate = lr·0.2·sqrt(max(m, n)),
//                                                  o: its matrix in the iteration's result)
// The weight pass also rewrites the weight's cast copy (half, when not null: bf16 or f16) in the
// same pass, as AdamW's does, so the next forward's GEMMs do not round the weight again.
template <class T>
struct MuonSlot {
    T* m;
    const T* g;
    T* u;
    T* w;
    const T* o;
    T rate;
    int64_t n;
    void* half = nullptr;
    DType half_dtype = DType::f32;
};

// Per matrix W (m × n) with gradient G, each step:
//   M ← μ·M + G               momentum, sum form (torch keeps (1−μ)·M: only the buffer differs)
//   U = G + μ·M               Nesterov
//   O = newton_schulz5(U)
//   W ← W − lr·wd·W           decoupled weight decay
//   W ← W − lr·0.2·sqrt(max(m, n))·O   the RMS of O is about 1/sqrt(max(m, n)), so the update's
//                             RMS is about 0.2·lr, AdamW's typical update RMS (Moonlight)
// Matrices whose parameter has no gradient are skipped. The matrices of one shape (a model's q,
// k, v and c_proj of every layer; its c_fc's; its MLP c_proj's) are orthogonalised together, one
// batched newton_schulz5 per shape: a GPT-2-shaped model's 72 matrices take 3 calls, not 72 (on
// a GPU each is ~35 launches and a host read of ‖U‖_F). The passes before and after it take the
// whole group too (MuonSlot): one launch each on cuda, where the tensor ops took ~9 per matrix.
class Muon {
  public:
    Muon(std::vector<MuonMatrix> matrices, MuonOptions options);
    void step(double lr);
    void zero_grad();

    int64_t steps() const { return step_; }
    const MuonOptions& options() const { return options_; }
    const std::vector<MuonMatrix>& matrices() const { return matrices_; }
    // The momentum buffers, one per matrix in order, for checkpoints.
    std::vector<Tensor> state() const { return momentum_; }
    void load_state(const std::vector<Tensor>& state, int64_t steps);

  private:
    std::vector<MuonMatrix> matrices_;
    std::vector<Tensor> momentum_;
    std::vector<std::vector<size_t>> shape_groups_;  // indices into matrices_, by block shape
    MuonOptions options_;
    int64_t step_ = 0;
};

}  // namespace qk::nn

// The two passes over every slot of a group on cuda (cuda/multi_tensor.cu): one launch each,
// device pointers; the cpu loops they mirror are in nn/optim/muon.cpp.
namespace qk::cuda {
template <class T>
void muon_momentum_all(const std::vector<nn::MuonSlot<T>>& slots, T mu);
template <class T>
void muon_weight_all(const std::vector<nn::MuonSlot<T>>& slots, T keep);
}  // namespace qk::cuda
