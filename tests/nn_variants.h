// The model variants the nn suites share: the tiny config and every attention variant and
// family block as an edit of it (tests/test_nn.cpp, tests/test_nn_attention.cpp).
#pragma once

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "nn/model/config.h"

namespace qk::test {

using namespace nn;  // the variants edit its enums: QKNorm::rmsnorm, NormPlacement::post, ...

inline GPTConfig tiny_config() {
    GPTConfig c;
    c.vocab_size = 7;
    c.block_size = 4;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    return c;
}

// Every attention variant of the model, and the output-side options, as edits of a config.
struct Variant {
    std::string name;
    std::function<void(GPTConfig&)> apply;
};

inline const std::vector<Variant>& variants() {
    static const std::vector<Variant> list{
        {"none", [](GPTConfig&) {}},
        {"layernorm head", [](GPTConfig& c) { c.qk_norm = QKNorm::layernorm; }},
        {"layernorm full",
         [](GPTConfig& c) { c.qk_norm = QKNorm::layernorm, c.qk_norm_scope = NormScope::full; }},
        {"rmsnorm head", [](GPTConfig& c) { c.qk_norm = QKNorm::rmsnorm; }},
        {"rmsnorm full",
         [](GPTConfig& c) { c.qk_norm = QKNorm::rmsnorm, c.qk_norm_scope = NormScope::full; }},
        {"l2", [](GPTConfig& c) { c.qk_norm = QKNorm::l2; }},
        {"l2 per-head scale",
         [](GPTConfig& c) { c.qk_norm = QKNorm::l2, c.qk_scale_per_head = true; }},
        {"lp p=3",
         [](GPTConfig& c) { c.qk_norm = QKNorm::lp, c.lp_p = 3, c.qk_scale_init = "sqrt_d"; }},
        {"none + attn softcap", [](GPTConfig& c) { c.attn_softcap = 1.5; }},
        {"layernorm + attn softcap (QK_norm_cap)",
         [](GPTConfig& c) { c.qk_norm = QKNorm::layernorm, c.attn_softcap = 1.5; }},
        {"qkv_norm layernorm",
         [](GPTConfig& c) { c.qk_norm = QKNorm::layernorm, c.qkv_norm = true; }},
        {"qkv_norm rmsnorm full, no bias",
         [](GPTConfig& c) {
             c.qk_norm = QKNorm::rmsnorm, c.qk_norm_scope = NormScope::full, c.qkv_norm = true;
             c.bias = false;
         }},
        {"logit softcap + z-loss, untied, rmsnorm blocks",
         [](GPTConfig& c) {
             c.logit_softcap = 2.0, c.z_loss = 0.1, c.tie_embeddings = false;
             c.norm = NormKind::rmsnorm;
         }},
        {"rope, none", [](GPTConfig& c) { c.pos_emb = PosEmb::rope; }},
        {"rope, layernorm head before rope (theta 7)",
         [](GPTConfig& c) {
             c.pos_emb = PosEmb::rope, c.rope_theta = 7, c.qk_norm = QKNorm::layernorm;
         }},
        {"rope, rmsnorm head after rope",
         [](GPTConfig& c) {
             c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::rmsnorm;
             c.qk_norm_order = QKNormOrder::after_rope;
         }},
        {"rope, layernorm full before rope, qkv_norm",
         [](GPTConfig& c) {
             c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::layernorm;
             c.qk_norm_scope = NormScope::full, c.qkv_norm = true;
         }},
        {"rope, l2 after rope",
         [](GPTConfig& c) {
             c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::l2;
             c.qk_norm_order = QKNormOrder::after_rope;
         }},
        {"swiglu MLP 12 wide, rmsnorm head, no bias",
         [](GPTConfig& c) {
             c.mlp = MLPKind::swiglu, c.mlp_hidden = 12, c.qk_norm = QKNorm::rmsnorm;
             c.bias = false;
         }},
        {"geglu MLP, rope, layernorm head",
         [](GPTConfig& c) {
             c.mlp = MLPKind::geglu, c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::layernorm;
         }},
        // The three families' blocks: Qwen3, OLMo 2, Gemma 3 (docs/models.md).
        {"qwen3: 1 kv head, head_size 6, rmsnorm head, rope, swiglu, untied, no bias",
         [](GPTConfig& c) {
             c.n_kv_head = 1, c.head_size = 6, c.qk_norm = QKNorm::rmsnorm;
             c.pos_emb = PosEmb::rope, c.rope_theta = 1e6, c.mlp = MLPKind::swiglu;
             c.norm = NormKind::rmsnorm, c.norm_eps = 1e-6, c.bias = false;
             c.tie_embeddings = false;
         }},
        {"olmo2: post-norm, rmsnorm over the full q and the narrower k, 1 kv head, rope",
         [](GPTConfig& c) {
             c.n_kv_head = 1, c.norm_placement = NormPlacement::post;
             c.qk_norm = QKNorm::rmsnorm, c.qk_norm_scope = NormScope::full;
             c.pos_emb = PosEmb::rope, c.mlp = MLPKind::swiglu, c.norm = NormKind::rmsnorm;
             c.bias = false;
         }},
        {"gemma3: pre+post norms, (1 + w), embedding scale, window 2 on layer 0, logit scale",
         [](GPTConfig& c) {
             c.n_kv_head = 1, c.head_size = 6, c.norm_placement = NormPlacement::both;
             c.norm_unit_offset = true, c.sliding_window = 2;
             c.embedding_scale = std::sqrt(double(c.n_embd));  // as Gemma
             c.layer_types = "sliding,full", c.rope_local_theta = 100, c.rope_theta = 1e6;
             c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::rmsnorm, c.query_pre_attn_scalar = 5;
             c.mlp = MLPKind::geglu, c.norm = NormKind::rmsnorm, c.bias = false;
         }},
    };
    return list;
}

inline bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

inline double mean_of(const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

}  // namespace qk::test
