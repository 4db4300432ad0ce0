// Simulated FP8 training: values rounded exactly to E4M3 or E5M2 after a per-tensor scale, kept
// in float32 (this CPU has no FP8 arithmetic, and a GEMM of FP8 values summed in float32 is what
// FP8 tensor cores compute). The math and the recipe: docs/mixed-precision.md.
//
// Per-tensor scaling. FP8 holds only ~17 binades (E4M3: 2^-9 … 448), so a tensor is multiplied by
// a scale s before the rounding, q = round(x · s), and every product of two cast tensors is divided
// by both scales afterwards:  x · w ≈ (q_x · q_w) / (s_x · s_w).  Delayed scaling (Transformer
// Engine's recipe) picks s from the past: each cast records amax = max |x| into a history of the
// last `history_len` casts, and the next cast uses
//     s = max_finite / max(history)            (margin 0; kept unchanged while the history is 0)
// so a tensor whose values grow beyond anything in its history saturates at the format's largest
// value: that is what the counts report. Both formats saturate by default, as Transformer
// Engine's casts do (CUDA's __nv_fp8 conversions are satfinite); E5M2 can keep IEEE overflow to
// Inf instead, which skips the step (nn/optim/loss_scale.h) whenever a gradient's amax grows by
// more than ~7 % past its history: a third of the first 60 steps of a small model (docs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/minifloat.h"
#include "core/tensor.h"

namespace qk {

class DelayedScaling {
  public:
    // E4M3 always saturates (it has no Inf); E5M2 saturates unless overflow is to_inf. Throws
    // qk::Error unless format is E4M3 or E5M2 and history_len >= 1.
    explicit DelayedScaling(MiniFormat format, int64_t history_len = 1024,
                            Overflow overflow = Overflow::saturate);

    MiniFormat format() const { return format_; }
    Overflow overflow() const { return overflow_; }
    float scale() const { return scale_; }  // what the next cast multiplies by
    // One cast's amax joins the history (the oldest leaves once it is full) and the scale is
    // recomputed from it. A non-finite amax (the cast's input held Inf or NaN) is not recorded:
    // it would pin the scale for history_len casts.
    void record(double amax);
    const std::vector<float>& history() const { return history_; }  // oldest first
    // The amaxes recorded since the last call (at most the history's length), oldest first,
    // taken out of the history; the scale stays until the next record(). Data-parallel training
    // takes them after each step and records their max over the ranks instead
    // (nn/signals/fp8_telemetry.h).
    std::vector<float> take_recent();
    void forget_recent() { recent_ = 0; }  // what record() added so far is not recent any more

    // Values that reached the format's largest finite value or Inf, since the last take.
    int64_t saturated() const { return saturated_; }
    void add_saturated(int64_t n) { saturated_ += n; }
    int64_t take_saturated();  // returns the count and resets it

    // The history, the scale and the format as JSON (a checkpoint's metadata) and back; a hostile
    // text is a qk::Error naming `origin`.
    std::string state_json() const;
    void load_state_json(const std::string& text, const std::string& origin);

  private:
    MiniFormat format_;
    int64_t history_len_;
    Overflow overflow_;
    std::vector<float> history_;
    float scale_ = 1.0f;
    int64_t saturated_ = 0;
    int64_t recent_ = 0;  // amaxes recorded since the last take_recent() or forget_recent()
};

// The three scaled tensors of one Linear layer: x and W in E4M3 (forward), dY in E5M2 (backward).
struct Fp8LinearScaling {
    explicit Fp8LinearScaling(int64_t history_len = 1024,
                              Overflow grad_overflow = Overflow::saturate)
        : x(MiniFormat::e4m3, history_len),
          weight(MiniFormat::e4m3, history_len),
          grad(MiniFormat::e5m2, history_len, grad_overflow) {}
    DelayedScaling x, weight, grad;
};

// q = round(x · scaling.scale()) in scaling's format, as a contiguous float32 tensor of x's shape
// on x's device, and the scale it used. When `record` (a training cast), amax(x) joins the
// history afterwards (the next cast's scale) and the values that saturated or overflowed are
// added to the count.
// x: float32. Not differentiable (a detached result).
struct Fp8Cast {
    Tensor q;
    float scale;
};
Fp8Cast fp8_cast(const Tensor& x, DelayedScaling& scaling, bool record);

// x rounded through FP8 and back, q / s, with the straight-through gradient (dx = dy: the
// rounding counts as the identity in the backward, as linear's mixed precision does). Records
// amax(x) when autograd records (a training forward), not in evaluation.
Tensor fp8_round(const Tensor& x, DelayedScaling& scaling);

// linear (ops/matmul.h) on FP8 operands: x̃ = q_x / s_x and W̃ = q_w / s_w in E4M3 forward, dỸ in
// E5M2 in the backward, each GEMM a float32 sum of FP8 products divided by the two scales:
//     y = b + (q_x · q_wᵀ) / (s_x s_w)
//     dx = (q_dy · q_w) / (s_dy s_w)      dW = (q_dyᵀ · q_x) / (s_dy s_x)      db = Σ_r dY
// The bias, y and every gradient stay float32. x and W amaxes are recorded in a training forward
// (under autograd), dY's in every backward. x, weight, bias: float32.
Tensor linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const std::shared_ptr<Fp8LinearScaling>& scaling);

namespace cpu {
// q, x: (n). q = round(x · scale) in format; amax out: max |x| (NaN if x holds one); saturated
// out: how many |q| reached the largest finite value or Inf.
void fp8_quantize(float* q, const float* x, int64_t n, float scale, MiniFormat format,
                  Overflow overflow, float* amax, int64_t* saturated);
}  // namespace cpu

// The CUDA twin (cuda/fp8.cu): q, x device pointers; amax and saturated host pointers.
namespace cuda {
void fp8_quantize(float* q, const float* x, int64_t n, float scale, MiniFormat format,
                  Overflow overflow, float* amax, int64_t* saturated);
}  // namespace cuda

}  // namespace qk
