// The model (nn/): parameter names, shapes and initialisation as the model spec says, every
// attention variant gradchecked end to end in float64 and checked against naive loops (with its
// stability signals), causality, and every variant overfitting a fixed batch that needs attention.
// The optimisers and data are in test_train.cpp, the config's string form in test_checkpoint.cpp.
#include <cmath>
#include <complex>
#include <functional>
#include <map>
#include <numeric>

#include "helpers.h"
#include "nn/attention.h"
#include "nn/config.h"
#include "nn/gpt.h"
#include "nn/optim.h"

using namespace qk;
using namespace qk::nn;
using qk::test::throws_with;

namespace {

GPTConfig tiny_config() {
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

const std::vector<Variant>& variants() {
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

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Parameter name -> shape, as the model spec's table says, written out independently of nn/.
std::map<std::string, Shape> expected_shapes(const GPTConfig& c) {
    const int64_t C = c.n_embd, V = c.vocab_size, D = c.head_size > 0 ? c.head_size : C / c.n_head;
    const int64_t Wq = c.n_head * D, Wkv = (c.n_kv_head > 0 ? c.n_kv_head : c.n_head) * D;
    const bool pre = c.norm_placement != NormPlacement::post;
    const bool post = c.norm_placement != NormPlacement::pre;
    std::map<std::string, Shape> m{{"transformer.wte.weight", {V, C}}};
    if (c.pos_emb == PosEmb::learned) m["transformer.wpe.weight"] = {c.block_size, C};
    auto norm = [&](const std::string& name, int64_t width, bool layernorm) {
        m[name + ".weight"] = {width};
        if (c.bias && layernorm) m[name + ".bias"] = {width};
    };
    auto linear = [&](const std::string& name, int64_t out, int64_t in) {
        m[name + ".weight"] = {out, in};
        if (c.bias) m[name + ".bias"] = {out};
    };
    const bool block_ln = c.norm == NormKind::layernorm;
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = "transformer.h." + std::to_string(i) + ".";
        if (pre && !c.qkv_norm) norm(p + "ln_1", C, block_ln);
        linear(p + "attn.c_attn", Wq + 2 * Wkv, C);
        if (c.qk_norm == QKNorm::layernorm || c.qk_norm == QKNorm::rmsnorm) {
            const bool head = c.qk_norm_scope == NormScope::head;
            for (const char* n : {"q_norm", "k_norm", "v_norm"})
                if (std::string(n) != "v_norm" || c.qkv_norm)
                    norm(p + "attn." + n,
                         head                         ? D
                         : std::string(n) == "q_norm" ? Wq
                                                      : Wkv,
                         c.qk_norm == QKNorm::layernorm);
        }
        if (c.qk_norm == QKNorm::l2 || c.qk_norm == QKNorm::lp)
            m[p + "attn.qk_scale"] = {c.qk_scale_per_head ? c.n_head : 1};
        linear(p + "attn.c_proj", C, Wq);
        if (post) norm(p + "post_ln_1", C, block_ln);
        if (pre) norm(p + "ln_2", C, block_ln);
        if (post) norm(p + "post_ln_2", C, block_ln);
        const int64_t hidden = c.mlp_hidden > 0 ? c.mlp_hidden : 4 * C;
        linear(p + "mlp.c_fc", hidden, C);
        if (c.mlp != MLPKind::gelu) linear(p + "mlp.c_gate", hidden, C);
        linear(p + "mlp.c_proj", C, hidden);
    }
    norm("transformer.ln_f", C, block_ln);
    if (!c.tie_embeddings) m["lm_head.weight"] = {V, C};
    return m;
}

std::map<std::string, Shape> actual_shapes(const GPT& model) {
    std::map<std::string, Shape> m;
    for (const auto& [name, p] : model.named_parameters()) {
        CHECK_MESSAGE(!m.count(name), "parameter " << name << " registered twice");
        m[name] = p.shape();
    }
    return m;
}

Tensor param(const GPT& model, const std::string& name) {
    for (const auto& [n, p] : model.named_parameters())
        if (n == name) return p;
    return {};
}

double mean_of(const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}
double std_of(const std::vector<double>& v) {
    const double m = mean_of(v);
    double s = 0;
    for (double e : v) s += (e - m) * (e - m);
    return std::sqrt(s / v.size());
}

// Replaces the (tiny, mostly 0/1) initial weights by O(1) random values, so that a gradcheck
// sees every term: softmax far from uniform, caps in their nonlinear range, non-zero biases.
void randomize(GPT& model, uint64_t seed) {
    NoGradGuard no_grad;
    Generator gen(seed);
    for (auto& [name, p] : model.named_parameters()) {
        if (ends_with(name, "qk_scale")) continue;  // keep g₀ = log2(T²−T) or sqrt(D)
        const bool gain = ends_with(name, ".weight") && p.dim() == 1;
        copy_into(p, normal(p.shape(), gain ? 1.0 : 0.0, gain ? 0.3 : 0.5, p.dtype(), gen));
    }
}

// A fixed batch: (B, T) ids and their next tokens, from a random sequence of B·(T+1) ids.
void fixed_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, Tensor& ids, Tensor& targets) {
    Generator gen(seed);
    std::vector<int32_t> x, y;
    for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> seq(T + 1);
        for (auto& t : seq) t = static_cast<int32_t>(gen.uniform() * V);
        x.insert(x.end(), seq.begin(), seq.end() - 1);
        y.insert(y.end(), seq.begin() + 1, seq.end());
    }
    ids = from_ids(x, {B, T});
    targets = from_ids(y, {B, T});
}

}  // namespace

// ---- parameter names, shapes, initialisation ----------------------------------------------

TEST_CASE("parameter names and shapes follow the model spec for every switch and variant") {
    GPTConfig base;
    base.vocab_size = 11, base.block_size = 8, base.n_layer = 2, base.n_embd = 16, base.n_head = 2;
    std::vector<std::function<void(GPTConfig&)>> switches{
        [](GPTConfig&) {}, [](GPTConfig& c) { c.bias = false; },
        [](GPTConfig& c) { c.tie_embeddings = false; },
        [](GPTConfig& c) { c.norm = NormKind::rmsnorm; },
        [](GPTConfig& c) { c.bias = false, c.tie_embeddings = false, c.norm = NormKind::rmsnorm; }};
    for (const auto& variant : variants())
        for (size_t s = 0; s < switches.size(); ++s) {
            GPTConfig c = base;
            variant.apply(c);
            switches[s](c);
            CAPTURE(variant.name);
            CAPTURE(s);
            GPT model(c, 1);
            CHECK(actual_shapes(model) == expected_shapes(c));
            int64_t count = 0;
            for (const auto& [name, shape] : expected_shapes(c)) count += numel_of(shape);
            CHECK(model.parameter_count() == count);
        }
    // Spot checks of the table itself, so the expectation above is not only self-consistent.
    GPTConfig c = base;
    c.qk_norm = QKNorm::layernorm, c.qk_norm_scope = NormScope::full, c.qkv_norm = true;
    auto shapes = actual_shapes(GPT(c, 1));
    CHECK(shapes.at("transformer.h.1.attn.v_norm.bias") == Shape{16});
    CHECK(shapes.at("transformer.h.0.attn.c_attn.weight") == Shape{48, 16});
    CHECK(shapes.at("transformer.h.0.mlp.c_proj.weight") == Shape{16, 64});
    CHECK(!shapes.count("transformer.h.0.ln_1.weight"));
    CHECK(!shapes.count("lm_head.weight"));
    c = base;
    c.qk_norm = QKNorm::lp, c.qk_scale_per_head = true;
    CHECK(actual_shapes(GPT(c, 1)).at("transformer.h.0.attn.qk_scale") == Shape{2});
    c = base;
    c.mlp = MLPKind::swiglu, c.mlp_hidden = 24;
    shapes = actual_shapes(GPT(c, 1));
    CHECK(shapes.at("transformer.h.1.mlp.c_gate.weight") == Shape{24, 16});
    CHECK(shapes.at("transformer.h.1.mlp.c_fc.weight") == Shape{24, 16});
    CHECK(shapes.at("transformer.h.1.mlp.c_proj.weight") == Shape{16, 24});
}

TEST_CASE("the gated MLPs compute c_proj(act(c_gate x) * c_fc x), against naive loops") {
    GPTConfig c = tiny_config();
    c.mlp_hidden = 5;
    for (const MLPKind kind : {MLPKind::gelu, MLPKind::swiglu, MLPKind::geglu}) {
        CAPTURE(to_string(kind));
        c.mlp = kind;
        Generator gen(11);
        MLP mlp(c, gen, kF64);
        {  // O(1) weights and biases, so that every term and the activations' curvature show
            NoGradGuard no_grad;
            for (auto& [name, p] : mlp.named_parameters())
                copy_into(p, normal(p.shape(), 0.0, 0.7, kF64, gen));
        }
        const Tensor x = normal({3, c.n_embd}, 0.0, 1.0, kF64, gen);
        const auto y = mlp.forward(x).to_vector<double>();
        auto weights = [&](const std::shared_ptr<Linear>& l) {
            return std::pair{l->weight.to_vector<double>(), l->bias.to_vector<double>()};
        };
        const auto [w_fc, b_fc] = weights(mlp.c_fc);
        const auto [w_proj, b_proj] = weights(mlp.c_proj);
        std::vector<double> w_gate, b_gate;
        if (kind != MLPKind::gelu) std::tie(w_gate, b_gate) = weights(mlp.c_gate);
        const auto xs = x.to_vector<double>();
        const int64_t C = c.n_embd, H = 5;
        auto gelu_tanh = [](double v) {
            return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        };
        for (int64_t r = 0; r < 3; ++r) {
            std::vector<double> h(H);
            for (int64_t j = 0; j < H; ++j) {
                double up = b_fc[j], gate = kind == MLPKind::gelu ? 0 : b_gate[j];
                for (int64_t i = 0; i < C; ++i) {
                    up += w_fc[j * C + i] * xs[r * C + i];
                    if (kind != MLPKind::gelu) gate += w_gate[j * C + i] * xs[r * C + i];
                }
                h[j] = kind == MLPKind::gelu     ? gelu_tanh(up)
                       : kind == MLPKind::swiglu ? gate / (1 + std::exp(-gate)) * up
                                                 : gelu_tanh(gate) * up;
            }
            for (int64_t o = 0; o < C; ++o) {
                double out = b_proj[o];
                for (int64_t j = 0; j < H; ++j) out += w_proj[o * H + j] * h[j];
                CHECK(y[r * C + o] == doctest::Approx(out).epsilon(1e-12));
            }
        }
    }
}

TEST_CASE("initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), norms 1/0") {
    GPTConfig c;
    c.vocab_size = 512, c.block_size = 64, c.n_layer = 2, c.n_head = 4, c.n_embd = 128;
    c.tie_embeddings = false;
    GPT model(c, 42);
    const double proj_std = 0.02 / std::sqrt(4.0);
    for (const auto& [name, p] : model.named_parameters()) {
        CAPTURE(name);
        const std::vector<double> v = p.to_vector<double>();
        if (p.dim() == 2) {
            const double want = ends_with(name, "c_proj.weight") ? proj_std : 0.02;
            const double n = static_cast<double>(v.size());
            CHECK(std::abs(mean_of(v)) < 5 * want / std::sqrt(n));
            CHECK(std::abs(std_of(v) / want - 1) < 5 / std::sqrt(2 * n));  // 5 standard errors
        } else {
            const double want = ends_with(name, ".bias") ? 0.0 : 1.0;
            CHECK(*std::min_element(v.begin(), v.end()) == want);
            CHECK(*std::max_element(v.begin(), v.end()) == want);
        }
    }
    // The same seed gives the same weights; another seed, other weights.
    CHECK(qk::test::max_abs_diff(param(GPT(c, 42), "transformer.wte.weight"),
                                 param(model, "transformer.wte.weight")) == 0);
    CHECK(qk::test::max_abs_diff(param(GPT(c, 43), "transformer.wte.weight"),
                                 param(model, "transformer.wte.weight")) > 0);
}

TEST_CASE("qk_scale starts at log2(T²−T) (henry), sqrt(D), or the number given") {
    GPTConfig c = tiny_config();
    c.block_size = 16, c.n_embd = 32, c.n_head = 2, c.qk_norm = QKNorm::l2;
    const std::vector<std::pair<std::string, double>> cases{
        {"henry", std::log2(16.0 * 16 - 16)}, {"sqrt_d", 4.0}, {"3.25", 3.25}};
    for (const auto& [init, want] : cases)
        for (bool per_head : {false, true}) {
            c.qk_scale_init = init, c.qk_scale_per_head = per_head;
            GPT model(c, 1, kF64);
            for (double g : param(model, "transformer.h.1.attn.qk_scale").to_vector<double>())
                CHECK(g == doctest::Approx(want).epsilon(1e-12));
        }
    c.qk_scale_init = "fast";
    CHECK(throws_with([&] { GPT(c, 1); }, {"qk_scale_init", "fast"}));
}

// ---- every variant, end to end -------------------------------------------------------------

namespace {

// Gradchecks variants [first, last) of the list on the tiny model, in float64, with O(1) weights.
void gradcheck_variants(size_t first, size_t last) {
    Tensor ids, targets;
    fixed_batch(2, 4, 7, 5, ids, targets);
    for (size_t v = first; v < last; ++v) {
        const Variant& variant = variants()[v];
        CAPTURE(variant.name);
        GPTConfig c = tiny_config();
        variant.apply(c);
        GPT model(c, 3, kF64);
        randomize(model, 4);
        // A representative subset, every attention parameter of layer 0 but c_attn's weight (its
        // bias takes the same d(qkv)), and wte, which sees every position of every path; a
        // gradcheck over all ~2k parameters would take seconds.
        const std::string c_attn0 = c.bias ? "h.0.attn.c_attn.bias" : "h.0.attn.c_attn.weight";
        std::vector<Tensor> inputs;
        for (const auto& [name, p] : model.named_parameters())
            if (ends_with(name, c_attn0) || name.find("h.0.attn.q_norm") != std::string::npos ||
                name.find("h.0.attn.k_norm") != std::string::npos ||
                name.find("h.0.attn.v_norm") != std::string::npos || ends_with(name, "qk_scale") ||
                name == "transformer.h.1.attn.c_proj.bias" || name == "transformer.wte.weight" ||
                name == "transformer.h.1.ln_1.weight" || name == "transformer.ln_f.weight" ||
                name == "transformer.h.1.post_ln_1.weight" || name == "lm_head.weight" ||
                ends_with(name, "h.1.mlp.c_gate.weight") || ends_with(name, "h.1.mlp.c_fc.weight"))
                inputs.push_back(p);
        REQUIRE(inputs.size() >= 4);
        // The logits and the loss together: the probe weighs every logit, the loss adds
        // cross-entropy and the z-loss.
        auto f = [&] {
            GPTOutput out = model.forward(ids, targets);
            return cat({out.logits.reshape({-1}), out.loss.reshape({1})});
        };
        CHECK_GRADCHECK(f, inputs);
    }
}

}  // namespace

TEST_CASE("gradcheck end to end in float64: none and the QK-norm variants") {
    gradcheck_variants(0, 8);
}

TEST_CASE("gradcheck end to end in float64: soft-caps, qkv_norm, z-loss and the output options") {
    gradcheck_variants(8, variants().size());
}

TEST_CASE("the fused and the naive attention give the same model, loss and gradients") {
    Tensor ids, targets;
    fixed_batch(2, 4, 7, 5, ids, targets);
    for (const Variant& variant : variants()) {
        CAPTURE(variant.name);
        std::vector<Tensor> losses;
        std::vector<std::vector<Tensor>> grads;
        for (bool fused : {true, false}) {
            GPTConfig c = tiny_config();
            variant.apply(c);
            c.fused_attention = fused;
            GPT model(c, 3, kF64);
            randomize(model, 4);
            GPTOutput out = model.forward(ids, targets);
            out.loss.backward();
            losses.push_back(out.loss.detach());
            grads.emplace_back();
            for (const auto& [name, p] : model.named_parameters()) grads.back().push_back(p.grad());
        }
        CHECK(qk::test::max_abs_diff(losses[0], losses[1]) < 1e-13);
        for (size_t i = 0; i < grads[0].size(); ++i)
            CHECK(qk::test::max_abs_diff(grads[0][i], grads[1][i]) < 1e-12);
    }
}

TEST_CASE("the z-loss adds z·mean(logsumexp(logits)²), and cross_entropy stays the plain loss") {
    Tensor ids, targets;
    fixed_batch(2, 4, 7, 6, ids, targets);
    GPTConfig c = tiny_config();
    c.z_loss = 0.25;
    GPT model(c, 3, kF64);
    randomize(model, 8);
    GPTOutput out = model.forward(ids, targets);
    const std::vector<double> logits = out.logits.to_vector<double>();
    double ce = 0, z = 0;
    for (int64_t r = 0; r < 8; ++r) {
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < 7; ++v) m = std::max(m, logits[r * 7 + v]);
        for (int64_t v = 0; v < 7; ++v) s += std::exp(logits[r * 7 + v] - m);
        const double lse = m + std::log(s);
        ce += (lse - logits[r * 7 + targets.to_vector<int32_t>()[r]]) / 8;
        z += lse * lse / 8;
    }
    CHECK(out.cross_entropy.item() == doctest::Approx(ce).epsilon(1e-12));
    CHECK(out.loss.item() == doctest::Approx(ce + 0.25 * z).epsilon(1e-12));
}

// ---- attention against naive loops ---------------------------------------------------------

namespace {

using Values = std::vector<double>;

// Normalises v[0..n) in place like the variant's norm: gain w and bias b may be empty.
void naive_norm(double* v, int64_t n, const GPTConfig& c, const Values& w, const Values& b,
                double eps) {
    if (c.qk_norm == QKNorm::l2 || c.qk_norm == QKNorm::lp) {
        const double p = c.qk_norm == QKNorm::l2 ? 2.0 : c.lp_p;
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::pow(std::abs(v[i]), p);
        const double denom = std::max(std::pow(s, 1 / p), 1e-12);
        for (int64_t i = 0; i < n; ++i) v[i] /= denom;
        return;
    }
    double mean = 0, ms = 0;
    if (c.qk_norm == QKNorm::layernorm)
        for (int64_t i = 0; i < n; ++i) mean += v[i] / n;
    for (int64_t i = 0; i < n; ++i) ms += (v[i] - mean) * (v[i] - mean) / n;
    const double offset = c.norm_unit_offset ? 1.0 : 0.0;  // Gemma's (1 + w)
    for (int64_t i = 0; i < n; ++i)
        v[i] = (v[i] - mean) / std::sqrt(ms + eps) * (offset + w[i]) + (b.empty() ? 0.0 : b[i]);
}

Values values(const Tensor& t) { return t.defined() ? t.to_vector<double>() : Values{}; }

// RoPE on one head vector v[0..D) at position t, as complex numbers: pair i is v_i + i·v_{i+D/2},
// multiplied by e^{i·t·θ^(−2i/D)}.
void naive_rope(double* v, int64_t D, int64_t t, double theta) {
    for (int64_t i = 0; i < D / 2; ++i) {
        const std::complex<double> z(v[i], v[i + D / 2]);
        const std::complex<double> turned = z * std::polar(1.0, t * std::pow(theta, -2.0 * i / D));
        v[i] = turned.real(), v[i + D / 2] = turned.imag();
    }
}

// y = x Wᵀ + b over rows of x: (rows, in) -> (rows, out).
Values naive_linear(const Values& x, const Linear& lin) {
    const Values w = values(lin.weight), b = values(lin.bias);
    const int64_t out = lin.weight.size(0), in = lin.weight.size(1), rows = x.size() / in;
    Values y(rows * out);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
            double s = b.empty() ? 0.0 : b[o];
            for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
    return y;
}

// The whole layer (layer 0 of the config: its window and RoPE base) in plain loops over b, h,
// i, j; fills the stability signals too. q has H heads, k and v Hkv, each of width D.
Values naive_attention(const CausalSelfAttention& a, const GPTConfig& c, const Values& x, int64_t B,
                       int64_t T, AttentionStats& st) {
    const int64_t H = c.n_head, D = c.head_size > 0 ? c.head_size : c.n_embd / H;
    const int64_t Hkv = c.n_kv_head > 0 ? c.n_kv_head : H, group = H / Hkv;
    const int64_t Wq = H * D, Wkv = Hkv * D, row = Wq + 2 * Wkv;
    const bool sliding = c.sliding_window > 0 && c.layer_types.rfind("full", 0) != 0;
    const int64_t window = sliding ? c.sliding_window : T;
    const double theta = sliding && c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
    const double scale_dim = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(D);
    Values qkv = naive_linear(x, *a.c_attn);  // (B, T, Wq + 2 Wkv): q, k, v
    auto at = [&](int64_t part, int64_t b, int64_t t) {
        return &qkv[(b * T + t) * row + (part == 0 ? 0 : Wq + (part - 1) * Wkv)];
    };
    auto heads = [&](int64_t part) { return part == 0 ? H : Hkv; };
    double norms[2] = {0, 0};
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t part : {0, 1})
                for (int64_t h = 0; h < heads(part); ++h) {
                    double s = 0;
                    for (int64_t d = 0; d < D; ++d) s += std::pow(at(part, b, t)[h * D + d], 2);
                    norms[part] += std::sqrt(s) / (B * T * heads(part));
                }
    st.q_norm = norms[0], st.k_norm = norms[1];
    auto rotate_q_and_k = [&] {
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t part : {0, 1})
                    for (int64_t h = 0; h < heads(part); ++h)
                        naive_rope(at(part, b, t) + h * D, D, t, theta);
    };
    const bool rope = c.pos_emb == PosEmb::rope;
    if (rope && c.qk_norm_order == QKNormOrder::after_rope) rotate_q_and_k();
    if (c.qk_norm != QKNorm::none) {
        const bool full = c.qk_norm_scope == NormScope::full && c.qk_norm != QKNorm::l2 &&
                          c.qk_norm != QKNorm::lp;
        const std::shared_ptr<Norm> norms[3] = {a.q_norm, a.k_norm, a.v_norm};
        for (int64_t part = 0; part < (c.qkv_norm ? 3 : 2); ++part) {
            const Values w = norms[part] ? values(norms[part]->weight) : Values{};
            const Values bias = norms[part] ? values(norms[part]->bias) : Values{};
            const double eps = norms[part] ? norms[part]->eps : 0;
            const int64_t width = part == 0 ? Wq : Wkv;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t h = 0; h < (full ? 1 : heads(part)); ++h)
                        naive_norm(at(part, b, t) + h * D, full ? width : D, c, w, bias, eps);
        }
    }
    if (rope && c.qk_norm_order == QKNormOrder::before_rope) rotate_q_and_k();
    const Values g = values(a.qk_scale);
    Values y(B * T * Wq, 0.0);
    double max_logit = 0, entropy = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const double scale = g.empty() ? 1 / std::sqrt(scale_dim) : g[g.size() == 1 ? 0 : h];
            const int64_t kv = h / group;  // the key/value head this query head reads
            for (int64_t i = 0; i < T; ++i) {
                const int64_t first = std::max<int64_t>(0, i - window + 1);
                Values s(i + 1 - first);
                double m = -INFINITY;
                for (int64_t j = first; j <= i; ++j) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d)
                        dot += at(0, b, i)[h * D + d] * at(1, b, j)[kv * D + d];
                    double& e = s[j - first];
                    e = scale * dot;
                    max_logit = std::max(max_logit, std::abs(e));
                    if (c.attn_softcap > 0) e = c.attn_softcap * std::tanh(e / c.attn_softcap);
                    m = std::max(m, e);
                }
                double z = 0;
                for (double& e : s) z += (e = std::exp(e - m));
                for (int64_t j = first; j <= i; ++j) {
                    const double p = s[j - first] / z;
                    entropy -= p * std::log(p) / (B * H * T);
                    for (int64_t d = 0; d < D; ++d)
                        y[(b * T + i) * Wq + h * D + d] += p * at(2, b, j)[kv * D + d];
                }
            }
        }
    st.max_logit = max_logit, st.entropy = entropy, st.qk_scale = g.empty() ? 0 : mean_of(g);
    return naive_linear(y, *a.c_proj);
}

}  // namespace

TEST_CASE("attention forward and its stability signals match naive loops, for every variant") {
    const int64_t B = 2, T = 5;
    for (bool fused : {true, false})
        for (const auto& variant : variants()) {
            CAPTURE(variant.name);
            CAPTURE(fused);
            GPTConfig c = tiny_config();
            c.block_size = T, c.n_embd = 12, c.n_head = 3;
            c.fused_attention = fused;
            variant.apply(c);
            Generator gen(11);
            CausalSelfAttention attn(c, gen, kF64);
            {  // random gains, biases and scales, so that each one is seen
                NoGradGuard no_grad;
                for (auto& [name, p] : attn.named_parameters())
                    if (p.dim() == 1)
                        copy_into(p, normal(p.shape(), ends_with(name, "bias") ? 0.0 : 1.5, 0.4,
                                            kF64, gen));
            }
            Tensor x = normal({B, T, c.n_embd}, 0, 1, kF64, gen);
            AttentionStats got, want;
            Tensor y = attn.forward(x, &got);
            const Values ref = naive_attention(attn, c, x.to_vector<double>(), B, T, want);
            CHECK(y.shape() == x.shape());
            double worst = 0;
            const Values yv = y.to_vector<double>();
            for (size_t i = 0; i < ref.size(); ++i)
                worst = std::max(worst, std::abs(yv[i] - ref[i]));
            CHECK(worst < 1e-12);
            CHECK(got.max_logit == doctest::Approx(want.max_logit).epsilon(1e-12));
            CHECK(got.entropy == doctest::Approx(want.entropy).epsilon(1e-12));
            CHECK(got.q_norm == doctest::Approx(want.q_norm).epsilon(1e-12));
            CHECK(got.k_norm == doctest::Approx(want.k_norm).epsilon(1e-12));
            CHECK(got.qk_scale == doctest::Approx(want.qk_scale).epsilon(1e-12));
        }
}

TEST_CASE("attention is causal: changing a later token leaves earlier outputs unchanged") {
    GPTConfig c = tiny_config();
    c.qk_norm = QKNorm::layernorm;
    GPT model(c, 2, kF64);
    Tensor a = from_ids({1, 2, 3, 4}, {1, 4}), b = from_ids({1, 2, 3, 6}, {1, 4});
    Tensor la = model.forward(a).logits, lb = model.forward(b).logits;
    CHECK(qk::test::max_abs_diff(la.narrow(1, 0, 3), lb.narrow(1, 0, 3)) == 0);
    CHECK(qk::test::max_abs_diff(la.narrow(1, 3, 1), lb.narrow(1, 3, 1)) > 0);
}

TEST_CASE("GPT rejects bad inputs with clear errors") {
    GPT model(tiny_config(), 1);
    CHECK(throws_with(
        [&] {
            model.forward(from_ids({1, 2, 3, 4, 5}, {1, 5}));
        },
        {"5", "block_size 4"}));
    CHECK(throws_with([&] { model.forward(zeros({1, 3})); }, {"int32"}));
    CHECK(throws_with(
        [&] {
            model.forward(from_ids({1, 2}, {1, 2}), from_ids({1, 2, 3}, {1, 3}));
        },
        {"targets", "[1, 3]"}));
}

namespace {

// Row b reads (k_b, 0, 1, ..., 6) and must predict k_b at every position. From position 1
// on, every row has the same tokens at the same places, so the only way to tell the rows
// apart is to attend back to position 0: a model whose attention is broken stays at a loss
// of at least 7/8 · ln 8 ≈ 1.8 nats, two thirds of the initial ln 16 ≈ 2.8.
void overfit_variants(size_t first, size_t last) {
    const int64_t B = 8, T = 8, V = 16;
    std::vector<int32_t> x, y;
    for (int32_t b = 0; b < B; ++b)
        for (int32_t t = 0; t < T; ++t) {
            x.push_back(t == 0 ? 8 + b : t - 1);
            y.push_back(8 + b);
        }
    const Tensor ids = from_ids(x, {B, T}), targets = from_ids(y, {B, T});
    for (size_t v = first; v < last; ++v) {
        const Variant& variant = variants()[v];
        CAPTURE(variant.name);
        GPTConfig c;
        c.vocab_size = V, c.block_size = T, c.n_layer = 2, c.n_head = 2, c.n_embd = 32;
        variant.apply(c);
        // Caps and z-loss at the strengths used in practice (the gradcheck used strong ones).
        if (c.attn_softcap > 0) c.attn_softcap = 5;
        if (c.logit_softcap > 0) c.logit_softcap = 30;
        if (c.z_loss > 0) c.z_loss = 1e-3;
        GPT model(c, 7);
        AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0});
        double initial = 0, final_loss = 0;
        for (int step = 0; step < 30; ++step) {
            GPTOutput out = model.forward(ids, targets);
            final_loss = out.cross_entropy.item();
            if (step == 0) initial = final_loss;
            out.loss.backward();
            opt.step(1e-2);
            opt.zero_grad();
        }
        CHECK(initial == doctest::Approx(std::log(16.0)).epsilon(0.05));  // uniform at init
        CHECK(final_loss < 0.1 * initial);  // measured: below 0.035 · initial for every variant
    }
}

}  // namespace

TEST_CASE("none and the QK-norm variants overfit a fixed batch that only attention can fit") {
    overfit_variants(0, 8);
}

TEST_CASE("soft-caps, qkv_norm, z-loss and the output options overfit the same batch") {
    overfit_variants(8, variants().size());
}
