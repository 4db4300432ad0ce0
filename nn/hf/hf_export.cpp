// Which transformers class computes a qknorm model exactly, and its config.json (5.x form).
#include <cmath>
#include <nlohmann/json.hpp>

#include "nn/hf/hf.h"

namespace qk::nn {

namespace {

using json = nlohmann::json;

// What a family's class needs of a GPTConfig: (holds, what it needs) per switch.
using Requirements = std::vector<std::pair<bool, std::string>>;

Requirements requirements(HFFamily family, const GPTConfig& c) {
    const bool plain_heads = c.kv_heads() == c.n_head && c.head_dim() * c.n_head == c.n_embd;
    const bool no_window = c.sliding_window == 0;
    const bool no_caps = c.attn_softcap == 0 && c.logit_softcap == 0;
    const bool unit_scale = c.embedding_scale == 1.0 && !c.norm_unit_offset;
    const bool default_logit_scale =
        c.query_pre_attn_scalar == 0 || c.query_pre_attn_scalar == c.head_dim();
    Requirements common{{c.qk_norm_order == QKNormOrder::before_rope, "qk_norm_order before_rope"},
                        {!c.qkv_norm, "no qkv_norm"}};
    Requirements r;
    switch (family) {
        case HFFamily::gpt2:
            r = {{c.norm == NormKind::layernorm, "norm layernorm"},
                 {c.bias, "bias true"},
                 {c.pos_emb == PosEmb::learned, "pos_emb learned"},
                 {c.mlp == MLPKind::gelu, "mlp gelu"},
                 {c.qk_norm == QKNorm::none, "qk_norm none"},
                 {c.norm_placement == NormPlacement::pre, "norm_placement pre"},
                 {plain_heads && no_window && no_caps && unit_scale && default_logit_scale,
                  "GPT-2's attention (no GQA, head size, window, caps or scales)"},
                 {!c.qkv_norm, "no qkv_norm"}};
            return r;
        case HFFamily::qwen3:
            r = {{c.norm_placement == NormPlacement::pre, "norm_placement pre"},
                 {c.qk_norm_scope == NormScope::head, "qk_norm_scope head"},
                 {c.mlp == MLPKind::swiglu, "mlp swiglu"},
                 {no_window && no_caps && unit_scale && default_logit_scale,
                  "no window, caps, embedding scale, (1 + w) gains or logit scale"}};
            break;
        case HFFamily::olmo2:
            r = {{c.norm_placement == NormPlacement::post, "norm_placement post"},
                 {c.qk_norm_scope == NormScope::full, "qk_norm_scope full"},
                 {c.mlp == MLPKind::swiglu, "mlp swiglu"},
                 {c.head_dim() * c.n_head == c.n_embd, "head_size n_embd / n_head"},
                 {no_window && no_caps && unit_scale && default_logit_scale,
                  "no window, caps, embedding scale, (1 + w) gains or logit scale"}};
            break;
        case HFFamily::gemma3:
            r = {{c.norm_placement == NormPlacement::both, "norm_placement both"},
                 {c.qk_norm_scope == NormScope::head, "qk_norm_scope head"},
                 {c.mlp == MLPKind::geglu, "mlp geglu"},
                 {c.norm_unit_offset, "norm_unit_offset"},
                 {c.embedding_scale == std::sqrt(static_cast<double>(c.n_embd)),
                  "embedding_scale sqrt(n_embd)"}};
            break;
    }
    r.insert(r.end(), {{c.norm == NormKind::rmsnorm, "norm rmsnorm"},
                       {!c.bias, "bias false"},
                       {c.pos_emb == PosEmb::rope, "pos_emb rope"},
                       {c.qk_norm == QKNorm::rmsnorm, "qk_norm rmsnorm"}});
    r.insert(r.end(), common.begin(), common.end());
    return r;
}

std::vector<std::string> unmet(HFFamily family, const GPTConfig& c) {
    std::vector<std::string> out;
    for (const auto& [holds, what] : requirements(family, c))
        if (!holds) out.push_back(what);
    return out;
}

json rope_parameters(double theta) { return {{"rope_type", "default"}, {"rope_theta", theta}}; }

json layer_types(const GPTConfig& c) {
    json types = json::array();
    for (int64_t i = 0; i < c.n_layer; ++i)
        types.push_back(c.is_sliding(i) ? "sliding_attention" : "full_attention");
    return types;
}

// transformers' strict config takes an integer (Gemma 3 writes 256); a fraction stays one.
json query_pre_attn_scalar(const GPTConfig& c) {
    const double v =
        c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim());
    return v == std::floor(v) && v < 1e15 ? json(static_cast<int64_t>(v)) : json(v);
}

}  // namespace

HFFamily hf_family_for(const GPTConfig& config) {
    const HFFamily all[] = {HFFamily::gpt2, HFFamily::qwen3, HFFamily::olmo2, HFFamily::gemma3};
    HFFamily closest = HFFamily::gpt2;
    size_t fewest = SIZE_MAX;
    for (HFFamily f : all) {
        const size_t n = unmet(f, config).size();
        if (n == 0) return f;
        if (n < fewest) fewest = n, closest = f;
    }
    std::string needs;
    for (const std::string& s : unmet(closest, config)) needs += (needs.empty() ? "" : ", ") + s;
    throw Error(fmt::format(
        "export --hf: no transformers class computes this model (GPT2LMHeadModel, "
        "Qwen3ForCausalLM, Olmo2ForCausalLM, Gemma3ForCausalLM); the closest, {}, would need: {}",
        architecture_name(closest), needs));
}

std::string hf_config_json(HFFamily family, const GPTConfig& c) {
    QK_CHECK(unmet(family, c).empty(), "hf_config_json: the model is not a {}: {}",
             architecture_name(family), unmet(family, c).front());
    json j{{"architectures", {architecture_name(family)}},
           {"vocab_size", c.vocab_size},
           {"tie_word_embeddings", c.tie_embeddings},
           {"dtype", "float32"}};
    if (family == HFFamily::gpt2) {
        j.update({{"model_type", "gpt2"},
                  {"n_positions", c.block_size},
                  {"n_embd", c.n_embd},
                  {"n_layer", c.n_layer},
                  {"n_head", c.n_head},
                  {"n_inner", c.mlp_hidden > 0 ? json(c.mlp_hidden) : json(nullptr)},
                  {"activation_function", "gelu_new"},
                  {"layer_norm_epsilon", c.norm_eps},
                  {"attn_pdrop", 0.0},
                  {"embd_pdrop", 0.0},
                  {"resid_pdrop", 0.0},
                  {"scale_attn_weights", true},
                  {"scale_attn_by_inverse_layer_idx", false}});
        return j.dump(2);
    }
    j.update({{"hidden_size", c.n_embd},
              {"intermediate_size", c.mlp_width()},
              {"num_hidden_layers", c.n_layer},
              {"num_attention_heads", c.n_head},
              {"num_key_value_heads", c.kv_heads()},
              {"max_position_embeddings", c.block_size},
              {"rms_norm_eps", c.norm_eps},
              {"attention_bias", false},
              {"attention_dropout", 0.0}});
    switch (family) {
        case HFFamily::qwen3:
            j.update({{"model_type", "qwen3"},
                      {"head_dim", c.head_dim()},
                      {"hidden_act", "silu"},
                      {"use_sliding_window", false},
                      {"rope_parameters", rope_parameters(c.rope_theta)}});
            break;
        case HFFamily::olmo2:
            j.update({{"model_type", "olmo2"},
                      {"hidden_act", "silu"},
                      {"rope_parameters", rope_parameters(c.rope_theta)}});
            break;
        case HFFamily::gemma3: {
            const double local = c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
            j.update({{"model_type", "gemma3_text"},
                      {"head_dim", c.head_dim()},
                      {"hidden_activation", "gelu_pytorch_tanh"},
                      {"query_pre_attn_scalar", query_pre_attn_scalar(c)},
                      {"sliding_window", c.sliding_window > 0 ? c.sliding_window : c.block_size},
                      {"layer_types", layer_types(c)},
                      {"attn_logit_softcapping",
                       c.attn_softcap > 0 ? json(c.attn_softcap) : json(nullptr)},
                      {"final_logit_softcapping",
                       c.logit_softcap > 0 ? json(c.logit_softcap) : json(nullptr)},
                      {"rope_parameters",
                       {{"full_attention", rope_parameters(c.rope_theta)},
                        {"sliding_attention", rope_parameters(local)}}}});
            break;
        }
        case HFFamily::gpt2:
            break;
    }
    return j.dump(2);
}

}  // namespace qk::nn
