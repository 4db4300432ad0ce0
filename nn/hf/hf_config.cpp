// config.json of the four transformers classes <-> GPTConfig (docs/models.md has the map).
//
// Every key of the file is accounted for: mapped onto a field, checked against the one value the
// engine implements (attention_bias false, rope_type default, ...), or listed as not changing
// the forward (token ids, dtype, dropout rates, initializer_range). Anything else is refused by
// name: a key that a later transformers adds might change the math, and a silent skip would
// give a model that loads and computes something else.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/file_io.h"
#include "nn/hf/hf.h"

namespace qk::nn {

namespace {

using json = nlohmann::json;

// Keys that do not change what the model computes, in any of the four families.
const std::set<std::string> kMetadataKeys{"architectures",
                                          "model_type",
                                          "transformers_version",
                                          "dtype",
                                          "torch_dtype",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "use_cache",
                                          "initializer_range",
                                          "_name_or_path",
                                          "attention_dropout",
                                          "attn_pdrop",
                                          "embd_pdrop",
                                          "resid_pdrop",
                                          "summary_type",
                                          "summary_use_proj",
                                          "summary_activation",
                                          "summary_proj_to_labels",
                                          "summary_first_dropout",
                                          "tokenizer_class",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "n_ctx",
                                          "reorder_and_upcast_attn",
                                          "task_specific_params",
                                          "_sliding_window_pattern"};

// config.json with every key accounted for: get() marks a key used, finish() refuses the rest.
class Keys {
  public:
    Keys(const json& j, std::string path, std::string family)
        : j_(j), path_(std::move(path)), family_(std::move(family)) {}

    bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
    bool is_null(const char* key) const { return j_.contains(key) && j_.at(key).is_null(); }
    const json& get(const char* key) {
        QK_CHECK(j_.contains(key), "{}: key '{}' is missing ({} needs it)", path_, key, family_);
        used_.insert(key);
        return j_.at(key);
    }
    int64_t integer(const char* key) {
        const json& v = get(key);
        QK_CHECK(v.is_number_integer(), "{}: '{}' must be an integer, got {}", path_, key,
                 v.dump());
        return v.get<int64_t>();
    }
    int64_t integer_or(const char* key, int64_t fallback) {
        used_.insert(key);
        return has(key) ? integer(key) : fallback;
    }
    double number_or(const char* key, double fallback) {
        used_.insert(key);
        if (!has(key)) return fallback;
        const json& v = get(key);
        QK_CHECK(v.is_number(), "{}: '{}' must be a number, got {}", path_, key, v.dump());
        return v.get<double>();
    }
    bool boolean_or(const char* key, bool fallback) {
        used_.insert(key);
        if (!has(key)) return fallback;
        const json& v = get(key);
        QK_CHECK(v.is_boolean(), "{}: '{}' must be true or false, got {}", path_, key, v.dump());
        return v.get<bool>();
    }
    std::string string_or(const char* key, const std::string& fallback) {
        used_.insert(key);
        if (!has(key)) return fallback;
        const json& v = get(key);
        QK_CHECK(v.is_string(), "{}: '{}' must be a string, got {}", path_, key, v.dump());
        return v.get<std::string>();
    }
    // A key the engine implements for one value only (absent or null means that value too).
    template <class V>
    void require(const char* key, const V& implemented) {
        used_.insert(key);
        QK_CHECK(!has(key) || j_.at(key) == json(implemented),
                 "{}: {} '{}' = {} is not implemented by qknorm (only {})", path_, family_, key,
                 j_.at(key).dump(), json(implemented).dump());
    }
    // A size transformers computes with: absent is its default, null or <= 0 is refused (its
    // model would crash or divide by zero; qknorm's own "0 = default" must not reinterpret it).
    int64_t positive_integer_or(const char* key, int64_t fallback) {
        QK_CHECK(!is_null(key), "{}: '{}' is null; {} needs a positive integer (absent: {})", path_,
                 key, family_, fallback);
        const int64_t v = integer_or(key, fallback);
        QK_CHECK(v > 0, "{}: '{}' must be a positive integer, got {}", path_, key, v);
        return v;
    }
    double positive_number_or(const char* key, double fallback) {
        QK_CHECK(!is_null(key), "{}: '{}' is null; {} needs a positive number (absent: {})", path_,
                 key, family_, fallback);
        const double v = number_or(key, fallback);
        QK_CHECK(std::isfinite(v) && v > 0, "{}: '{}' must be a positive number, got {}", path_,
                 key, v);
        return v;
    }
    // A soft-cap: absent or null is none (returned as 0); a value must be positive (0 would
    // divide by zero in transformers' tanh(s / cap)).
    double softcap_or_none(const char* key) {
        used_.insert(key);
        return has(key) ? positive_number_or(key, 0) : 0.0;
    }
    void use(const char* key) { used_.insert(key); }
    void finish() const {
        for (const auto& [key, value] : j_.items())
            QK_CHECK(used_.count(key) || kMetadataKeys.count(key),
                     "{}: key '{}' ({}) is not implemented by qknorm's {} import; it is refused "
                     "rather than ignored, since it may change what the model computes",
                     path_, key, value.dump(), family_);
    }
    const std::string& path() const { return path_; }

  private:
    const json& j_;
    std::string path_, family_;
    std::set<std::string> used_;
};

// One RoPE parameter set: {"rope_type": "default", "rope_theta": θ} (5.x) -> θ; without
// rope_theta, transformers' default for that family and layer type (`fallback`).
double rope_theta_of(const json& p, const std::string& path, const std::string& where,
                     double fallback) {
    QK_CHECK(p.is_object(), "{}: {} must be an object, got {}", path, where, p.dump());
    double theta = fallback;
    for (const auto& [key, v] : p.items()) {
        if (key == "rope_theta" && v.is_number()) {
            theta = v.get<double>();
        } else if ((key == "rope_type" || key == "type") && v == "default") {
        } else {
            throw Error(fmt::format(
                "{}: {}.{} = {} is not implemented by qknorm (plain RoPE only: rope_type "
                "default and rope_theta)",
                path, where, key, v.dump()));
        }
    }
    return theta;
}

// rope_scaling (4.x) must be absent, null or the default type.
void check_rope_scaling(Keys& keys) {
    keys.use("rope_scaling");
    if (keys.has("rope_scaling"))
        rope_theta_of(keys.get("rope_scaling"), keys.path(), "rope_scaling", 0);
}

// The family's RoPE base θ: rope_parameters (5.x) or rope_theta (4.x).
double read_rope_theta(Keys& keys, double fallback) {
    check_rope_scaling(keys);
    if (keys.has("rope_parameters"))
        return rope_theta_of(keys.get("rope_parameters"), keys.path(), "rope_parameters", fallback);
    return keys.number_or("rope_theta", fallback);
}

// layer_types (5.x and late 4.x): "full_attention" / "sliding_attention" per layer -> our list.
std::string read_layer_types(Keys& keys, int64_t n_layer) {
    const json& list = keys.get("layer_types");
    QK_CHECK(list.is_array() && static_cast<int64_t>(list.size()) == n_layer,
             "{}: layer_types must list {} layer types, got {}", keys.path(), n_layer, list.dump());
    std::string types;
    for (const json& t : list) {
        QK_CHECK(t == "full_attention" || t == "sliding_attention",
                 "{}: layer_types entry {} is not implemented (full_attention or "
                 "sliding_attention)",
                 keys.path(), t.dump());
        types +=
            std::string(types.empty() ? "" : ",") + (t == "full_attention" ? "full" : "sliding");
    }
    return types;
}

// transformers' defaults for the shared keys a config.json may leave out; they differ by family.
struct LlamaDefaults {
    int64_t kv_heads;       // num_key_value_heads absent (0: one per query head)
    bool kv_heads_null_ok;  // null is one per query head (Qwen3, OLMo 2); Gemma 3 cannot use it
    int64_t max_positions;  // max_position_embeddings absent
};

// The fields the three RoPE families share (Llama's names).
void read_llama_shape(Keys& keys, GPTConfig& c, const LlamaDefaults& defaults) {
    c.vocab_size = keys.integer("vocab_size");
    c.n_embd = keys.integer("hidden_size");
    c.mlp_hidden = keys.integer("intermediate_size");
    c.n_layer = keys.integer("num_hidden_layers");
    c.n_head = keys.integer("num_attention_heads");
    if (keys.is_null("num_key_value_heads") && defaults.kv_heads_null_ok) {
        keys.use("num_key_value_heads");
        c.n_kv_head = c.n_head;
    } else {
        c.n_kv_head = keys.positive_integer_or("num_key_value_heads",
                                               defaults.kv_heads ? defaults.kv_heads : c.n_head);
    }
    c.block_size = keys.positive_integer_or("max_position_embeddings", defaults.max_positions);
    c.bias = false;
    keys.require("attention_bias", false);
    keys.require("mlp_bias", false);
    c.norm = NormKind::rmsnorm;
    c.pos_emb = PosEmb::rope;
    c.qk_norm = QKNorm::rmsnorm;
    c.qk_norm_order = QKNormOrder::before_rope;
}

GPTConfig read_gpt2(Keys& keys) {
    GPTConfig c;  // the defaults are GPT-2's block
    c.vocab_size = keys.integer("vocab_size");
    c.block_size = keys.integer("n_positions");
    c.n_embd = keys.integer("n_embd");
    c.n_layer = keys.integer("n_layer");
    c.n_head = keys.integer("n_head");
    c.mlp_hidden = keys.integer_or("n_inner", 0);
    c.norm_eps = keys.number_or("layer_norm_epsilon", 1e-5);
    c.tie_embeddings = keys.boolean_or("tie_word_embeddings", true);
    const std::string act = keys.string_or("activation_function", "gelu_new");
    QK_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             "{}: activation_function '{}' is not implemented by qknorm (the tanh GELU: "
             "gelu_new or gelu_pytorch_tanh)",
             keys.path(), act);
    keys.require("scale_attn_weights", true);
    keys.require("scale_attn_by_inverse_layer_idx", false);
    keys.require("add_cross_attention", false);
    c.qk_norm = QKNorm::none;
    return c;
}

// Qwen3Config's defaults (4.x and 5.x alike): 32 key/value heads, head_dim 128 (not C / H),
// 32,768 positions, an untied head; sliding_window 4096 from layer max_window_layers = 28 on,
// and only with use_sliding_window (null: no window, so no layer slides).
GPTConfig read_qwen3(Keys& keys) {
    GPTConfig c;
    read_llama_shape(keys, c, {32, true, 32768});
    c.head_size = keys.positive_integer_or("head_dim", 128);
    c.norm_eps = keys.number_or("rms_norm_eps", 1e-6);
    c.tie_embeddings = keys.boolean_or("tie_word_embeddings", false);
    c.rope_theta = read_rope_theta(keys, 10000.0);
    c.mlp = MLPKind::swiglu;
    keys.require("hidden_act", "silu");
    const bool sliding = keys.boolean_or("use_sliding_window", false);
    const bool no_window = keys.is_null("sliding_window");
    const int64_t window = no_window ? 0 : keys.integer_or("sliding_window", 4096);
    const int64_t max_window_layers = keys.integer_or("max_window_layers", 28);
    keys.use("sliding_window");
    if (!sliding) {
        if (keys.has("layer_types")) read_layer_types(keys, c.n_layer);  // checked; none slides
        return c;
    }
    QK_CHECK(no_window || window > 0, "{}: sliding_window must be positive or null, got {}",
             keys.path(), window);
    c.sliding_window = window;
    if (keys.has("layer_types")) {
        c.layer_types = read_layer_types(keys, c.n_layer);
        QK_CHECK(!no_window || c.layer_types.find("sliding") == std::string::npos,
                 "{}: layer_types has sliding layers but sliding_window is null", keys.path());
    } else if (!no_window) {
        for (int64_t i = 0; i < c.n_layer; ++i)
            c.layer_types +=
                std::string(i ? "," : "") + (i >= max_window_layers ? "sliding" : "full");
    }
    return c;
}

GPTConfig read_olmo2(Keys& keys) {
    GPTConfig c;
    read_llama_shape(keys, c, {0, true, 2048});
    c.norm_eps = keys.number_or("rms_norm_eps", 1e-5);
    c.tie_embeddings = keys.boolean_or("tie_word_embeddings", false);
    c.rope_theta = read_rope_theta(keys, 10000.0);
    c.mlp = MLPKind::swiglu;
    keys.require("hidden_act", "silu");
    c.norm_placement = NormPlacement::post;
    c.qk_norm_scope = NormScope::full;
    return c;
}

// Gemma3TextConfig's defaults: 4 key/value heads, head_dim 256, 131,072 positions, a tied
// head, query_pre_attn_scalar 256, sliding_window 4096, no soft-caps (null); every 6th layer
// global.
GPTConfig read_gemma3(Keys& keys) {
    GPTConfig c;
    read_llama_shape(keys, c, {4, false, 131072});
    c.head_size = keys.positive_integer_or("head_dim", 256);
    c.norm_eps = keys.number_or("rms_norm_eps", 1e-6);
    c.tie_embeddings = keys.boolean_or("tie_word_embeddings", true);
    keys.require("hidden_activation", "gelu_pytorch_tanh");
    keys.require("use_bidirectional_attention", false);
    c.mlp = MLPKind::geglu;
    c.norm_placement = NormPlacement::both;
    c.norm_unit_offset = true;
    // sqrt(C), which transformers rounds to the weights' dtype, as x * scale does here
    c.embedding_scale = std::sqrt(static_cast<double>(c.n_embd));
    c.query_pre_attn_scalar = keys.positive_number_or("query_pre_attn_scalar", 256);
    c.attn_softcap = keys.softcap_or_none("attn_logit_softcapping");
    c.logit_softcap = keys.softcap_or_none("final_logit_softcapping");
    // null is refused below when a layer slides (transformers has no window for it)
    const bool no_window = keys.is_null("sliding_window");
    keys.use("sliding_window");
    c.sliding_window = no_window ? 0 : keys.integer_or("sliding_window", 4096);
    QK_CHECK(no_window || c.sliding_window > 0,
             "{}: sliding_window must be positive or null, got {}", keys.path(), c.sliding_window);
    if (keys.has("layer_types")) {
        c.layer_types = read_layer_types(keys, c.n_layer);
    } else {  // 4.x: every p-th layer is global
        const int64_t pattern = keys.integer_or("sliding_window_pattern", 6);
        QK_CHECK(pattern >= 1, "{}: sliding_window_pattern must be >= 1, got {}", keys.path(),
                 pattern);
        for (int64_t i = 0; i < c.n_layer; ++i)
            c.layer_types += std::string(i ? "," : "") + ((i + 1) % pattern ? "sliding" : "full");
    }
    keys.use("sliding_window_pattern");
    QK_CHECK(!no_window || c.layer_types.find("sliding") == std::string::npos,
             "{}: sliding_window is null but layers {} slide (Gemma 3 needs a window)", keys.path(),
             c.layer_types);
    check_rope_scaling(keys);
    if (keys.has("rope_parameters")) {  // 5.x: one set per layer type
        const json& p = keys.get("rope_parameters");
        QK_CHECK(p.is_object() && p.contains("full_attention") && p.contains("sliding_attention") &&
                     p.size() == 2,
                 "{}: rope_parameters must hold full_attention and sliding_attention, got {}",
                 keys.path(), p.dump());
        // transformers' Gemma3TextConfig: 1e6 for the global layers, 1e4 for the local ones.
        c.rope_theta = rope_theta_of(p.at("full_attention"), keys.path(), "full_attention", 1e6);
        c.rope_local_theta =
            rope_theta_of(p.at("sliding_attention"), keys.path(), "sliding_attention", 1e4);
    } else {
        c.rope_theta = keys.number_or("rope_theta", 1e6);
        c.rope_local_theta = keys.number_or("rope_local_base_freq", 1e4);
    }
    return c;
}

}  // namespace

std::string architecture_name(HFFamily family) {
    switch (family) {
        case HFFamily::gpt2:
            return "GPT2LMHeadModel";
        case HFFamily::qwen3:
            return "Qwen3ForCausalLM";
        case HFFamily::olmo2:
            return "Olmo2ForCausalLM";
        case HFFamily::gemma3:
            return "Gemma3ForCausalLM";
    }
    return "?";
}

HFConfig read_hf_config(const std::string& path) {
    // A config.json is a few kB; 16 MB is far past any model's, and nothing is parsed before its
    // nesting is measured (a 100,000-deep one crashed the JSON library's recursion).
    const std::string text = read_regular_file(path, "config.json", 16 << 20);
    check_json_extent(text, path, 32, 1 << 20);
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw Error(fmt::format("{}: not valid JSON: {}", path, json_error_text(e)));
    }
    QK_CHECK(j.is_object(), "{}: must be a JSON object, got {}", path, j.type_name());
    QK_CHECK(j.contains("architectures") && j["architectures"].is_array() &&
                 j["architectures"].size() == 1 && j["architectures"][0].is_string(),
             "{}: 'architectures' must list one class name (e.g. [\"Qwen3ForCausalLM\"])", path);
    const std::string arch = j["architectures"][0].get<std::string>();
    const std::pair<HFFamily, const char*> families[] = {{HFFamily::gpt2, "gpt2"},
                                                         {HFFamily::qwen3, "qwen3"},
                                                         {HFFamily::olmo2, "olmo2"},
                                                         {HFFamily::gemma3, "gemma3_text"}};
    for (const auto& [family, model_type] : families) {
        if (arch != architecture_name(family)) continue;
        QK_CHECK(!j.contains("model_type") || j["model_type"] == model_type,
                 "{}: architectures says {} but model_type is {} (expected \"{}\")", path, arch,
                 j["model_type"].dump(), model_type);
        Keys keys(j, path, arch);
        HFConfig out{family, {}};
        switch (family) {
            case HFFamily::gpt2:
                out.config = read_gpt2(keys);
                break;
            case HFFamily::qwen3:
                out.config = read_qwen3(keys);
                break;
            case HFFamily::olmo2:
                out.config = read_olmo2(keys);
                break;
            case HFFamily::gemma3:
                out.config = read_gemma3(keys);
                break;
        }
        keys.finish();
        try {
            out.config.validate();
        } catch (const Error& e) {
            throw Error(
                fmt::format("{}: the {} it describes is not valid: {}", path, arch, e.what()));
        }
        return out;
    }
    throw Error(fmt::format(
        "{}: architecture '{}' is not implemented by qknorm (GPT2LMHeadModel, Qwen3ForCausalLM, "
        "Olmo2ForCausalLM, Gemma3ForCausalLM)",
        path, arch));
}

}  // namespace qk::nn
