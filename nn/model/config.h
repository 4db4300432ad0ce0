// GPTConfig: every switch of the model (docs/model.md), with checks and a string form for
// checkpoints.
#pragma once

#include <map>
#include <string>

#include "core/dtype.h"
#include "nn/model/layers.h"

namespace qk::nn {

// How q and k are normalised before their dot product.
enum class QKNorm {
    none,       // s = q·k / sqrt(D)
    layernorm,  // s = LN(q)·LN(k) / sqrt(D)      (ViT-22B, OLMo 2)
    rmsnorm,    // s = RMS(q)·RMS(k) / sqrt(D)    (Qwen3, Gemma 3)
    l2,         // s = g · q̂·k̂,  q̂ = q/‖q‖₂       (Henry et al. 2020)
    lp,         // s = g · q̂·k̂,  q̂ = q/‖q‖_p      (Lopez-Rubio et al.)
};
enum class NormScope { head, full };  // statistics over D per head, or over all C channels
// Where positions come from: a learned table added to the token embeddings (wpe, GPT-2), or q and
// k rotated per head by their position (RoPE, ops/rope.h; no wpe).
enum class PosEmb { learned, rope };
// With RoPE and a QK-norm: normalise q and k, then rotate (OLMo 2, Qwen3), or the other way.
enum class QKNormOrder { before_rope, after_rope };
// The MLP: c_proj(gelu(c_fc x)) (GPT-2), or gated, c_proj(act(c_gate x) ⊙ c_fc x) with act = SiLU
// (SwiGLU: Llama, Qwen3, OLMo 2) or tanh-GELU (GeGLU: Gemma).
enum class MLPKind { gelu, swiglu, geglu };
// Where a block's norms sit around each sub-block f (attention, MLP): before it (GPT-2, Llama,
// Qwen3: x + f(norm(x))), after it (OLMo 2: x + norm(f(x))), or both (Gemma 3:
// x + norm'(f(norm(x)))).
enum class NormPlacement { pre, post, both };

struct GPTConfig {
    int64_t vocab_size = 65;
    int64_t block_size = 256;  // T_max
    int64_t n_layer = 4;
    int64_t n_head = 4;
    int64_t n_embd = 128;
    int64_t n_kv_head = 0;  // key/value heads, dividing n_head; 0 = n_head (fewer: grouped-query)
    int64_t head_size = 0;  // D, each head's width; 0 = n_embd / n_head
    bool bias = true;
    bool tie_embeddings = true;
    NormKind norm = NormKind::layernorm;  // the block norms ln_1, ln_2, ln_f
    NormPlacement norm_placement = NormPlacement::pre;
    double norm_eps = 1e-5;  // ε of every norm, block and QK (transformers' rms_norm_eps)
    bool norm_unit_offset =
        false;                     // gains stored as w, applied as (1 + w), w starting at 0 (Gemma)
    double embedding_scale = 1.0;  // the token embeddings times this (Gemma: sqrt(n_embd))
    double dropout = 0.0;
    PosEmb pos_emb = PosEmb::learned;
    double rope_theta = 10000.0;  // RoPE's base θ: pair i turns by θ^(−2i/D) per position
    double rope_local_theta = 0;  // θ of the sliding-window layers; 0 = rope_theta (Gemma 3: 1e4)
    // Sliding-window attention: a layer of type "sliding" lets each query see its last
    // `sliding_window` keys only. layer_types: "" (every layer full, or every layer sliding when
    // sliding_window > 0) or n_layer comma-separated "full" / "sliding" (Gemma 3: 5 sliding, 1
    // full).
    int64_t sliding_window = 0;
    std::string layer_types;
    double query_pre_attn_scalar = 0;  // logits q·k / sqrt(this) (Gemma's name); 0 = head_dim
    QKNormOrder qk_norm_order = QKNormOrder::before_rope;
    MLPKind mlp = MLPKind::gelu;
    int64_t mlp_hidden = 0;  // the MLP's inner width; 0 = 4 · n_embd

    QKNorm qk_norm = QKNorm::none;
    NormScope qk_norm_scope = NormScope::head;
    double lp_p = 2.0;                    // p of the lp variant
    std::string qk_scale_init = "henry";  // l2/lp: "henry" (log2(T²−T)), "sqrt_d", or a number
    bool qk_scale_per_head = false;       // g of shape (H) instead of (1)
    double attn_softcap = 0.0;            // c in s <- c·tanh(s/c); 0 = off (Gemma 2: 50)
    bool qkv_norm = false;                // normalise v too, and drop ln_1 (Rybakov et al.)
    double logit_softcap = 0.0;           // cap on the output logits; 0 = off (Gemma 2: 30)
    double z_loss = 0.0;                  // weight of mean(logsumexp(logits)²); PaLM: 1e-4
    // How attention is computed (same math): fused (ops/attention.h, no T² memory) or naive
    // (matmul, softmax, matmul). Attention dropout in training takes the naive path either way.
    bool fused_attention = true;
    // The arithmetic of the GEMMs (Linear layers, attention, the LM head): full (the weights'
    // dtype), bf16 or fp16 mixed precision (ops/matmul_bf16.cpp), or simulated FP8 on the Linear
    // layers with bf16 elsewhere (ops/fp8.h); weights and optimizer stay float32.
    Precision precision = Precision::full;
    // With precision fp8: attention's q and k rounded to E4M3 too (per-tensor delayed scaling)
    // and its logits to E4M3 at scale 1, before the softmax (|s| > 448 saturates).
    bool fp8_attention = false;

    int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
    int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    int64_t q_width() const { return n_head * head_dim(); }       // the q projection's outputs
    int64_t kv_width() const { return kv_heads() * head_dim(); }  // the k (and v) projection's
    bool is_sliding(int64_t layer) const;  // whether this layer attends through the window
    int64_t mlp_width() const { return mlp_hidden > 0 ? mlp_hidden : 4 * n_embd; }
    double initial_qk_scale() const;  // g₀ for l2/lp, from qk_scale_init
    // The precision of the GEMMs outside the block Linear layers (attention, the LM head): the
    // model's, except that fp8 keeps them in bf16, as Transformer Engine and DeepSeek-V3 do (the
    // logits feed the softmax and the loss directly; --fp8-attention opts attention in).
    Precision outside_linears() const {
        return precision == Precision::fp8 ? Precision::bf16 : precision;
    }
    void validate() const;  // throws qk::Error naming the offending field

    std::map<std::string, std::string> to_strings() const;  // for checkpoint __metadata__
    static GPTConfig from_strings(const std::map<std::string, std::string>& fields);
};

// `architecture` with the switches of `runtime` that change how the model computes but not what
// (fused_attention, precision) or only how it trains (dropout, z_loss): a checkpoint's weights
// fit the model whatever their values.
GPTConfig with_runtime_of(GPTConfig architecture, const GPTConfig& runtime);
// The first field whose value differs, as "n_kv_head: 2 vs 4"; "" when the two are equal.
std::string first_difference(const GPTConfig& a, const GPTConfig& b);

std::string to_string(QKNorm v);
std::string to_string(Precision v);  // "fp32" (full), "bf16", "fp16" or "fp8", as --precision says
Precision parse_precision(const std::string& s);
std::string to_string(NormScope v);
std::string to_string(NormKind v);
std::string to_string(PosEmb v);
std::string to_string(QKNormOrder v);
std::string to_string(MLPKind v);
std::string to_string(NormPlacement v);
NormPlacement parse_norm_placement(const std::string& s);
MLPKind parse_mlp_kind(const std::string& s);
PosEmb parse_pos_emb(const std::string& s);
QKNormOrder parse_qk_norm_order(const std::string& s);
QKNorm parse_qk_norm(const std::string& s);
NormScope parse_norm_scope(const std::string& s);
NormKind parse_norm_kind(const std::string& s);

// A lower bound on the number of parameter values a model of this config has (its embeddings
// and projection matrices): what a loader checks a file's own size against before allocating
// the model (load_model, load_hf_model).
double min_parameter_values(const GPTConfig& config);

}  // namespace qk::nn
