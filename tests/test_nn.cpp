// The model (nn/): parameter names, shapes and initialisation as the model spec says, every
// attention variant (tests/nn_variants.h) gradchecked end to end in float64, fused against naive,
// causality, and every variant overfitting a fixed batch that needs attention. The attention layer
// against plain loops is tests/test_nn_attention.cpp; the optimisers and data are in
// test_train.cpp, the config's string form in test_config.cpp.
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "helpers.h"
#include "nn/model/attention.h"
#include "nn/model/config.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "nn_variants.h"

using namespace qk;
using namespace qk::nn;
using qk::test::ends_with;
using qk::test::mean_of;
using qk::test::throws_with;
using qk::test::tiny_config;
using qk::test::Variant;
using qk::test::variants;

namespace {

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
