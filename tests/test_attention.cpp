// Fused attention (ops/attention.cpp, the cpu kernels of ops/attention_cpu.cpp): forward and
// signals against a naive float64 loop; float64 gradchecks for every combination of causal,
// soft-cap and scale (number, (1), (H)); float32 parity with the unfused composition (v1), output
// and every gradient; thread-count independence; NaN rows; large logits; bad inputs.
#include <cmath>
#include <vector>

#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;
using qk::test::ThreadCount;
using qk::test::throws_with;

namespace {

struct Naive {
    std::vector<double> out, max_abs, entropy;
};

// The attention math of ops/attention.cpp's header, one row at a time in float64 from the formulas
// (with the scores of a row materialised): independent of both the fused and the unfused code.
// scale: one value per head. k and v may have fewer heads (Hkv): query head h reads head
// h / (H / Hkv) of its batch. window > 0: row i sees keys j with i + (Tk − Tq) − window < j.
Naive naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                      const std::vector<double>& scale, bool causal, double cap,
                      int64_t window = 0) {
    const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
    const int64_t Hkv = k.size(1);
    const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
    Naive n{std::vector<double>(qv.size()), {}, {}};
    for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < Tq; ++i) {
            const int64_t kvh = (bh / H) * Hkv + (bh % H) / (H / Hkv);
            const int64_t end = causal ? i + (Tk - Tq) + 1 : Tk;
            const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
            std::vector<double> z;
            double m = -INFINITY, max_abs = 0;
            for (int64_t j = first; j < end; ++j) {
                double r = 0;
                for (int64_t d = 0; d < D; ++d)
                    r += qv[(bh * Tq + i) * D + d] * kv[(kvh * Tk + j) * D + d];
                const double s = scale[bh % H] * r;
                max_abs = std::max(max_abs, std::abs(s));
                z.push_back(cap > 0 ? cap * std::tanh(s / cap) : s);
                m = std::max(m, z.back());
            }
            double l = 0;
            for (double zj : z) l += std::exp(zj - m);
            double entropy = 0;
            for (int64_t j = first; j < end; ++j) {
                const double p = std::exp(z[j - first] - m) / l;
                entropy -= p * std::log(p);
                for (int64_t d = 0; d < D; ++d)
                    n.out[(bh * Tq + i) * D + d] += p * vv[(kvh * Tk + j) * D + d];
            }
            n.max_abs.push_back(max_abs);
            n.entropy.push_back(entropy);
        }
    return n;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    return worst;
}

struct Variant {
    bool causal;
    double cap;
    int scale_kind;  // 0: the default number 1/sqrt(D), 1: tensor (1), 2: tensor (H)
};

std::vector<Variant> all_variants() {
    std::vector<Variant> variants;
    for (bool causal : {false, true})
        for (double cap : {0.0, 1.5})
            for (int scale_kind : {0, 1, 2}) variants.push_back({causal, cap, scale_kind});
    return variants;
}

std::string describe(const Variant& v) {
    static const char* kinds[] = {"number", "tensor (1)", "tensor (H)"};
    return fmt::format("causal={} cap={} scale={}", v.causal, v.cap, kinds[v.scale_kind]);
}

// The scale tensor of a variant (undefined for the number), as a float64 leaf.
Tensor scale_leaf(const Variant& v, int64_t H, uint64_t seed) {
    if (v.scale_kind == 0) return {};
    Tensor g = leaf({v.scale_kind == 1 ? 1 : H}, seed, 0.3) + 0.8;  // around 0.8: varied logits
    g = g.detach();
    g.requires_grad_();
    return g;
}

AttentionOptions options_of(const Variant& v, const Tensor& scale) {
    AttentionOptions o;
    o.causal = v.causal;
    o.softcap = v.cap;
    o.scale_tensor = scale;
    return o;
}

std::vector<double> per_head_scale(const Tensor& scale, int64_t H, int64_t D) {
    if (!scale.defined()) return std::vector<double>(H, 1.0 / std::sqrt(double(D)));
    const auto g = scale.to_vector<double>();
    return g.size() == 1 ? std::vector<double>(H, g[0]) : g;
}

}  // namespace

TEST_CASE("attention matches a naive float64 loop, signals included, over ragged tiles") {
    // T = 150 spans three 64-row tiles with a ragged last one; Tq = 70 < Tk = 150 shifts the mask.
    for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{150, 150}, {70, 150}, {1, 9}})
        for (const Variant& var : all_variants()) {
            CAPTURE(describe(var));
            CAPTURE(Tq);
            Tensor q = leaf({2, 3, Tq, 16}, 1).detach(), k = leaf({2, 3, Tk, 16}, 2).detach();
            Tensor v = leaf({2, 3, Tk, 16}, 3).detach();
            Tensor scale = scale_leaf(var, 3, 4);
            AttentionSignals signals;
            Tensor out = attention(q, k, v, options_of(var, scale), &signals);
            const Naive want =
                naive_attention(q, k, v, per_head_scale(scale, 3, 16), var.causal, var.cap);
            CHECK(out.shape() == q.shape());
            CHECK(max_diff(out.to_vector<double>(), want.out) < 1e-13);
            CHECK(signals.max_abs_logit.shape() == Shape{2, 3, Tq});
            CHECK(max_diff(signals.max_abs_logit.to_vector<double>(), want.max_abs) < 1e-13);
            CHECK(max_diff(signals.entropy.to_vector<double>(), want.entropy) < 1e-12);
        }
}

TEST_CASE(
    "attention at lengths around the 64-row tiles, Tq = Tk and Tq < Tk, forward and backward") {
    // T = 1 (the first step of sampling from a one-token prompt), 63, 64, 65, 127, 128, 129: a
    // query tile whose last visible key is alone in its key tile is where a tile loop that stops
    // one tile short goes wrong. Forward against the naive loop; gradients against the unfused
    // composition (float64, a random probe).
    std::vector<std::pair<int64_t, int64_t>> lengths;
    for (int64_t T : {1, 63, 64, 65, 127, 128, 129}) {
        lengths.push_back({T, T});
        if (T < 129) lengths.push_back({T, 129});
        if (T < 65) lengths.push_back({T, 65});
    }
    uint64_t seed = 300;
    for (auto [Tq, Tk] : lengths)
        for (bool causal : {true, false}) {
            CAPTURE(Tq);
            CAPTURE(Tk);
            CAPTURE(causal);
            Tensor q = leaf({1, 2, Tq, 8}, ++seed), k = leaf({1, 2, Tk, 8}, ++seed);
            Tensor v = leaf({1, 2, Tk, 8}, ++seed);
            const AttentionOptions o{.causal = causal, .softcap = 3.0};
            AttentionSignals signals;
            const Tensor out = attention(q, k, v, o, &signals);
            const Naive want =
                naive_attention(q, k, v, std::vector<double>(2, 1 / std::sqrt(8.0)), causal, 3.0);
            CHECK(max_diff(out.to_vector<double>(), want.out) < 1e-13);
            CHECK(max_diff(signals.max_abs_logit.to_vector<double>(), want.max_abs) < 1e-13);
            CHECK(max_diff(signals.entropy.to_vector<double>(), want.entropy) < 1e-12);
            const Tensor probe = leaf(out.shape(), ++seed).detach();
            auto grads_of = [&](const Tensor& y) {
                for (Tensor t : {q, k, v}) t.zero_grad();
                sum(y * probe).backward();
                return std::vector<Tensor>{q.grad().clone(), k.grad().clone(), v.grad().clone()};
            };
            const std::vector<Tensor> fused = grads_of(attention(q, k, v, o));
            const std::vector<Tensor> unfused = grads_of(attention_unfused(q, k, v, o));
            for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(fused[i], unfused[i]) < 1e-12);
        }
}

TEST_CASE("grouped-query attention and sliding windows match the naive loop, fused and unfused") {
    // 6 query heads on 3, 2 or 1 key/value heads; windows of 1 (each row sees itself only), 30
    // (inside one 64-key tile or across two) and 100 (wider than some rows' prefix); Tq < Tk.
    struct Case {
        int64_t Hkv, window, Tq, Tk;
    };
    uint64_t seed = 500;
    for (const Case& c : {Case{3, 0, 130, 130}, Case{2, 30, 130, 130}, Case{1, 1, 70, 150},
                          Case{6, 100, 150, 150}, Case{1, 30, 1, 9}, Case{2, 64, 129, 129}})
        for (double cap : {0.0, 2.0}) {
            CAPTURE(c.Hkv);
            CAPTURE(c.window);
            CAPTURE(c.Tq);
            CAPTURE(cap);
            Tensor q = leaf({2, 6, c.Tq, 8}, ++seed).detach();
            Tensor k = leaf({2, c.Hkv, c.Tk, 8}, ++seed).detach();
            Tensor v = leaf({2, c.Hkv, c.Tk, 8}, ++seed).detach();
            const AttentionOptions o{.causal = true, .window = c.window, .softcap = cap};
            const Naive want = naive_attention(q, k, v, std::vector<double>(6, 1 / std::sqrt(8.0)),
                                               true, cap, c.window);
            for (auto path : {attention, attention_unfused}) {
                AttentionSignals signals;
                const Tensor out = path(q, k, v, o, &signals);
                CHECK(max_diff(out.to_vector<double>(), want.out) < 1e-13);
                CHECK(max_diff(signals.max_abs_logit.to_vector<double>(), want.max_abs) < 1e-13);
                CHECK(max_diff(signals.entropy.to_vector<double>(), want.entropy) < 1e-12);
            }
        }
}

TEST_CASE("grouped-query and windowed attention: float64 gradients, fused against the unfused") {
    // Finite differences on a small case (a random probe inside gradcheck), then every gradient of
    // the fused op against the unfused composition (repeat_kv, a window mask) over ragged tiles.
    Tensor q = leaf({1, 4, 67, 4}, 601), k = leaf({1, 2, 67, 4}, 602), v = leaf({1, 2, 67, 4}, 603);
    Tensor g = (leaf({4}, 604, 0.3) + 0.8).detach();
    g.requires_grad_();
    const AttentionOptions o{.causal = true, .window = 20, .scale_tensor = g, .softcap = 2.0};
    CHECK(gradcheck([&] { return attention(q, k, v, o); }, {q, k, v, g}));
    uint64_t seed = 610;
    for (int64_t Hkv : {1, 2, 4})
        for (int64_t window : {0, 1, 22, 70}) {  // 22: row 64 is the last to see key 63
            CAPTURE(Hkv);
            CAPTURE(window);
            Tensor qq = leaf({2, 4, 130, 8}, ++seed), kk = leaf({2, Hkv, 150, 8}, ++seed);
            Tensor vv = leaf({2, Hkv, 150, 8}, ++seed);
            const Tensor probe = leaf({2, 4, 130, 8}, ++seed).detach();
            const AttentionOptions ow{.causal = true, .window = window, .softcap = 3.0};
            auto grads_of = [&](const Tensor& y) {
                for (Tensor t : {qq, kk, vv}) t.zero_grad();
                sum(y * probe).backward();
                return std::vector<Tensor>{qq.grad().clone(), kk.grad().clone(), vv.grad().clone()};
            };
            const auto fused = grads_of(attention(qq, kk, vv, ow));
            const auto unfused = grads_of(attention_unfused(qq, kk, vv, ow));
            for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(fused[i], unfused[i]) < 1e-12);
        }
}

TEST_CASE("attention's gradients match finite differences in float64 for every variant") {
    // T = 67: two key and query tiles, the second ragged; a random probe inside gradcheck. Two
    // batches of two heads (the per-head scale's index), and D = 2: each input element costs two
    // forwards of T² logits whatever D is, so a wider head only multiplies the count (D = 4 made
    // this the longest test under ASan, ~7 minutes), and no kernel path depends on D.
    for (const Variant& var : all_variants()) {
        CAPTURE(describe(var));
        Tensor q = leaf({2, 2, 67, 2}, 11), k = leaf({2, 2, 67, 2}, 12),
               v = leaf({2, 2, 67, 2}, 13);
        Tensor scale = scale_leaf(var, 2, 14);
        std::vector<Tensor> inputs{q, k, v};
        if (scale.defined()) inputs.push_back(scale);
        const AttentionOptions o = options_of(var, scale);
        CHECK(gradcheck([&] { return attention(q, k, v, o); }, inputs));
    }
    // Fewer queries than keys under the mask, and a given number as the scale.
    Tensor q = leaf({1, 2, 5, 8}, 21), k = leaf({1, 2, 70, 8}, 22), v = leaf({1, 2, 70, 8}, 23);
    AttentionOptions o{.causal = true, .scale = 0.7, .softcap = 2.0};
    CHECK(gradcheck([&] { return attention(q, k, v, o); }, {q, k, v}));
}

TEST_CASE("attention agrees with the unfused composition in float32: output and every gradient") {
    // Both float32 paths against the float64 truth (the fused op in float64, held to the naive
    // loop above): the fused one must be as accurate as the unfused one, output and gradients.
    for (const Variant& var : all_variants()) {
        CAPTURE(describe(var));
        std::vector<Tensor> f64{leaf({2, 3, 130, 16}, 31), leaf({2, 3, 130, 16}, 32),
                                leaf({2, 3, 130, 16}, 33)};
        if (Tensor scale = scale_leaf(var, 3, 34); scale.defined()) f64.push_back(scale);
        const Tensor probe = leaf({2, 3, 130, 16}, 35).detach();
        // Output and input gradients of one path on float32 (or float64) copies of the inputs.
        auto run = [&](auto path, DType dtype) {
            std::vector<Tensor> in;
            for (const Tensor& t : f64) {
                in.push_back(t.detach().to(dtype));
                in.back().requires_grad_();
            }
            const AttentionOptions o = options_of(var, in.size() == 4 ? in[3] : Tensor());
            Tensor out = path(in[0], in[1], in[2], o, nullptr);
            sum(out * probe.to(dtype)).backward();
            std::vector<Tensor> results{out.detach().to(kF64)};
            for (const Tensor& t : in) results.push_back(t.grad().to(kF64));
            return results;
        };
        const auto truth = run(attention, kF64);
        const auto fused = run(attention, kF32), unfused = run(attention_unfused, kF32);
        for (size_t i = 0; i < 4; ++i) {
            CAPTURE(i);  // 0: the output, then the gradients of q, k, v
            const double size = std::max(1.0, max(abs(truth[i])).item());
            const double fused_error = max_abs_diff(fused[i], truth[i]) / size;
            const double unfused_error = max_abs_diff(unfused[i], truth[i]) / size;
            CHECK(fused_error <= 2 * unfused_error + 1e-7);
            CHECK(fused_error < 1e-5);
        }
        if (truth.size() == 5) {
            // The scale's gradient Σ_i q_i · ∂loss/∂(g q_i) cancels: its row terms add up in
            // absolute value to 70-330x the result here, so either path's error is a matter of
            // luck relative to the result. Both must be within 4 float32 ulps of that sum.
            const Tensor g = f64[3].detach();
            const Tensor terms = sum(f64[0].detach() * truth[2] / g.view({-1, 1, 1}), {-1});
            const double scale = sum(abs(terms)).item();
            constexpr double eps32 = 1.1920929e-7;
            CHECK(max_abs_diff(fused[4], truth[4]) <= 4 * eps32 * scale);
            CHECK(max_abs_diff(unfused[4], truth[4]) <= 4 * eps32 * scale);
        }
    }
}

TEST_CASE("attention's signals equal the unfused path's host measurement") {
    Tensor q = leaf({2, 2, 100, 8}, 41, 2.0).detach().to(kF32);
    Tensor k = leaf({2, 2, 100, 8}, 42, 2.0).detach().to(kF32);
    Tensor v = leaf({2, 2, 100, 8}, 43).detach().to(kF32);
    for (double cap : {0.0, 3.0}) {
        AttentionOptions o{.causal = true, .softcap = cap};
        AttentionSignals fused, unfused;
        attention(q, k, v, o, &fused);
        attention_unfused(q, k, v, o, &unfused);
        CHECK(max_abs_diff(fused.max_abs_logit, unfused.max_abs_logit) < 1e-5);
        CHECK(max_abs_diff(fused.entropy, unfused.entropy) < 1e-5);
    }
}

TEST_CASE("attention gives the same bits at any thread count") {
    Tensor q = leaf({2, 3, 200, 16}, 51).detach().to(kF32),
           k = leaf({2, 3, 200, 16}, 52).detach().to(kF32);
    Tensor v = leaf({2, 3, 200, 16}, 53).detach().to(kF32);
    Tensor probe = leaf({2, 3, 200, 16}, 54).detach().to(kF32);
    auto run = [&](int threads) {
        ThreadCount scope(threads);
        Tensor qq = q.clone(), kk = k.clone(), vv = v.clone();
        for (Tensor* t : {&qq, &kk, &vv}) t->requires_grad_();
        Tensor out = attention(qq, kk, vv, {.causal = true, .softcap = 5.0});
        sum(out * probe).backward();
        return std::vector<Tensor>{out, qq.grad(), kk.grad(), vv.grad()};
    };
    const auto one = run(1), three = run(3);
    for (size_t i = 0; i < one.size(); ++i) CHECK(max_abs_diff(one[i], three[i]) == 0);
}

TEST_CASE("attention keeps large logits finite and reports NaN rows") {
    // Logits of ~±2000: exp would overflow without the running max.
    Tensor q = leaf({1, 1, 80, 8}, 61, 20.0).detach(), k = leaf({1, 1, 80, 8}, 62, 20.0).detach();
    Tensor v = leaf({1, 1, 80, 8}, 63).detach();
    const Naive want = naive_attention(q, k, v, {1.0}, true, 0);
    Tensor out = attention(q.to(kF32), k.to(kF32), v.to(kF32), {.causal = true, .scale = 1.0});
    CHECK(max_diff(out.to_vector<double>(), want.out) < 1e-3);

    // A NaN in query row 7 makes row 7 (and only it) NaN, with its signals.
    Tensor qn = q.clone();
    qn.set({0, 0, 7, 3}, NAN);
    AttentionSignals signals;
    Tensor y = attention(qn, k, v, {.causal = true}, &signals);
    CHECK(std::isnan(y.at({0, 0, 7, 0})));
    CHECK(std::isfinite(y.at({0, 0, 6, 0})));
    CHECK(std::isfinite(y.at({0, 0, 8, 0})));
    CHECK(std::isnan(signals.max_abs_logit.at({0, 0, 7})));
    CHECK(std::isnan(signals.entropy.at({0, 0, 7})));
    // A NaN in key 10 reaches exactly the rows that see it under the causal mask.
    Tensor kn = k.clone();
    kn.set({0, 0, 10, 0}, NAN);
    Tensor z = attention(q, kn, v, {.causal = true});
    CHECK(std::isfinite(z.at({0, 0, 9, 0})));
    CHECK(std::isnan(z.at({0, 0, 10, 0})));
    CHECK(std::isnan(z.at({0, 0, 79, 0})));
}

TEST_CASE("attention's backward stays finite at logits of 1e12, as its forward does") {
    // The weights of a run blown up by a huge learning rate: q, k near 1e6, v near 1e13. The
    // backward recomputes the logits with other GEMM calls than the forward, which round
    // differently by ~1e5 at this size; p = exp(z − lse) must not overflow.
    Tensor q = (leaf({2, 2, 80, 8}, 81) * 3e6).detach().to(kF32);
    Tensor k = (leaf({2, 2, 80, 8}, 82) * 2e6).detach().to(kF32);
    Tensor v = (leaf({2, 2, 80, 8}, 83) * 1e13).detach().to(kF32);
    for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
    Tensor out = attention(q, k, v, {.causal = true});
    CHECK(std::isfinite(sum(abs(out)).item()));
    sum(out * 0.0).backward();  // a saturated loss: an upstream gradient of zeros
    for (const Tensor& t : {q, k, v}) CHECK(max(abs(t.grad())).item() == 0);
}

TEST_CASE("attention refuses bad shapes, dtypes and options with the op's name") {
    Tensor q = leaf({2, 3, 8, 4}, 71).detach(), k = leaf({2, 3, 8, 4}, 72).detach();
    Tensor v = leaf({2, 3, 8, 4}, 73).detach();
    CHECK(throws_with([&] { attention(q.view({6, 8, 4}), k, v); }, {"attention", "(B, H, T, D)"}));
    CHECK(throws_with(
        [&] {
            attention(q, leaf({2, 3, 8, 5}, 1).detach(), v);
        },
        {"attention", "[2, 3, 8, 5]"}));
    CHECK(throws_with([&] { attention(q, k, leaf({2, 2, 8, 4}, 1).detach()); }, {"attention"}));
    CHECK(throws_with([&] { attention(q, k, v.to(kF32)); }, {"attention", "float32"}));
    CHECK(throws_with([&] { attention(q.to(kI32), k.to(kI32), v.to(kI32)); },
                      {"attention", "int32"}));
    CHECK(throws_with([&] { attention(q, k.narrow(2, 0, 5), v.narrow(2, 0, 5), {.causal = true}); },
                      {"attention", "Tq <= Tk"}));
    CHECK(throws_with([&] { attention(q, k, v, {.softcap = -1}); }, {"attention", "softcap"}));
    CHECK(throws_with([&] { attention(q, k, v, {.scale = INFINITY}); }, {"attention", "scale"}));
    CHECK(throws_with([&] { attention(q, k, v, {.scale_tensor = ones({2}, kF64)}); },
                      {"attention", "(1) or (H) = (3)", "[2]"}));
    CHECK(throws_with([&] { attention(q, k, v, {.scale_tensor = ones({3}, kF32)}); },
                      {"attention", "scale tensor"}));
    CHECK(throws_with([&] { attention(q, k, v, {.dropout = 0.1}); }, {"attention", "dropout"}));
    Tensor k2 = leaf({2, 2, 8, 4}, 74).detach();  // 2 key/value heads cannot serve 3 query heads
    CHECK(throws_with([&] { attention(q, k2, k2); },
                      {"attention", "Hkv dividing H", "[2, 2, 8, 4]"}));
    CHECK(throws_with([&] { attention(q, k, v, {.window = 4}); }, {"attention", "window 4"}));
    CHECK(throws_with([&] { attention_unfused(q, k, v, {.causal = true, .window = -1}); },
                      {"attention_unfused", "window -1"}));
    CHECK(throws_with([&] { attention_unfused(q, k, v, {.dropout = 1.5}); },
                      {"attention_unfused", "dropout"}));
}
