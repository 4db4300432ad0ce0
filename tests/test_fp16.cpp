// --precision fp16: linear on float16 operands (forward and gradients against float64 products of
// the rounded values; overflow to Inf; small gradients flushed to zero unless the loss is scaled),
// the loss scaler's state machine, a training run tracking its float32 twin, overflowing steps
// skipped and logged, and a resumed fp16 run equal to an unbroken one (the scaler's state in the
// checkpoint).
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/model/gpt.h"
#include "nn/optim/loss_scale.h"
#include "nn/signals/metrics_file.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using json = nlohmann::json;

namespace {

Tensor randn_seeded(const Shape& shape, uint64_t seed) {
    Generator gen(seed);
    return randn(shape, kF32, gen);
}

}  // namespace

TEST_CASE("linear in fp16: forward and gradients are the float64 products of the rounded values") {
    Tensor x = randn_seeded({3, 29, 70}, 6).requires_grad_();
    Tensor w = randn_seeded({53, 70}, 7).requires_grad_();
    Tensor b = randn_seeded({53}, 8).requires_grad_();
    Tensor dy = randn_seeded({3, 29, 53}, 9);
    auto rounded = [](const Tensor& t) { return t.detach().to(kF16).to(kF64); };
    const Tensor x64 = rounded(x).reshape({87, 70}), w64 = rounded(w), dy64 = rounded(dy);
    const Tensor y_ref = matmul(x64, w64.t()) + b.detach().to(kF64);
    const Tensor dx_ref = matmul(dy64.reshape({87, 53}), w64).reshape(x.shape());
    const Tensor dw_ref = matmul(dy64.reshape({87, 53}).t(), x64);
    Tensor y = linear(x, w, b, Precision::fp16);
    CHECK(y.dtype() == kF32);
    y.backward(dy);
    // float32 sums of ~70-90 exact products of |value| ~ 1.
    CHECK(test::max_abs_diff(y.reshape({87, 53}).to(kF64), y_ref) < 1e-4);
    CHECK(test::max_abs_diff(x.grad().to(kF64), dx_ref) < 1e-4);
    CHECK(test::max_abs_diff(w.grad().to(kF64), dw_ref) < 2e-4);
    CHECK(test::max_abs_diff(b.grad().to(kF64), sum(dy.to(kF64), {0, 1})) < 1e-5);
    // float16 keeps 11 bits where bfloat16 keeps 8: closer to the float32 op than bf16 is.
    const Tensor y32 = linear(x.detach(), w.detach(), b.detach());
    const double fp16_error =
        test::max_abs_diff(y32, linear(x.detach(), w.detach(), b.detach(), Precision::fp16));
    const double bf16_error =
        test::max_abs_diff(y32, linear(x.detach(), w.detach(), b.detach(), Precision::bf16));
    CHECK(fp16_error > 0);
    CHECK(fp16_error * 4 < bf16_error);
}

TEST_CASE("fp16 overflows where bf16 does not; an unscaled small gradient underflows to zero") {
    Tensor x = full({1, 4}, 70000.0);  // above 65,504
    const Tensor w = ones({2, 4});
    CHECK(std::isinf(linear(x, w, {}, Precision::fp16).at({0, 0})));
    CHECK(std::isfinite(linear(x, w, {}, Precision::bf16).at({0, 0})));
    // dY = 1e-8 is below float16's smallest subnormal (6e-8): rounded to 0, the gradient of w is
    // lost; scaled by 2^16 (what the loss scaler does) it survives, and is exact after unscaling.
    Tensor wg = ones({2, 4}).requires_grad_();
    linear(ones({1, 4}), wg, {}, Precision::fp16).backward(full({1, 2}, 1e-8));
    CHECK(wg.grad().at({0, 0}) == 0.0);
    wg.zero_grad();
    linear(ones({1, 4}), wg, {}, Precision::fp16).backward(full({1, 2}, 1e-8 * 65536));
    CHECK(wg.grad().at({0, 0}) / 65536 == doctest::Approx(1e-8).epsilon(1e-3));
    CHECK(test::throws_with([&] { (void)linear(x.to(kF64), w.to(kF64), {}, Precision::fp16); },
                            {"linear", "fp16", "float32", "float64"}));
}

TEST_CASE("the loss scaler: grows after N clean steps, halves and skips on overflow") {
    LossScaler s({.init = 1024, .growth_interval = 3});
    CHECK(s.scale() == 1024);
    CHECK(s.update(false));
    CHECK(s.update(false));
    CHECK(s.scale() == 1024);
    CHECK(s.update(false));  // the third clean step in a row: doubled
    CHECK(s.scale() == 2048);
    CHECK(s.clean_steps() == 0);
    CHECK(s.update(false));
    CHECK(!s.update(true));  // overflow: skipped, halved, the clean count restarts
    CHECK(s.scale() == 1024);
    CHECK(s.skipped_steps() == 1);
    CHECK(s.clean_steps() == 0);
    CHECK(!s.update(true));
    CHECK(s.scale() == 512);
    CHECK(s.skipped_steps() == 2);
    // The state round-trips through a checkpoint's JSON.
    LossScaler t({.init = 1, .growth_interval = 3});
    t.load_state_json(s.state_json(), "test");
    CHECK(t.scale() == 512);
    CHECK(t.skipped_steps() == 2);
    // Never to 0 or Inf.
    LossScaler tiny({.init = 1e-38});
    for (int i = 0; i < 10; ++i) tiny.update(true);
    CHECK(tiny.scale() > 0);
    LossScaler huge({.init = 3e38, .growth_interval = 1});
    huge.update(false);
    CHECK(std::isfinite(huge.scale()));
    // Hostile settings and saved states.
    for (double bad : {0.0, -1.0, double(INFINITY), double(NAN)})
        CHECK(test::throws_with([&] { LossScaler{{.init = bad}}; }, {"loss scale", "> 0"}));
    CHECK(test::throws_with([] { LossScaler{{.growth_interval = 0}}; }, {"growth interval"}));
    for (const char* bad : {"", "[]", R"({"scale": 0, "clean_steps": 0, "skipped_steps": 0})",
                            R"({"scale": "big", "clean_steps": 0, "skipped_steps": 0})",
                            R"({"scale": 2, "clean_steps": -1, "skipped_steps": 0})"})
        CHECK(test::throws_with([&] { t.load_state_json(bad, "ckpt.safetensors"); },
                                {"ckpt.safetensors", "loss scale"}));
}

TEST_CASE("fp16 gradients of a model are closer to float32's than bf16's, every parameter") {
    std::map<Precision, std::vector<Tensor>> grads;
    for (Precision p : {Precision::full, Precision::bf16, Precision::fp16}) {
        GPTConfig c;
        c.vocab_size = 11, c.block_size = 16, c.n_layer = 1, c.n_head = 2, c.n_embd = 16;
        c.qk_norm = QKNorm::layernorm, c.precision = p;
        Generator gen(5);
        std::vector<int32_t> x, y;
        for (int i = 0; i < 2 * 4 * 16; ++i)
            (i < 64 ? x : y).push_back(static_cast<int32_t>(gen.uniform() * 11));
        GPT model(c, 3);
        model.forward(from_ids(x, {4, 16}), from_ids(y, {4, 16})).loss.backward();
        for (const auto& [name, t] : model.named_parameters()) grads[p].push_back(t.grad());
    }
    int checked = 0;
    for (size_t i = 0; i < grads[Precision::full].size(); ++i) {
        const Tensor& g32 = grads[Precision::full][i];
        if (test::max_abs_diff(g32, zeros(g32.shape())) < 1e-4) continue;  // k_norm.bias: ~1e-10
        const double fp16 = test::max_abs_diff(g32, grads[Precision::fp16][i]);
        const double bf16 = test::max_abs_diff(g32, grads[Precision::bf16][i]);
        CAPTURE(i);
        CHECK(fp16 > 0);
        CHECK(fp16 < bf16 / 3);  // 3 more mantissa bits: ~8x, measured 5-16x
        ++checked;
    }
    CHECK(checked >= 15);
}

TEST_CASE("an fp16 training run tracks its float32 twin, with the loss scale in metrics.jsonl") {
    test::TempDir dir("fp16_run");
    std::vector<std::vector<json>> runs;
    for (const char* precision : {"fp32", "fp16", "bf16"}) {
        TrainConfig cfg = test::tiny_run(dir, precision);
        cfg.model.precision = parse_precision(precision);
        cfg.steps = 40, cfg.checkpoint_every = 40, cfg.sample_tokens = 0;
        cfg.loss_scale_interval = 15;
        REQUIRE(!train(cfg).diverged);
        runs.push_back(test::step_metrics(cfg.run_dir));
    }
    for (const auto& run : runs) REQUIRE(run.size() == 40);
    // The trajectories drift apart chaotically (Adam turns the rounding noise of near-zero
    // gradients into full-size steps of either sign), so which twin stays closer is chance; the
    // bound is the one bf16's twin test sets. The precision itself is compared below, at a point.
    auto worst = [&](size_t twin) { return test::max_loss_gap(runs[0], runs[twin]); };
    MESSAGE(fmt::format("max |loss - loss fp32| over 40 steps: fp16 {:.2g}, bf16 {:.2g}", worst(1),
                        worst(2)));
    CHECK(worst(1) > 0);
    CHECK(worst(1) < 0.02);
    CHECK(!runs[0][0].contains("loss_scale"));
    CHECK(runs[1][0]["loss_scale"] == 65536.0);
    CHECK(runs[1][15]["loss_scale"] == 131072.0);  // doubled after 15 clean steps
    CHECK(runs[1][39]["skipped_steps"] == 0);
}

TEST_CASE("fp16: overflowing steps are skipped and logged; a resumed run equals an unbroken one") {
    test::TempDir dir("fp16_skip");
    TrainConfig a = test::tiny_run(dir, "a");
    a.model.precision = Precision::fp16;
    a.steps = 12, a.checkpoint_every = 4, a.sample_tokens = 0;
    a.loss_scale = 0x1p40;  // the gradients overflow float16 until the scale comes down
    a.loss_scale_interval = 3;
    REQUIRE(!train(a).diverged);
    const std::vector<json> ma = test::step_metrics(a.run_dir);
    REQUIRE(ma.size() == 12);
    int skipped = 0;
    for (const json& line : ma) skipped += line.value("skipped", false);
    CHECK(skipped > 0);
    CHECK(ma[0]["skipped"] == true);
    CHECK(ma[1]["loss_scale"] == 0x1p39);
    CHECK(ma.back()["skipped_steps"] == skipped);
    CHECK(std::isfinite(ma.back()["loss"].get<double>()));

    const std::vector<json> mb = test::killed_and_resumed(a, dir / "b", 6);
    REQUIRE(mb.size() == 12);
    for (size_t i = 0; i < 12; ++i) {
        CAPTURE(i);
        CHECK(mb[i]["loss"].get<double>() == ma[i]["loss"].get<double>());
        CHECK(mb[i]["loss_scale"] == ma[i]["loss_scale"]);
        CHECK(mb[i].value("skipped", false) == ma[i].value("skipped", false));
    }
}
