// config.json of the four Hugging Face families read as transformers reads it
// (nn/hf/hf_config.cpp): every default the importer fills is transformers' for that family and
// version; values transformers cannot compute with are refused, not read as qknorm's "0 means
// default"; hostile files (missing, mistyped, contradictory or unknown keys; nested, NUL,
// oversized) are clean errors naming the file and the key. Fixtures: tests/data/hf (test_hf.cpp).
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.h"
#include "hf_fixtures.h"
#include "nn/hf/hf.h"

using namespace qk;
using namespace qk::nn;
using qk::test::ScratchDir;
using qk::test::throws_with;
using json = nlohmann::json;

// Each default below is transformers' (Qwen3Config, Olmo2Config, Gemma3TextConfig, 4.57 and 5.x
// alike), read from the config alone so that a 30-layer model needs no weights.
TEST_CASE("every default the importer fills is transformers' for that family") {
    auto config_of = [](const std::string& family, std::function<void(json&)> edit) {
        ScratchDir dir(family);
        json j = dir.read("config.json");
        edit(j);
        dir.write("config.json", j);
        return read_hf_config(dir.str() + "/config.json").config;
    };
    auto erase = [](std::initializer_list<const char*> keys) {
        return [keys](json& j) {
            for (const char* key : keys) j.erase(key);
        };
    };
    // Qwen3: an untied head, head_dim 128 (not C / H = 8), 32 key/value heads (null: one per
    // query head), 32,768 positions.
    const auto qwen3 = config_of("qwen3", [](json& j) {
        for (const char* key :
             {"tie_word_embeddings", "head_dim", "num_key_value_heads", "max_position_embeddings"})
            j.erase(key);
        j["num_attention_heads"] = 32, j["hidden_size"] = 256;
    });
    CHECK(!qwen3.tie_embeddings);
    CHECK(qwen3.head_dim() == 128);
    CHECK(qwen3.kv_heads() == 32);
    CHECK(qwen3.block_size == 32768);
    CHECK(config_of("qwen3", [](json& j) { j["num_key_value_heads"] = nullptr; }).kv_heads() == 4);
    // use_sliding_window without layer_types: from max_window_layers (absent: 28) on, with
    // sliding_window 4096 when absent; a null window slides nowhere.
    auto sliding = [&](std::function<void(json&)> edit) {
        return config_of("qwen3", [&](json& j) {
            j.erase("layer_types");
            j["num_hidden_layers"] = 30;
            j["use_sliding_window"] = true;
            j["sliding_window"] = 8;
            edit(j);
        });
    };
    auto sliding_from = [](int first) {  // the layer types of 30 layers, sliding from `first`
        std::string s;
        for (int i = 0; i < 30; ++i)
            s += std::string(i ? "," : "") + (i >= first ? "sliding" : "full");
        return s;
    };
    CHECK(sliding([](json& j) { j["max_window_layers"] = 1; }).layer_types == sliding_from(1));
    const std::string from_28 = sliding_from(28);
    CHECK(sliding(erase({"max_window_layers"})).layer_types == from_28);
    const GPTConfig window_absent = sliding(erase({"max_window_layers", "sliding_window"}));
    CHECK(window_absent.sliding_window == 4096);
    CHECK(window_absent.layer_types == from_28);
    CHECK(sliding([](json& j) { j["sliding_window"] = nullptr; }).layer_types.find("sliding") ==
          std::string::npos);
    // OLMo 2: one key/value head per query head, 2,048 positions, an untied head.
    const auto olmo2 = config_of(
        "olmo2", erase({"num_key_value_heads", "max_position_embeddings", "tie_word_embeddings"}));
    CHECK(olmo2.kv_heads() == olmo2.n_head);
    CHECK(olmo2.block_size == 2048);
    CHECK(!olmo2.tie_embeddings);
    // Gemma 3: 4 key/value heads, head_dim and query_pre_attn_scalar 256, 131,072 positions,
    // window 4096, a tied head, no soft-caps; without layer_types every 6th layer is global.
    const auto gemma3 = config_of("gemma3", [](json& j) {
        for (const char* key :
             {"num_key_value_heads", "head_dim", "query_pre_attn_scalar", "max_position_embeddings",
              "sliding_window", "tie_word_embeddings", "attn_logit_softcapping",
              "final_logit_softcapping", "layer_types", "_sliding_window_pattern"})
            j.erase(key);
        j["num_hidden_layers"] = 7;
    });
    CHECK(gemma3.kv_heads() == 4);
    CHECK(gemma3.head_dim() == 256);
    CHECK(gemma3.query_pre_attn_scalar == 256);
    CHECK(gemma3.block_size == 131072);
    CHECK(gemma3.sliding_window == 4096);
    CHECK(gemma3.tie_embeddings);
    CHECK(gemma3.attn_softcap == 0);
    CHECK(gemma3.logit_softcap == 0);
    CHECK(gemma3.layer_types == "sliding,sliding,sliding,sliding,sliding,full,sliding");
}

// transformers cannot compute with these (a zero size, 1/sqrt(0), tanh(s/0), a sliding layer
// without a window); qknorm's own "0 = default/off" must not turn them into a working model.
TEST_CASE("config values transformers refuses are refused, not read as qknorm's defaults") {
    auto refused = [](const std::string& family, std::function<void(json&)> edit,
                      std::initializer_list<std::string> words) {
        ScratchDir dir(family);
        json j = dir.read("config.json");
        edit(j);
        dir.write("config.json", j);
        return throws_with([&] { read_hf_config(dir.str() + "/config.json"); }, words);
    };
    for (const char* family : {"qwen3", "gemma3"}) {
        CHECK(refused(family, [](json& j) { j["head_dim"] = 0; }, {"head_dim", "positive", "0"}));
        CHECK(refused(family, [](json& j) { j["head_dim"] = nullptr; }, {"head_dim", "null"}));
    }
    CHECK(refused("gemma3", [](json& j) { j["query_pre_attn_scalar"] = 0; },
                  {"query_pre_attn_scalar", "positive", "0"}));
    CHECK(refused("gemma3", [](json& j) { j["query_pre_attn_scalar"] = nullptr; },
                  {"query_pre_attn_scalar", "null"}));
    CHECK(refused("gemma3", [](json& j) { j["attn_logit_softcapping"] = 0; },
                  {"attn_logit_softcapping", "positive", "0"}));
    CHECK(refused("gemma3", [](json& j) { j["final_logit_softcapping"] = -30; },
                  {"final_logit_softcapping", "positive", "-30"}));
    CHECK(refused("gemma3", [](json& j) { j["sliding_window"] = nullptr; },
                  {"sliding_window", "null", "sliding,full,sliding"}));
    CHECK(refused("gemma3", [](json& j) { j["sliding_window"] = 0; }, {"sliding_window", "0"}));
    CHECK(refused("gemma3", [](json& j) { j["num_key_value_heads"] = nullptr; },
                  {"num_key_value_heads", "null"}));
    CHECK(refused("qwen3",
                  [](json& j) {
                      j["use_sliding_window"] = true;
                      j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
                  },
                  {"layer_types", "sliding", "sliding_window is null"}));
    CHECK(refused("qwen3", [](json& j) { j["max_position_embeddings"] = 0; },
                  {"max_position_embeddings", "positive"}));
}

TEST_CASE("Gemma 3's RoPE bases without rope_theta are transformers' defaults: 1e6 and 1e4") {
    ScratchDir dir("gemma3");
    const json good = dir.read("config.json");
    json j = good;
    j["rope_parameters"]["full_attention"].erase("rope_theta");
    j["rope_parameters"]["sliding_attention"].erase("rope_theta");
    dir.write("config.json", j);
    const GPTConfig c = load_hf_model(dir.str())->config();
    CHECK(c.rope_theta == 1e6);  // was 10,000: a different model (loss 5.5790 against 5.5752)
    CHECK(c.rope_local_theta == 1e4);
    dir.write("config.json", good);
}

TEST_CASE("hostile config.json files: missing, mistyped, contradictory and unknown keys") {
    ScratchDir dir("qwen3");
    const json good = dir.read("config.json");
    auto refused = [&](std::function<void(json&)> edit, std::initializer_list<std::string> words) {
        json j = good;
        edit(j);
        dir.write("config.json", j);
        return throws_with([&] { load_hf_model(dir.str()); }, words);
    };
    CHECK(refused([](json& j) { j.erase("hidden_size"); },
                  {"config.json", "hidden_size", "missing"}));
    CHECK(refused([](json& j) { j["num_hidden_layers"] = "3"; },
                  {"config.json", "num_hidden_layers", "integer", "\"3\""}));
    CHECK(refused([](json& j) { j["model_type"] = "llama"; },
                  {"config.json", "Qwen3ForCausalLM", "model_type", "llama"}));
    CHECK(refused([](json& j) { j["architectures"] = {"Qwen3MoeForCausalLM"}; },
                  {"config.json", "Qwen3MoeForCausalLM", "not implemented"}));
    CHECK(refused([](json& j) { j["num_experts"] = 8; }, {"config.json", "num_experts", "8"}));
    CHECK(refused([](json& j) { j["hidden_act"] = "relu"; },
                  {"config.json", "hidden_act", "relu", "silu"}));
    CHECK(refused(
        [](json& j) {
            j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}};
        },
        {"config.json", "rope_parameters", "not implemented"}));
    CHECK(refused(
        [](json& j) {
            j.erase("rope_parameters");
            j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
        },
        {"config.json", "rope_scaling", "not implemented"}));
    CHECK(refused([](json& j) { j["num_key_value_heads"] = 3; },
                  {"config.json", "not valid", "n_kv_head", "3"}));
    CHECK(refused([](json& j) { j["attention_bias"] = true; },
                  {"config.json", "attention_bias", "true"}));
    // Hostile text: nested 100,000 deep (it crashed the JSON library's recursion), a NUL byte
    // (the parser stopped there and read the rest as absent), a file past any config's size.
    const std::string config_path = dir.str() + "/config.json";
    auto write_text_file = [](const std::string& path, const std::string& bytes) {
        std::ofstream(path, std::ios::binary) << bytes;
    };
    write_text_file(config_path, std::string(100000, '[') + std::string(100000, ']'));
    CHECK(throws_with([&] { load_hf_model(dir.str()); },
                      {"config.json", "nested 100000 deep", "at most 32"}));
    write_text_file(config_path, good.dump().substr(0, 20) + std::string(1, '\0') + "}");
    CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"config.json", "NUL byte at offset 20"}));
    write_text_file(config_path, std::string(17 << 20, ' '));
    CHECK(throws_with([&] { load_hf_model(dir.str()); }, {"config.json"}));
    dir.write("config.json", good);
    CHECK(load_hf_model(dir.str())->config().kv_heads() == 2);  // and the original still loads
}
