// Causal self-attention with the whole QK-norm family (docs/model.md#attention).
#pragma once

#include <memory>
#include <vector>

#include "nn/model/config.h"
#include "nn/model/kv_cache.h"
#include "nn/model/layers.h"
#include "ops/attention.h"

namespace qk::nn {

// Stability signals of one attention layer for one forward pass, computed without gradient.
struct AttentionStats {
    double max_logit = 0;  // max |s| over unmasked positions (after scaling, before the cap)
    double entropy = 0;    // mean over query rows of −Σ_j A_ij log A_ij
    double q_norm = 0;     // mean ‖q‖₂ per head vector, before normalisation
    double k_norm = 0;
    double qk_scale = 0;  // mean g for l2/lp, 0 otherwise
    // Per head, the max |s| over the batch and the unmasked positions (QK-Clip's S_h).
    std::vector<double> head_max_logit;
    // Per head, this process's batch only (qknorm inspect): the mean entropy of its query rows,
    // and the mean ‖q‖ (H heads) and ‖k‖ (Hkv heads) before the QK-norm and as they enter the
    // dot product (after the QK-norm and RoPE, which keeps norms).
    std::vector<double> head_entropy, head_q_norm, head_k_norm, head_q_norm_after,
        head_k_norm_after;
    // What signals split by position (nn/signals/modality_signals.h) are computed from, no
    // gradient: q (B, H, T, D) and k (B, Hkv, T, D) before the QK-norm and as they enter the
    // attention op, the precision it rounds them to (bf16, fp16) before the dot product, each
    // head's logit scale (s = scale · q·k, before any cap) and the sliding window (0: none).
    Tensor q_before, k_before, q_entering, k_entering;
    Precision precision = Precision::full;
    std::vector<double> head_logit_scale;
    int64_t window = 0;
};

class CausalSelfAttention : public Module {
  public:
    // layer: the block's index, which picks its window and RoPE base (config.is_sliding).
    CausalSelfAttention(const GPTConfig& config, Generator& gen, DType dtype = kF32,
                        int64_t layer = 0);

    // x: (B, T, C) -> (B, T, C). When stats is given, fills it (extra work, no gradient).
    Tensor forward(const Tensor& x, AttentionStats* stats = nullptr,
                   Generator* dropout_gen = nullptr);

    std::shared_ptr<Linear> c_attn, c_proj;  // c_attn: (q_width + 2 · kv_width, C), q then k, v
    std::shared_ptr<Norm> q_norm, k_norm, v_norm;  // layernorm/rmsnorm variants only
    Tensor qk_scale;                               // g, l2/lp variants only
    // --fp8-attention: the delayed scaling of q and k (ops/fp8.h); null otherwise.
    std::shared_ptr<DelayedScaling> fp8_q, fp8_k;
    // --fp8-attention: per head, the logits that saturated at ±448 in training forwards since the
    // trainer last took them (nn/signals/fp8_telemetry.h).
    std::vector<int64_t> fp8_logits_saturated;

    // The same for the next T positions of some sequences of `cache` (eval, without gradient):
    // row i of x (rows, T, C) continues sequence sequences[i]; k and v join the cache, the
    // queries attend over it (nn/model/kv_cache.h).
    Tensor forward_cached(const Tensor& x, KVCache& cache, const std::vector<int64_t>& sequences);

  private:
    struct Projected {
        Tensor q, k, v;
        // c_attn's output while q, k and v are still its three slices (else undefined): to_heads
        // then views each as a group of heads of it, seen as (B, T, H + 2·Hkv, D), so that the
        // backward copies each group's gradient into place once, where slicing the width and
        // then splitting the heads needs a copy to undo the split before the one into place.
        Tensor qkv;
    };
    // c_attn, the signals before any norm, and the full-scope norms: (B, T, width) each.
    Projected project(const Tensor& x, AttentionStats* stats) const;
    // Split into heads ((B, H or Hkv, T, D)), then the per-head norms and RoPE (in the config's
    // order) for positions first, first + 1, ...
    Projected to_heads(Projected p, int64_t first) const;
    AttentionOptions options() const;                  // the scale, soft-cap, window and precision
    void add_saturated_logits(const Tensor& per_row);  // (B, H, T) counts into fp8_logits_saturated
    bool full_scope() const;  // QK-norm statistics over the whole width (OLMo 2)
    // Per variant; with `rotate`, a per-head norm also turns its output by RoPE in the same op.
    Tensor normalize(const Tensor& t, const std::shared_ptr<Norm>& norm,
                     const RopeTables& rotate = {}) const;
    RopeTables rope_at(const Tensor& t, int64_t first) const;  // t's RoPE tables, t: (B, H, T, D)
    Tensor rotate(const Tensor& t, int64_t first) const;       // RoPE

    GPTConfig config_;
    int64_t layer_;
    int64_t window_ = 0;                  // this layer's sliding window, 0 = full attention
    double rope_theta_;                   // this layer's RoPE base
    mutable Tensor rope_cos_, rope_sin_;  // (rows, D/2), rows grown as positions are needed
};

}  // namespace qk::nn
