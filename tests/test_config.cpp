// GPTConfig (nn/model/config.h): its string form, which checkpoints carry in __metadata__, round
// trips every field (and older checkpoints, which lack the later fields, load with what they
// meant), and validate / from_strings name the offending field.
#include <cmath>
#include <functional>

#include "helpers.h"
#include "nn/model/config.h"

using namespace qk;
using namespace qk::nn;
using qk::test::throws_with;

TEST_CASE("GPTConfig round-trips through to_strings / from_strings") {
    GPTConfig c;
    c.vocab_size = 77, c.block_size = 33, c.n_layer = 3, c.n_head = 5, c.n_embd = 40,
    c.bias = false;
    c.tie_embeddings = false, c.norm = NormKind::rmsnorm, c.dropout = 0.125, c.qk_norm = QKNorm::lp;
    c.qk_norm_scope = NormScope::full, c.lp_p = 3.5, c.qk_scale_init = "2.75",
    c.qk_scale_per_head = true;
    c.attn_softcap = 50, c.qkv_norm = true, c.logit_softcap = 30, c.z_loss = 1e-4;
    c.pos_emb = PosEmb::rope, c.rope_theta = 500000, c.qk_norm_order = QKNormOrder::after_rope;
    c.mlp = MLPKind::geglu, c.mlp_hidden = 96;
    c.n_kv_head = 1, c.head_size = 6, c.norm_placement = NormPlacement::both, c.norm_eps = 1e-6;
    c.norm_unit_offset = true, c.embedding_scale = std::sqrt(40.0), c.rope_local_theta = 1e4;
    c.sliding_window = 7, c.layer_types = "sliding,sliding,full", c.query_pre_attn_scalar = 256;
    const auto fields = c.to_strings();
    GPTConfig back = GPTConfig::from_strings(fields);
    CHECK(back.to_strings() == fields);
    CHECK(back.dropout == c.dropout);
    CHECK(back.z_loss == c.z_loss);
    CHECK(back.lp_p == 3.5);
    CHECK(back.qk_norm == QKNorm::lp);
    CHECK(back.norm == NormKind::rmsnorm);
    CHECK(back.pos_emb == PosEmb::rope);
    CHECK(back.rope_theta == 500000);
    CHECK(back.qk_norm_order == QKNormOrder::after_rope);
    CHECK(back.mlp == MLPKind::geglu);
    CHECK(back.mlp_hidden == 96);
    CHECK(back.n_kv_head == 1);
    CHECK(back.head_dim() == 6);
    CHECK(back.norm_placement == NormPlacement::both);
    CHECK(back.norm_eps == 1e-6);
    CHECK(back.norm_unit_offset);
    CHECK(back.embedding_scale == std::sqrt(40.0));
    CHECK(back.is_sliding(1));
    CHECK(!back.is_sliding(2));
    CHECK(back.query_pre_attn_scalar == 256);
    // Checkpoints from before the Qwen3 / OLMo 2 / Gemma 3 switches have GPT-2's block.
    auto pre_family_fields = fields;
    for (const char* key : {"n_kv_head", "head_size", "norm_placement", "norm_eps",
                            "norm_unit_offset", "embedding_scale", "rope_local_theta",
                            "sliding_window", "layer_types", "query_pre_attn_scalar"})
        pre_family_fields.erase(key);
    const GPTConfig plain = GPTConfig::from_strings(pre_family_fields);
    CHECK(plain.kv_heads() == 5);
    CHECK(plain.head_dim() == 8);
    CHECK(plain.norm_placement == NormPlacement::pre);
    CHECK(plain.norm_eps == 1e-5);
    CHECK(!plain.is_sliding(0));
    // Checkpoints from before gated MLPs have GPT-2's, 4C wide.
    auto gpt2_fields = fields;
    for (const char* key : {"mlp", "mlp_hidden"}) gpt2_fields.erase(key);
    const GPTConfig gpt2 = GPTConfig::from_strings(gpt2_fields);
    CHECK(gpt2.mlp == MLPKind::gelu);
    CHECK(gpt2.mlp_width() == 4 * 40);
    // Checkpoints from before RoPE have none of its fields: learned positions.
    auto old_fields = fields;
    for (const char* key : {"pos_emb", "rope_theta", "qk_norm_order"}) old_fields.erase(key);
    const GPTConfig old = GPTConfig::from_strings(old_fields);
    CHECK(old.pos_emb == PosEmb::learned);
    CHECK(old.qk_norm_order == QKNormOrder::before_rope);
    for (auto v : {QKNorm::none, QKNorm::layernorm, QKNorm::rmsnorm, QKNorm::l2, QKNorm::lp})
        CHECK(parse_qk_norm(to_string(v)) == v);
    double third = 1.0 / 3;  // a double that needs all 17 digits survives too
    c.dropout = third;
    CHECK(GPTConfig::from_strings(c.to_strings()).dropout == third);
}

TEST_CASE("GPTConfig::validate and from_strings name the offending field") {
    auto bad = [](std::function<void(GPTConfig&)> edit, std::initializer_list<std::string> words) {
        GPTConfig c;
        edit(c);
        return throws_with([&] { c.validate(); }, words);
    };
    CHECK(bad([](GPTConfig& c) { c.n_head = 5; }, {"n_embd 128", "n_head 5"}));
    CHECK(bad([](GPTConfig& c) { c.n_layer = 0; }, {"n_layer", "0"}));
    CHECK(bad([](GPTConfig& c) { c.dropout = 1; }, {"dropout"}));
    CHECK(bad([](GPTConfig& c) { c.lp_p = 0.5; }, {"lp_p", "0.5"}));
    CHECK(bad([](GPTConfig& c) { c.mlp_hidden = -4; }, {"mlp_hidden", "-4"}));
    CHECK(bad([](GPTConfig& c) { c.n_kv_head = 3; }, {"n_kv_head", "divide n_head 4", "3"}));
    CHECK(bad([](GPTConfig& c) { c.n_kv_head = 8; }, {"n_kv_head", "8"}));
    CHECK(bad([](GPTConfig& c) { c.head_size = -2; }, {"head_size", "-2"}));
    CHECK(bad([](GPTConfig& c) { c.n_embd = 100, c.n_head = 3; }, {"n_embd 100", "n_head 3"}));
    CHECK(bad([](GPTConfig& c) { c.pos_emb = PosEmb::rope, c.head_size = 5; },
              {"rope", "even", "head_size 5"}));
    CHECK(bad([](GPTConfig& c) { c.norm_eps = 0; }, {"norm_eps", "0"}));
    CHECK(bad([](GPTConfig& c) { c.embedding_scale = NAN; }, {"embedding_scale", "nan"}));
    CHECK(bad([](GPTConfig& c) { c.query_pre_attn_scalar = -1; }, {"query_pre_attn_scalar", "-1"}));
    CHECK(bad([](GPTConfig& c) { c.rope_local_theta = 0.5; }, {"rope_local_theta", "0.5"}));
    CHECK(bad([](GPTConfig& c) { c.sliding_window = -1; }, {"sliding_window", "-1"}));
    CHECK(bad([](GPTConfig& c) { c.sliding_window = 4, c.layer_types = "sliding,full"; },
              {"layer_types", "one type per layer (4)", "got 2"}));
    CHECK(bad([](GPTConfig& c) { c.sliding_window = 4, c.layer_types = "full,full,local,full"; },
              {"layer_types", "'local'"}));
    CHECK(bad([](GPTConfig& c) { c.layer_types = "full,full,sliding,full"; },
              {"layer_types", "sliding_window is 0"}));
    auto placement_fields = GPTConfig{}.to_strings();
    placement_fields["norm_placement"] = "sandwich";
    CHECK(test::throws_with([&] { GPTConfig::from_strings(placement_fields); },
                            {"norm_placement", "sandwich", "pre, post, both"}));
    auto fields = GPTConfig{}.to_strings();
    fields["mlp"] = "relu2";
    CHECK(test::throws_with([&] { GPTConfig::from_strings(fields); }, {"mlp", "relu2"}));
    CHECK(bad([](GPTConfig& c) { c.attn_softcap = -1; }, {"attn_softcap"}));
    CHECK(bad([](GPTConfig& c) { c.qkv_norm = true; }, {"qkv_norm", "none"}));
    CHECK(bad([](GPTConfig& c) { c.qk_norm = QKNorm::l2, c.qk_scale_init = "big"; },
              {"qk_scale_init", "big"}));
    CHECK(bad([](GPTConfig& c) { c.qk_norm = QKNorm::l2, c.block_size = 1; }, {"block_size"}));
    CHECK(bad([](GPTConfig& c) { c.pos_emb = PosEmb::rope, c.n_embd = 12, c.n_head = 4; },
              {"rope", "even", "12 / 4 = 3"}));
    CHECK(bad([](GPTConfig& c) { c.pos_emb = PosEmb::rope, c.rope_theta = 0.5; },
              {"rope_theta", "0.5"}));
    CHECK(bad([](GPTConfig& c) { c.qk_norm_order = QKNormOrder::after_rope; },
              {"qk_norm_order", "after_rope", "rope"}));
    CHECK(bad(
        [](GPTConfig& c) {
            c.pos_emb = PosEmb::rope, c.qk_norm = QKNorm::layernorm;
            c.qk_norm_scope = NormScope::full, c.qk_norm_order = QKNormOrder::after_rope;
        },
        {"after_rope", "qk_norm_scope full"}));

    const auto good = GPTConfig().to_strings();
    auto with = [&](const std::string& key, const std::string& value) {
        auto f = good;
        if (value.empty())
            f.erase(key);
        else
            f[key] = value;
        return f;
    };
    CHECK(throws_with([&] { GPTConfig::from_strings(with("n_head", "")); }, {"n_head", "missing"}));
    CHECK(throws_with([&] { GPTConfig::from_strings(with("bias", "yes")); }, {"bias", "yes"}));
    CHECK(throws_with([&] { GPTConfig::from_strings(with("qk_norm", "l3")); },
                      {"qk_norm", "l3", "lp"}));
    CHECK(throws_with([&] { GPTConfig::from_strings(with("pos_emb", "alibi")); },
                      {"pos_emb", "alibi", "learned, rope"}));
    CHECK(throws_with([&] { GPTConfig::from_strings(with("dropout", "0.1x")); },
                      {"dropout", "0.1x"}));
    CHECK(
        throws_with([&] { GPTConfig::from_strings(with("n_layer", "2.5")); }, {"n_layer", "2.5"}));
    CHECK(
        throws_with([&] { GPTConfig::from_strings(with("n_embd", "1e30")); }, {"n_embd", "1e30"}));
}
