// --precision fp8 (ops/fp8.h): the fast rounding against the exact one on every tie, delayed
// scaling's state machine and its hostile saved states, the cast and linear on FP8 operands
// against float64 products of the rounded values, FP8 attention logits (fused against unfused,
// saturation counted), the cuda twins against the cpu, and training runs: tracking the float32
// twin, the counts in metrics.jsonl, a resumed run equal to an unbroken one.
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cuda_parity.h"
#include "nn/model/checkpoint_files.h"
#include "nn/model/gpt.h"
#include "nn/optim/loss_scale.h"
#include "nn/signals/fp8_telemetry.h"
#include "nn/train/checkpoint.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using json = nlohmann::json;
using test::throws_with;

namespace {

Tensor randn_seeded(const Shape& shape, uint64_t seed, double scale = 1.0) {
    Generator gen(seed);
    return randn(shape, kF32, gen) * scale;
}

// t rounded to multiples of 1/8 (float32): dot products of such values are exact in any order.
Tensor on_eighths(const Tensor& t) {
    std::vector<double> v = t.contiguous().to_vector<double>();
    for (double& x : v) x = std::round(x * 8) / 8;
    return from_vector(v, t.shape(), kF32);
}

bool same_value(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// q = round(x · s) elementwise by the exact rounding, and how many |q| reached the largest value.
std::pair<std::vector<float>, int64_t> reference_cast(const Tensor& x, float scale,
                                                      MiniFormat format, Overflow overflow) {
    std::vector<float> q;
    int64_t saturated = 0;
    for (float v : x.contiguous().to_vector<float>()) {
        q.push_back(round_to_format(v * scale, format, overflow));
        saturated += std::abs(q.back()) >= static_cast<float>(max_finite(format));
    }
    return {q, saturated};
}

}  // namespace

TEST_CASE("FastRounder equals round_to_format on every tie, its neighbours and the edges") {
    for (MiniFormat format : {MiniFormat::float16, MiniFormat::e4m3, MiniFormat::e5m2})
        for (Overflow overflow : {Overflow::saturate, Overflow::to_inf}) {
            const FastRounder fast(format, overflow);
            int64_t checked = 0, mismatches = 0;
            auto check = [&](float x) {
                ++checked;
                for (float v : {x, -x})
                    if (!same_value(fast(v), round_to_format(v, format, overflow))) {
                        if (mismatches++ < 5)
                            MESSAGE(fmt::format("x = {:a}: fast {:a}, exact {:a}", v, fast(v),
                                                round_to_format(v, format, overflow)));
                    }
            };
            const uint32_t top = minifloat::layout(format).max_finite;
            for (uint32_t code = 0; code <= top; ++code) {
                const double value = minifloat::decode(code, format);
                const double next = code < top ? minifloat::decode(code + 1, format)
                                               : 2 * value - minifloat::decode(code - 1, format);
                const float tie = static_cast<float>((value + next) / 2);  // exact in float
                for (float x : {static_cast<float>(value), tie})
                    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 1e30f)}) check(y);
            }
            for (float x :
                 {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  1e30f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
                check(x);
            Generator gen(11);  // and random floats over the whole exponent range
            for (int i = 0; i < 200000; ++i)
                check(static_cast<float>(
                    std::ldexp(1.0 + gen.uniform(), int(gen.uniform() * 80) - 40)));
            CAPTURE(static_cast<int>(format));
            CHECK(checked > 2 * static_cast<int64_t>(top));
            CHECK(mismatches == 0);
        }
}

TEST_CASE("delayed scaling: the scale comes from the history's max, a window of history_len") {
    DelayedScaling s(MiniFormat::e4m3, 3);
    CHECK(s.scale() == 1.0f);  // nothing recorded yet
    s.record(0.0);             // an all-zero history keeps the scale
    CHECK(s.scale() == 1.0f);
    s.record(2.0);
    CHECK(s.scale() == 224.0f);  // 448 / 2
    s.record(0.5);
    s.record(0.25);
    CHECK(s.scale() == 224.0f);  // the max of (0, 2, 0.5)... then (2, 0.5, 0.25)
    s.record(0.5);               // 2 leaves the window of 3: max 0.5
    CHECK(s.scale() == 896.0f);
    s.record(NAN);  // not recorded: a NaN would pin the scale for history_len casts
    s.record(INFINITY);
    CHECK(s.history() == std::vector<float>{0.5f, 0.25f, 0.5f});
    DelayedScaling g(MiniFormat::e5m2);
    g.record(3.5);
    CHECK(g.scale() == static_cast<float>(57344.0 / 3.5));

    DelayedScaling copy(MiniFormat::e4m3, 3);
    copy.load_state_json(s.state_json(), "test");
    CHECK(copy.scale() == s.scale());
    CHECK(copy.history() == s.history());
    CHECK(throws_with([] { DelayedScaling(MiniFormat::float16); }, {"e4m3 or e5m2", "float16"}));
    CHECK(throws_with([] { DelayedScaling(MiniFormat::e4m3, 0); }, {"history_len", ">= 1"}));
    for (const char* hostile :
         {"[]", "{\"format\":\"e4m3\"}", "{\"format\":\"e5m2\",\"scale\":1,\"amax_history\":[]}",
          "{\"format\":\"e4m3\",\"scale\":0,\"amax_history\":[]}",
          "{\"format\":\"e4m3\",\"scale\":1,\"amax_history\":[-1]}",
          "{\"format\":\"e4m3\",\"scale\":1,\"amax_history\":[\"x\"]}", "not json"}) {
        CAPTURE(hostile);
        DelayedScaling t(MiniFormat::e4m3);
        CHECK(throws_with([&] { t.load_state_json(hostile, "ckpt.state"); },
                          {"ckpt.state", "FP8 scaling state"}));
    }
}

TEST_CASE("delayed scaling: the step's amaxes taken out and recorded again as the ranks' max") {
    DelayedScaling s(MiniFormat::e4m3, 4);
    s.record(1.0);
    s.forget_recent();  // an earlier step's, already synced
    s.record(2.0);
    s.record(NAN);  // not recorded, so not recent either
    s.record(0.5);
    CHECK(s.take_recent() == std::vector<float>{2.0f, 0.5f});
    CHECK(s.history() == std::vector<float>{1.0f});
    CHECK(s.take_recent().empty());
    // Another rank saw more: its maxima go back in, oldest first, and set the scale.
    s.record(8.0);
    s.record(0.5);
    s.forget_recent();
    CHECK(s.history() == std::vector<float>{1.0f, 8.0f, 0.5f});
    CHECK(s.scale() == doctest::Approx(448.0 / 8.0));
    CHECK(s.take_recent().empty());
    // More recent amaxes than the window holds: only those still in it come out.
    for (double amax : {1.0, 2.0, 3.0, 4.0, 5.0}) s.record(amax);
    CHECK(s.take_recent() == std::vector<float>{2.0f, 3.0f, 4.0f, 5.0f});
    CHECK(s.history().empty());
}

TEST_CASE("fp8_cast rounds x times the scale, counts saturation, records amax only in training") {
    Tensor x = randn_seeded({37, 29}, 3, 2.0);
    x.data<float>()[5] = 900.0f;  // beyond 448 at scale 1
    DelayedScaling s(MiniFormat::e4m3);
    const Fp8Cast first = fp8_cast(x, s, /*record=*/false);
    CHECK(first.scale == 1.0f);
    CHECK(s.history().empty());
    CHECK(s.saturated() == 0);  // evaluation adds nothing
    const Fp8Cast cast = fp8_cast(x, s, /*record=*/true);
    const auto [q_ref, saturated] = reference_cast(x, 1.0f, MiniFormat::e4m3, Overflow::saturate);
    CHECK(cast.q.to_vector<float>() == q_ref);
    CHECK(saturated >= 1);
    CHECK(s.saturated() == saturated);
    CHECK(s.history() == std::vector<float>{900.0f});
    CHECK(s.take_saturated() == saturated);
    CHECK(s.saturated() == 0);
    // The next cast maps 900 to 448: nothing saturates (a value at exactly amax lands on 448).
    const Fp8Cast scaled = fp8_cast(x, s, true);
    CHECK(scaled.scale == static_cast<float>(448.0 / 900.0));
    CHECK(scaled.q.to_vector<float>() ==
          reference_cast(x, scaled.scale, MiniFormat::e4m3, Overflow::saturate).first);
    CHECK(s.saturated() == 1);

    // E5M2 with IEEE overflow: a gradient past its history becomes Inf.
    DelayedScaling g(MiniFormat::e5m2, 16, Overflow::to_inf);
    g.record(1.0);
    Tensor dy = full({4}, 1.2, kF32);
    const Fp8Cast inf = fp8_cast(dy, g, true);
    CHECK(std::isinf(inf.q.to_vector<float>()[0]));
    CHECK(g.saturated() == 4);
    DelayedScaling sat(MiniFormat::e5m2);
    sat.record(1.0);
    CHECK(fp8_cast(dy, sat, true).q.to_vector<float>()[0] == 57344.0f);
}

TEST_CASE("linear_fp8: forward and gradients are the float64 products of the FP8 values") {
    Tensor x = randn_seeded({3, 29, 70}, 6).requires_grad_();
    Tensor w = randn_seeded({53, 70}, 7, 0.05).requires_grad_();
    Tensor b = randn_seeded({53}, 8).requires_grad_();
    Tensor dy = randn_seeded({3, 29, 53}, 9, 1e-3);
    auto scaling = std::make_shared<Fp8LinearScaling>();
    scaling->x.record(3.0), scaling->weight.record(0.2), scaling->grad.record(4e-3);  // a past
    const float sx = scaling->x.scale(), sw = scaling->weight.scale(), sdy = scaling->grad.scale();
    auto q64 = [](const Tensor& t, float s, MiniFormat f) {
        const auto q = reference_cast(t.detach(), s, f, Overflow::saturate).first;
        std::vector<double> v(q.begin(), q.end());
        return from_vector(v, t.shape(), kF64);
    };
    const Tensor qx = q64(x, sx, MiniFormat::e4m3).reshape({87, 70});
    const Tensor qw = q64(w, sw, MiniFormat::e4m3);
    const Tensor qdy = q64(dy, sdy, MiniFormat::e5m2).reshape({87, 53});
    const double inv_xw = 1.0 / (double(sx) * sw), inv_dyw = 1.0 / (double(sdy) * sw),
                 inv_dyx = 1.0 / (double(sdy) * sx);
    const Tensor y_ref = matmul(qx, qw.t()) * inv_xw + b.detach().to(kF64);
    Tensor y = linear_fp8(x, w, b, scaling);
    y.backward(dy);
    CHECK(test::relative_error(y.reshape({87, 53}).to(kF64), y_ref) < 1e-6);
    CHECK(test::relative_error(x.grad().reshape({87, 70}).to(kF64), matmul(qdy, qw) * inv_dyw) <
          1e-6);
    CHECK(test::relative_error(w.grad().to(kF64), matmul(qdy.t(), qx) * inv_dyx) < 1e-6);
    CHECK(test::max_abs_diff(b.grad().to(kF64), sum(dy.to(kF64), {0, 1})) < 1e-6);
    // One training forward and backward recorded one amax per tensor, measured before rounding.
    CHECK(scaling->x.history().size() == 2);
    CHECK(scaling->x.history().back() == max(abs(x.detach())).item());
    CHECK(scaling->grad.history().size() == 2);
    CHECK(scaling->grad.history().back() == max(abs(dy)).item());
    {
        NoGradGuard no_grad;  // evaluation: the same values, nothing recorded
        const Tensor again = linear_fp8(x.detach(), w.detach(), b.detach(), scaling);
        CHECK(scaling->x.history().size() == 2);
    }
    CHECK(throws_with([&] { linear(x, w, b, Precision::fp8); }, {"linear", "linear_fp8"}));
    CHECK(throws_with([&] { linear_fp8(x, w.t(), b, scaling); }, {"linear_fp8", "(N, K)"}));
    CHECK(throws_with([&] { linear_fp8(x, w, b, nullptr); }, {"linear_fp8", "scaling state"}));
}

TEST_CASE("FP8 attention logits: fused equals unfused, saturation counted per row") {
    // q and k in multiples of 1/8: every dot is exact whatever the summation order, so the two
    // paths round the same z to the same E4M3 value. Logits spread ~256: many saturate at 448.
    const Tensor q0 = on_eighths(randn_seeded({2, 2, 37, 16}, 1, 8.0));
    const Tensor k0 = on_eighths(randn_seeded({2, 2, 37, 16}, 2, 8.0));
    const Tensor v0 = randn_seeded({2, 2, 37, 16}, 3);
    const Tensor probe = randn_seeded({2, 2, 37, 16}, 4);
    for (double cap : {0.0, 600.0}) {
        CAPTURE(cap);
        const AttentionOptions o{.causal = true, .scale = 1.0, .softcap = cap, .fp8_logits = true};
        std::vector<Tensor> outs, grads;
        std::vector<std::vector<double>> saturated;
        for (bool fused : {true, false}) {
            Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                   v = v0.clone().requires_grad_();
            AttentionSignals signals;
            Tensor out =
                fused ? attention(q, k, v, o, &signals) : attention_unfused(q, k, v, o, &signals);
            sum(out * probe).backward();
            outs.push_back(out.detach());
            grads.insert(grads.end(), {q.grad(), k.grad(), v.grad()});
            saturated.push_back(signals.saturated.to_vector<double>());
        }
        CHECK(test::max_abs_diff(outs[0], outs[1]) < 1e-5);
        for (int i = 0; i < 3; ++i) CHECK(test::relative_error(grads[i], grads[3 + i]) < 1e-4);
        CHECK(saturated[0] == saturated[1]);
        // Counted against the rounded logits, row by row, under the causal mask.
        const auto s = matmul(q0, k0.transpose(-2, -1)).to_vector<float>();
        double total = 0, expected = 0;
        for (size_t r = 0; r < saturated[0].size(); ++r) {
            const size_t i = r % 37;
            for (size_t j = 0; j <= i; ++j) {
                float z = s[r * 37 + j];
                if (cap > 0) z = static_cast<float>(cap * std::tanh(z / cap));
                expected +=
                    std::abs(round_to_format(z, MiniFormat::e4m3, Overflow::saturate)) >= 448.0f;
            }
            total += saturated[0][r];
        }
        CHECK(total == expected);
        CHECK(total > 10);
        // Without FP8 the same attention differs: the rounding is not a no-op.
        const Tensor plain = attention(q0, k0, v0, {.causal = true, .scale = 1.0, .softcap = cap});
        CHECK(test::max_abs_diff(plain, outs[0]) > 1e-3);
    }
    CHECK(
        throws_with([&] { attention(q0.to(kF64), k0.to(kF64), v0.to(kF64), {.fp8_logits = true}); },
                    {"attention", "fp8_logits", "float32"}));
}

TEST_CASE("fp8 on cuda: the cast bit-identical to the cpu's, linear_fp8 and FP8 logits alike") {
    if (!test::cuda_runnable()) return;
    Tensor x = randn_seeded({129, 67}, 5, 40.0);
    x.data<float>()[7] = NAN;
    for (Overflow overflow : {Overflow::saturate, Overflow::to_inf}) {
        DelayedScaling on_cpu(MiniFormat::e5m2, 8, overflow),
            on_cuda(MiniFormat::e5m2, 8, overflow);
        on_cpu.record(30.0), on_cuda.record(30.0);
        const Fp8Cast a = fp8_cast(x, on_cpu, true);
        const Fp8Cast b = fp8_cast(x.to(Device::cuda), on_cuda, true);
        const auto qa = a.q.to_vector<float>(), qb = b.q.to(Device::cpu).to_vector<float>();
        bool same = qa.size() == qb.size();
        for (size_t i = 0; same && i < qa.size(); ++i) same = same_value(qa[i], qb[i]);
        CHECK(same);
        CHECK(on_cpu.saturated() == on_cuda.saturated());
        CHECK(on_cpu.saturated() > 0);
        CHECK(on_cpu.history() == on_cuda.history());  // the NaN: not recorded on either
    }
    test::check_cuda_parity(
        "linear_fp8",
        [](const test::Inputs& in) {
            auto scaling = std::make_shared<Fp8LinearScaling>();  // the same fresh state each run
            scaling->x.record(2.0), scaling->weight.record(0.5), scaling->grad.record(1.0);
            return linear_fp8(in[0], in[1], in[2], scaling);
        },
        {randn_seeded({2, 19, 33}, 1), randn_seeded({21, 33}, 2, 0.2), randn_seeded({21}, 3)});
    test::check_cuda_parity(
        "attention with FP8 logits",
        [](const test::Inputs& in) {
            return attention(in[0], in[1], in[2],
                             {.causal = true, .scale = 1.0, .fp8_logits = true});
        },
        {on_eighths(randn_seeded({2, 2, 37, 16}, 1, 3.0)),
         on_eighths(randn_seeded({2, 2, 37, 16}, 2, 3.0)), randn_seeded({2, 2, 37, 16}, 3)});
}

TEST_CASE("an fp8 run tracks its float32 twin; metrics.jsonl counts what saturated, per layer") {
    test::TempDir dir("fp8_run");
    std::vector<std::vector<json>> runs;
    for (const char* name : {"fp32", "fp8", "fp8_attention"}) {
        TrainConfig cfg = test::tiny_run(dir, name);
        cfg.model.precision = std::string(name) == "fp32" ? Precision::full : Precision::fp8;
        cfg.model.fp8_attention = std::string(name) == "fp8_attention";
        cfg.steps = 40, cfg.checkpoint_every = 40, cfg.sample_tokens = 0;
        REQUIRE(!train(cfg).diverged);
        runs.push_back(test::step_metrics(cfg.run_dir));
    }
    for (const auto& run : runs) REQUIRE(run.size() == 40);
    auto worst = [&](size_t twin) { return test::max_loss_gap(runs[0], runs[twin]); };
    MESSAGE(fmt::format("max |loss - loss fp32| over 40 steps: fp8 {:.2g}, fp8 + attention {:.2g}",
                        worst(1), worst(2)));
    CHECK(worst(1) > 0);
    CHECK(worst(1) < 0.1);
    CHECK(worst(2) < 0.1);
    CHECK(!runs[0][0].contains("fp8_saturated"));
    const json& layer = runs[1][10]["fp8_saturated"][0];
    CHECK(layer.contains("x"));
    CHECK(layer.contains("weight"));
    CHECK(layer.contains("grad"));
    CHECK(!layer.contains("logits"));
    const json& with_attention = runs[2][10]["fp8_saturated"][0];
    CHECK(with_attention["logits"].size() == 2);  // one count per head
    CHECK(with_attention.contains("q"));
    CHECK(runs[1][39]["skipped_steps"] == 0);
    CHECK(runs[1][39]["loss_scale"] == 1.0);
    // The model file itself loads in bf16: its FP8 scales are training state.
    const LoadedModel loaded = load_model(latest_model_checkpoint(dir / "fp8_attention"));
    CHECK(loaded.model->config().precision == Precision::bf16);
    CHECK(!loaded.model->config().fp8_attention);
}

TEST_CASE("fp8: a resumed run equals an unbroken one (the scales are in the checkpoint)") {
    test::TempDir dir("fp8_resume");
    TrainConfig a = test::tiny_run(dir, "a");
    a.model.precision = Precision::fp8;
    a.model.fp8_attention = true;
    a.steps = 12, a.checkpoint_every = 4, a.sample_tokens = 0;
    REQUIRE(!train(a).diverged);
    const std::vector<json> ma = test::step_metrics(a.run_dir);
    const std::vector<json> mb = test::killed_and_resumed(a, dir / "b", 6);
    REQUIRE(mb.size() == 12);
    for (size_t i = 0; i < 12; ++i) {
        CAPTURE(i);
        CHECK(mb[i]["loss"].get<double>() == ma[i]["loss"].get<double>());
        CHECK(mb[i]["fp8_saturated"] == ma[i]["fp8_saturated"]);
    }
    // A state naming a tensor the model does not have, or missing one, is refused by name.
    GPTConfig c = a.model;
    c.vocab_size = 20;
    GPT model(c, 1);
    json state = json::parse(fp8_state_json(model));
    state["transformer.h.7.attn.q"] = state["transformer.h.0.attn.q"];
    CHECK(throws_with([&] { load_fp8_state(model, state.dump(), "run"); },
                      {"run", "transformer.h.7.attn.q"}));
    state = json::parse(fp8_state_json(model));
    state.erase("transformer.h.0.mlp.c_fc.grad");
    CHECK(throws_with([&] { load_fp8_state(model, state.dump(), "run"); },
                      {"run", "no entry", "transformer.h.0.mlp.c_fc.grad"}));
    GPTConfig bad = c;
    bad.precision = Precision::bf16;
    CHECK(throws_with([&] { bad.validate(); }, {"fp8_attention", "precision fp8", "bf16"}));
}

TEST_CASE("the skip-only loss scaler of fp8: skips an overflowing step, keeps its scale") {
    LossScaler s(LossScaleOptions{.init = 1.0, .adjust = false});
    CHECK(s.update(false));
    CHECK(!s.update(true));
    CHECK(s.scale() == 1.0);
    CHECK(s.skipped_steps() == 1);
}
