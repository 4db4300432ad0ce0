// Causal self-attention with the QK-norm family.
//
// Per head, on q of shape (B, H, T, D) and k, v of shape (B, Hkv, T, D) (Hkv = H, or fewer with
// grouped-query attention: query head h reads key/value head h / (H / Hkv)); D = C / H unless
// head_size sets it; sqrt(D) below is sqrt(query_pre_attn_scalar) when that is set (Gemma):
//   none:              s = q·k / sqrt(D)
//   layernorm/rmsnorm: s = N(q)·N(k) / sqrt(D); scope head: N over D with a gain of size D shared
//                      by the heads; scope full: N over all H·D outputs of q (and Hkv·D of k)
//                      before the head split (OLMo 2)
//   l2 / lp:           s = g · (q/‖q‖_p)·(k/‖k‖_p), g learnable, no 1/sqrt(D)
//   soft-cap:          s <- c·tanh(s/c) after the scaling, before the mask
//   qkv_norm:          v is normalised like q and k (and the block drops ln_1)
//   RoPE:              q and k rotated per head by their position (ops/rope.h), after the
//                      normalisation (before_rope, OLMo 2 and Qwen3; a per-head norm then
//                      rotates its own output, ops/norm.h) or before it (after_rope)
//   sliding window:    on the config's sliding layers, row i sees only its last W keys, and RoPE
//                      turns at the layer's own base (Gemma 3's local layers)
// then A = softmax(mask(s)), y = A v, heads merged, y = c_proj(y).
//
// The scaled dot-product, mask, cap and softmax are one op, ops/attention.h: the fused kernel by
// default (config.fused_attention), the unfused composition otherwise; both measure the
// stability signals per row.
#include "nn/model/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/join.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/rope.h"

namespace qk::nn {

namespace {

bool is_lp_family(QKNorm v) { return v == QKNorm::l2 || v == QKNorm::lp; }

// (B, T, C) -> (B, H, T, D), a view when possible.
Tensor split_heads(const Tensor& t, int64_t n_head) {
    const int64_t B = t.size(0), T = t.size(1), C = t.size(2);
    return t.reshape({B, T, n_head, C / n_head}).transpose(1, 2);
}

// Mean Euclidean norm of the D-vectors of t: (B, H, T, D), per head.
std::vector<double> head_vector_norms(const Tensor& t) {
    return mean(sqrt(sum(t * t, {-1})), {0, 2}).to_vector<double>();
}

// The mean over heads of per-head means: every head has the same B·T vectors, so this is the
// mean over all of them.
double mean_of_heads(const std::vector<double>& heads) {
    return std::accumulate(heads.begin(), heads.end(), 0.0) / static_cast<double>(heads.size());
}

// Reduces the per-row signals (B, H, T) of ops/attention.h to the layer's: the max |s| per head
// and over all of them, and the mean entropy over every row; a NaN anywhere makes them NaN (a
// max would skip it).
void reduce_signals(const AttentionSignals& rows, AttentionStats& stats) {
    const auto max_abs = rows.max_abs_logit.to_vector<double>();
    const auto entropy = rows.entropy.to_vector<double>();
    const size_t H = static_cast<size_t>(rows.max_abs_logit.size(1));
    const size_t T = static_cast<size_t>(rows.max_abs_logit.size(2));
    std::vector<double> head_max(H, 0.0), head_entropy(H, 0.0);
    double entropy_sum = 0;
    bool nan_seen = false;
    const double rows_per_head = static_cast<double>(max_abs.size() / std::max<size_t>(1, H));
    for (size_t r = 0; r < max_abs.size(); ++r) {
        nan_seen = nan_seen || std::isnan(max_abs[r]) || std::isnan(entropy[r]);
        double& head = head_max[(r / T) % H];
        head = std::max(head, max_abs[r]);
        head_entropy[(r / T) % H] += entropy[r] / rows_per_head;
        entropy_sum += entropy[r];
    }
    stats.head_entropy = std::move(head_entropy);
    double max_logit = 0;
    for (double& head : head_max) {
        max_logit = std::max(max_logit, head);
        if (nan_seen) head = NAN;
    }
    stats.head_max_logit = std::move(head_max);
    stats.max_logit = nan_seen ? NAN : max_logit;
    stats.entropy =
        nan_seen ? NAN : entropy_sum / static_cast<double>(std::max<size_t>(1, max_abs.size()));
}

// Each head's logit scale: the options' constant, or g (one for all heads, or one per head).
std::vector<double> head_logit_scales(const AttentionOptions& options, int64_t n_head,
                                      int64_t head_dim) {
    if (!options.scale_tensor.defined())
        return std::vector<double>(static_cast<size_t>(n_head),
                                   options.scale.value_or(1.0 / std::sqrt(head_dim)));
    std::vector<double> g = options.scale_tensor.to_vector<double>();
    if (g.size() == 1) g.resize(static_cast<size_t>(n_head), g[0]);
    return g;
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, Generator& gen, DType dtype,
                                         int64_t layer)
    : config_(config), layer_(layer), rope_theta_(config.rope_theta) {
    config.validate();
    QK_CHECK(layer >= 0 && layer < config.n_layer, "attention: layer {} of a {}-layer model", layer,
             config.n_layer);
    if (config.is_sliding(layer)) {
        window_ = config.sliding_window;
        if (config.rope_local_theta > 0) rope_theta_ = config.rope_local_theta;
    }
    const int64_t C = config.n_embd, D = config.head_dim();
    const int64_t q_width = config.q_width(), kv_width = config.kv_width();
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
    c_attn =
        register_module("c_attn", std::make_shared<Linear>(C, q_width + 2 * kv_width, config.bias,
                                                           0.02, gen, dtype, config.precision));
    if (config.qk_norm == QKNorm::layernorm || config.qk_norm == QKNorm::rmsnorm) {
        const NormKind kind =
            config.qk_norm == QKNorm::layernorm ? NormKind::layernorm : NormKind::rmsnorm;
        const bool per_head = config.qk_norm_scope == NormScope::head;
        auto norm = [&](const char* name, int64_t full_width) {
            return register_module(
                name, std::make_shared<Norm>(kind, per_head ? D : full_width, config.bias, dtype,
                                             config.norm_eps, config.norm_unit_offset));
        };
        q_norm = norm("q_norm", q_width);
        k_norm = norm("k_norm", kv_width);
        if (config.qkv_norm) v_norm = norm("v_norm", kv_width);
    }
    if (is_lp_family(config.qk_norm)) {
        const int64_t n = config.qk_scale_per_head ? config.n_head : 1;
        qk_scale = register_parameter("qk_scale", full({n}, config.initial_qk_scale(), dtype));
    }
    c_proj = register_module("c_proj", std::make_shared<Linear>(q_width, C, config.bias, proj_std,
                                                                gen, dtype, config.precision));
    if (config.fp8_attention) {
        fp8_q = std::make_shared<DelayedScaling>(MiniFormat::e4m3);
        fp8_k = std::make_shared<DelayedScaling>(MiniFormat::e4m3);
    }
    // A per-head norm's output is what the attention reads (RoPE turns inside the norm, or came
    // first), (B, H, T, D) as the attention's GEMMs want it: the norm writes its rounding too, and
    // the attention finds q, k (and v) rounded where it would round them itself.
    if (config.qk_norm_scope == NormScope::head && !config.fp8_attention)
        for (const auto& norm : {q_norm, k_norm, v_norm})
            if (norm) norm->rounded_copy = config.outside_linears();
}

// Applies this layer's q/k/v normalisation to t: (B, H, T, D) for scope head, (B, T, C) for full.
Tensor CausalSelfAttention::normalize(const Tensor& t, const std::shared_ptr<Norm>& norm,
                                      const RopeTables& rotate) const {
    if (is_lp_family(config_.qk_norm))
        return lp_normalize(t, config_.qk_norm == QKNorm::l2 ? 2.0 : config_.lp_p, -1);
    return norm ? norm->forward(t, rotate) : t;
}

// t: (B, H, T, D) rotated by positions first…first+T−1. The tables are made per device and dtype
// (the angles in float64) for the positions needed so far, doubling up to block_size: a model
// with a context of 40,960 (Qwen3) does not hold 40,960 rows per layer to read 13 of them. An
// angle does not depend on the table's length, so neither do the results.
RopeTables CausalSelfAttention::rope_at(const Tensor& t, int64_t first) const {
    const int64_t T = t.size(2), end = first + T;
    if (!rope_cos_.defined() || rope_cos_.device() != t.device() ||
        rope_cos_.dtype() != t.dtype() || rope_cos_.size(0) < end) {
        int64_t rows = 64;
        while (rows < end) rows *= 2;
        RopeTables tables = rope_tables(std::min(rows, config_.block_size), config_.head_dim(),
                                        rope_theta_, t.dtype(), t.device());
        rope_cos_ = tables.cos;
        rope_sin_ = tables.sin;
    }
    return {rope_cos_.narrow(0, first, T), rope_sin_.narrow(0, first, T)};
}

Tensor CausalSelfAttention::rotate(const Tensor& t, int64_t first) const {
    const RopeTables tables = rope_at(t, first);
    return rope(t, tables.cos, tables.sin);
}

CausalSelfAttention::Projected CausalSelfAttention::project(const Tensor& x,
                                                            AttentionStats* stats) const {
    QK_CHECK(x.dim() == 3 && x.size(2) == config_.n_embd,
             "attention: input must be (B, T, {}), got {}", config_.n_embd, x.shape());
    const int64_t q_width = config_.q_width(), kv_width = config_.kv_width();
    const Tensor qkv = c_attn->forward(x);  // (B, T, H·D + 2·Hkv·D)
    Projected p{qkv.narrow(-1, 0, q_width), qkv.narrow(-1, q_width, kv_width),
                qkv.narrow(-1, q_width + kv_width, kv_width), qkv};
    if (stats) {
        NoGradGuard no_grad;
        stats->q_before = split_heads(p.q.detach(), config_.n_head);
        stats->k_before = split_heads(p.k.detach(), config_.kv_heads());
        stats->head_q_norm = head_vector_norms(stats->q_before);
        stats->head_k_norm = head_vector_norms(stats->k_before);
        stats->q_norm = mean_of_heads(stats->head_q_norm);
        stats->k_norm = mean_of_heads(stats->head_k_norm);
    }
    if (full_scope()) {
        p.q = normalize(p.q, q_norm);
        p.k = normalize(p.k, k_norm);
        if (config_.qkv_norm) p.v = normalize(p.v, v_norm);
        p.qkv = Tensor();  // q and k are no longer its slices
    }
    return p;
}

CausalSelfAttention::Projected CausalSelfAttention::to_heads(Projected p, int64_t first) const {
    const int64_t H = config_.n_head, H_kv = config_.kv_heads();
    if (p.qkv.defined()) {  // (B, T, H + 2·Hkv, D) -> the three groups, (B, heads, T, D) each
        const Tensor heads =
            p.qkv.reshape({p.qkv.size(0), p.qkv.size(1), H + 2 * H_kv, config_.head_dim()});
        p.q = heads.narrow(2, 0, H).transpose(1, 2);
        p.k = heads.narrow(2, H, H_kv).transpose(1, 2);
        p.v = heads.narrow(2, H + H_kv, H_kv).transpose(1, 2);
    } else {
        p.q = split_heads(p.q, H);
        p.k = split_heads(p.k, H_kv);
        p.v = split_heads(p.v, H_kv);
    }
    const bool use_rope = config_.pos_emb == PosEmb::rope;
    const bool rotate_first = use_rope && config_.qk_norm_order == QKNormOrder::after_rope;
    if (rotate_first) {
        p.q = rotate(p.q, first);
        p.k = rotate(p.k, first);
    }
    // QK-norm per head, then RoPE: one op each for q and k (the norm turns its own output).
    const bool rotate_in_norm = use_rope && !rotate_first && !full_scope() && q_norm && k_norm &&
                                !is_lp_family(config_.qk_norm);
    if (!full_scope()) {
        const RopeTables tables = rotate_in_norm ? rope_at(p.q, first) : RopeTables{};  // q's = k's
        p.q = normalize(p.q, q_norm, tables);
        p.k = normalize(p.k, k_norm, tables);
        if (config_.qkv_norm) p.v = normalize(p.v, v_norm);
    }
    if (use_rope && !rotate_first && !rotate_in_norm) {
        p.q = rotate(p.q, first);
        p.k = rotate(p.k, first);
    }
    if (fp8_q) {  // --fp8-attention: q and k as they enter the dot product, in E4M3
        p.q = fp8_round(p.q, *fp8_q);
        p.k = fp8_round(p.k, *fp8_k);
    }
    return p;
}

AttentionOptions CausalSelfAttention::options() const {
    // Under fp8, bf16 unless --fp8-attention rounds q, k (to_heads) and the logits to FP8 too.
    AttentionOptions options{.causal = true,
                             .window = window_,
                             .softcap = config_.attn_softcap,
                             .precision = config_.outside_linears(),
                             .fp8_logits = config_.fp8_attention};
    if (is_lp_family(config_.qk_norm))
        options.scale_tensor = qk_scale;  // (1) or (H); the op takes its gradient
    else
        options.scale = 1.0 / std::sqrt(config_.query_pre_attn_scalar > 0
                                            ? config_.query_pre_attn_scalar
                                            : static_cast<double>(config_.head_dim()));
    return options;
}

bool CausalSelfAttention::full_scope() const {
    return config_.qk_norm_scope == NormScope::full && !is_lp_family(config_.qk_norm);
}

Tensor CausalSelfAttention::forward(const Tensor& x, AttentionStats* stats,
                                    Generator* dropout_gen) {
    const Projected p = to_heads(project(x, stats), 0);
    if (stats) {
        NoGradGuard no_grad;
        stats->head_q_norm_after = head_vector_norms(p.q);
        stats->head_k_norm_after = head_vector_norms(p.k);
    }
    AttentionOptions options = this->options();
    if (stats) {
        stats->q_entering = p.q.detach();  // handles: rounded only when read
        stats->k_entering = p.k.detach();
        stats->precision = options.precision;
        stats->head_logit_scale = head_logit_scales(options, config_.n_head, config_.head_dim());
        stats->window = window_;
    }
    const bool drop = config_.dropout > 0 && training();
    if (drop) {
        options.dropout = config_.dropout;
        options.dropout_generator = dropout_gen ? dropout_gen : &default_generator();
    }
    AttentionSignals signals;
    // FP8 logits are counted in every training forward (the signals come from the same pass).
    const bool count_fp8 = config_.fp8_attention && autograd::grad_enabled();
    AttentionSignals* wanted = stats || count_fp8 ? &signals : nullptr;
    // The fused kernel has no attention dropout: with dropout in training, the unfused path.
    Tensor y = config_.fused_attention && !drop
                   ? attention(p.q, p.k, p.v, options, wanted)
                   : attention_unfused(p.q, p.k, p.v, options, wanted);  // (B,H,T,D)
    if (count_fp8) add_saturated_logits(signals.saturated);
    if (stats) {
        NoGradGuard no_grad;
        reduce_signals(signals, *stats);
        stats->qk_scale = qk_scale.defined() ? mean(qk_scale).item() : 0.0;
    }
    y = y.transpose(1, 2).reshape({x.size(0), x.size(1), config_.q_width()});
    return c_proj->forward(y);
}

// The projections and c_proj batched over the sequences (one GEMM for all of them); RoPE, the
// cache and attention per sequence, each from its own position.
void CausalSelfAttention::add_saturated_logits(const Tensor& per_row) {
    const auto counts = per_row.to_vector<double>();  // (B, H, T)
    const size_t H = static_cast<size_t>(per_row.size(1)), T = static_cast<size_t>(per_row.size(2));
    fp8_logits_saturated.resize(H, 0);
    for (size_t r = 0; r < counts.size(); ++r)
        fp8_logits_saturated[(r / T) % H] += static_cast<int64_t>(counts[r]);
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KVCache& cache,
                                           const std::vector<int64_t>& sequences) {
    QK_CHECK(x.dim() == 3 && x.size(0) == static_cast<int64_t>(sequences.size()),
             "attention: a cached forward takes (sequences {}, T, C), got {}", sequences.size(),
             x.shape());
    const Projected all = project(x, nullptr);
    const AttentionOptions options = this->options();
    std::vector<Tensor> outputs;
    for (int64_t row = 0; row < x.size(0); ++row) {
        const int64_t s = sequences[static_cast<size_t>(row)];
        const Projected p = to_heads({all.q.narrow(0, row, 1), all.k.narrow(0, row, 1),
                                      all.v.narrow(0, row, 1), /*qkv=*/Tensor()},
                                     cache.length(s));
        const auto [k, v] = cache.append(layer_, s, p.k, p.v);
        outputs.push_back(config_.fused_attention ? attention(p.q, k, v, options)
                                                  : attention_unfused(p.q, k, v, options));
    }
    Tensor y = outputs.size() == 1 ? outputs[0] : cat(outputs, 0);  // (rows, H, T, D)
    y = y.transpose(1, 2).reshape({x.size(0), x.size(1), config_.q_width()});
    return c_proj->forward(y);
}

}  // namespace qk::nn
