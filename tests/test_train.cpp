// Training: the loop end to end on a tiny model and a small text (what a run directory holds:
// config.json, metrics.jsonl, plot.svg, the last K checkpoints; resume equivalence with and
// without dropout; divergence; refusing to overwrite a run), sampling, and its parts: AdamW and
// SGD against hand computations, the schedule, clipping, the tokenizers and the dataset.
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/safetensors.h"
#include "helpers.h"
#include "nn/model/sample.h"
#include "nn/optim/lr_schedule.h"
#include "nn/optim/optim.h"
#include "nn/train/checkpoint.h"
#include "nn/train/eval_protocol.h"
#include "nn/train/trainer.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using qk::test::throws_with;
namespace fs = std::filesystem;
using qk::test::read_file;
using qk::test::TempDir;
using qk::test::write_corpus;
using json = nlohmann::json;
using qk::test::tiny_run;

namespace {

// The per-step lines of metrics.jsonl; the first line, step 0, holds the loss at initialisation.
std::vector<json> read_metrics(const std::string& run_dir, json* step0 = nullptr) {
    std::vector<json> lines;
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) lines.push_back(json::parse(line));  // throws if malformed
    REQUIRE(!lines.empty());
    CHECK(lines.front() == json{{"step", 0}, {"val_loss", lines.front().at("val_loss")}});
    if (step0) *step0 = lines.front();
    lines.erase(lines.begin());
    return lines;
}

std::vector<std::string> files_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

bool finite_checkpoint(const std::string& path) {
    for (const auto& [name, t] : load_safetensors(path).tensors)
        for (double v : t.to_vector<double>())
            if (!std::isfinite(v)) return false;
    return true;
}

}  // namespace

TEST_CASE("a run writes config.json, metrics.jsonl, plot.svg and the last K checkpoints") {
    TempDir dir("train_files");
    TrainConfig cfg = tiny_run(dir, "run");
    TrainResult r = train(cfg);
    CHECK(!r.diverged);
    CHECK(r.steps_done == 20);
    CHECK(std::isfinite(r.final_loss));
    CHECK(std::isfinite(r.final_val_loss));
    CHECK(r.sample.size() == 21);  // the newline prompt and 20 generated characters

    // config.json reads back to the same configuration.
    TrainConfig back = load_run_config(cfg.run_dir);
    CHECK(back.to_json() ==
          TrainConfig::from_json(read_file(cfg.run_dir + "/config.json")).to_json());
    CHECK(back.model.qk_norm == QKNorm::layernorm);
    CHECK(back.model.vocab_size == Tokenizer::char_level(read_file(cfg.data_path)).vocab_size());
    CHECK(back.steps == 20);

    json step0;
    const std::vector<json> metrics = read_metrics(cfg.run_dir, &step0);
    // At initialisation the model predicts nearly uniformly: a loss near ln V.
    const double log_vocab = std::log(static_cast<double>(back.model.vocab_size));
    CHECK(std::abs(step0["val_loss"].get<double>() - log_vocab) < 0.1);
    REQUIRE(metrics.size() == 20);
    for (size_t i = 0; i < metrics.size(); ++i) {
        const json& m = metrics[i];
        const int64_t step = static_cast<int64_t>(i) + 1;
        CAPTURE(step);
        CHECK(m.at("step") == step);
        for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s"}) {
            CHECK(m.at(key).is_number());
            CHECK(std::isfinite(m.at(key).get<double>()));
        }
        CHECK(m["lr"].get<double>() == doctest::Approx(cosine_lr(step - 1, 4, 20, 1e-2, 1e-3)));
        CHECK(m.contains("val_loss") == (step % 5 == 0));
        const bool stats = (step - 1) % 2 == 0 || step == 20;
        REQUIRE(m.contains("layers") == stats);
        if (stats) {
            REQUIRE(m["layers"].size() == 1);
            const json& l = m["layers"][0];
            for (const char* key : {"max_logit", "entropy", "q_norm", "k_norm", "qk_scale"})
                CHECK(l.at(key).is_number());
            CHECK(l["entropy"].get<double>() > 0);
            CHECK(l["entropy"].get<double>() <= std::log(16.0));  // at most ln T
            CHECK(l["q_norm"].get<double>() > 0);
            CHECK(l["qk_scale"].get<double>() == 0);  // no g in the layernorm variant
        }
    }
    CHECK(metrics[19]["val_loss"].get<double>() == doctest::Approx(r.final_val_loss));
    CHECK(metrics[19]["loss"].get<double>() < metrics[0]["loss"].get<double>());

    const std::string svg = read_file(cfg.run_dir + "/plot.svg");
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("</svg>") == svg.size() - 7);
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);
    size_t polylines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos;
         at = svg.find("<polyline", at + 1))
        ++polylines;
    // train, val, lr, grad norm, and one layer in each of the four signal panels
    CHECK(polylines == 8);
    // Validation's five points (steps 0, 5, 10, 15, 20) are marked, and the legend's val entry.
    size_t circles = 0;
    for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
        ++circles;
    CHECK(circles == 5 + 1);
    CHECK(svg.find(">run: L=1 H=2 C=16 T=16, qk_norm=layernorm") != std::string::npos);
    CHECK(svg.find("20 steps, adamw lr 0.01 to 0.001") != std::string::npos);
    CHECK(svg.find("(log scale)") != std::string::npos);

    const json result = json::parse(read_file(cfg.run_dir + "/result.json"));
    CHECK(result["steps_done"] == 20);
    CHECK(result["diverged"] == false);
    CHECK(result["final_val_loss"].get<double>() == r.final_val_loss);
    CHECK(result["seconds"].get<double>() > 0);
    CHECK(files_in(cfg.run_dir) ==
          std::vector<std::string>{"config.json", "metrics.jsonl", "plot.svg", "result.json",
                                   "step-000015.model.safetensors", "step-000015.state.safetensors",
                                   "step-000020.model.safetensors",
                                   "step-000020.state.safetensors"});
    CHECK(latest_model_checkpoint(cfg.run_dir) == cfg.run_dir + "/step-000020.model.safetensors");
    LoadedModel loaded = load_model(latest_model_checkpoint(cfg.run_dir));
    CHECK(loaded.metadata.at("step") == "20");
    CHECK(loaded.tokenizer.decode(loaded.tokenizer.encode("Speak, speak.")) == "Speak, speak.");
}

TEST_CASE("stats_every 0 measures the stability signals at least 50 times in any run") {
    for (int64_t steps : {1, 7, 50, 60, 99, 100, 120, 400, 1249, 1250, 3000, 9000}) {
        TrainConfig cfg;
        cfg.steps = steps;
        REQUIRE(cfg.stats_every == 0);  // the default is auto
        const int64_t every = cfg.stats_interval();
        CAPTURE(steps);
        CHECK(every >= 1);
        CHECK(every <= 25);
        int64_t points = 0;  // the steps the training loop measures
        for (int64_t step = 0; step < steps; ++step)
            points += step % every == 0 || step + 1 == steps;
        CHECK(points >= std::min<int64_t>(steps, 50));
    }
    TrainConfig cfg;
    cfg.steps = 9000;
    CHECK(cfg.stats_interval() == 25);  // the default run: 360 points
    cfg.steps = 200;
    CHECK(cfg.stats_interval() == 4);
    cfg.stats_every = 7;  // a given cadence is kept
    CHECK(cfg.stats_interval() == 7);
    cfg.stats_every = -1;
    CHECK_THROWS_AS(cfg.validate(), Error);
}

TEST_CASE("resuming gives bit-identical losses to a run that never stopped, dropout or not") {
    // The third case: Muon's momentum in the state, and QK-Clip acting at every step.
    for (const auto& [dropout, muon] : {std::pair{0.0, false}, {0.2, false}, {0.0, true}}) {
        CAPTURE(dropout);
        CAPTURE(muon);
        TempDir dir("train_resume");
        TrainConfig a = tiny_run(dir, "straight");
        a.steps = 12, a.checkpoint_every = 4, a.keep_checkpoints = 1;
        a.eval_every = 3, a.stats_every = 3;
        a.model.dropout = dropout;
        a.model.qk_norm = QKNorm::l2;  // a learnable g in the optimizer state too
        if (muon) a.model.qk_norm = QKNorm::none, a.optimizer = "muon", a.qk_clip = 0.03;
        a.sample_tokens = 0;
        train(a);

        TrainConfig b = a;
        b.run_dir = dir / "interrupted";
        // Killed at step 6: the last checkpoint is step 4, steps 5-6 are redone.
        TrainResult stopped = train(b, false, {.kill_after = 6});
        CHECK(stopped.steps_done == 6);
        CHECK(read_metrics(b.run_dir).size() == 6);
        CHECK(latest_model_checkpoint(b.run_dir) == b.run_dir + "/step-000004.model.safetensors");
        TrainConfig reloaded = load_run_config(b.run_dir);  // as the CLI does
        reloaded.progress = false;
        TrainResult resumed = train(reloaded, /*resume=*/true);
        CHECK(resumed.steps_done == 12);

        const std::vector<json> ma = read_metrics(a.run_dir), mb = read_metrics(b.run_dir);
        REQUIRE(mb.size() == 12);  // steps 5 and 6 of the first attempt were dropped
        int clips = 0;
        for (size_t i = 0; i < 12; ++i) {
            CAPTURE(i);
            CHECK(mb[i]["step"] == ma[i]["step"]);
            CHECK(mb[i]["loss"].get<double>() == ma[i]["loss"].get<double>());  // bit-identical
            CHECK(mb[i]["grad_norm"].get<double>() == ma[i]["grad_norm"].get<double>());
            CHECK(mb[i].value("val_loss", -1.0) == ma[i].value("val_loss", -1.0));
            if (ma[i].contains("layers")) CHECK(mb[i]["layers"] == ma[i]["layers"]);
            CHECK(mb[i].value("heads_clipped", -1) == ma[i].value("heads_clipped", -1));
            if (muon && i > 0) clips += ma[i]["heads_clipped"].get<int>();
        }
        if (muon) CHECK(clips > 0);
        // Resuming a finished run changes nothing.
        const TrainResult again = train(reloaded, true);
        CHECK(again.steps_done == 12);
        CHECK(again.final_loss == resumed.final_loss);  // read back from metrics.jsonl
        CHECK(again.final_val_loss == resumed.final_val_loss);
        CHECK(read_metrics(b.run_dir).size() == 12);
        // The final weights are the same bytes.
        CHECK(read_file(a.run_dir + "/step-000012.model.safetensors") ==
              read_file(b.run_dir + "/step-000012.model.safetensors"));
    }
}

TEST_CASE("dropout changes the losses (so the resume test above exercises its generator)") {
    TempDir dir("train_dropout");
    TrainConfig a = tiny_run(dir, "a");
    a.steps = 3, a.sample_tokens = 0;
    TrainConfig b = a;
    b.run_dir = dir / "b", b.model.dropout = 0.2;
    train(a);
    train(b);
    CHECK(read_metrics(a.run_dir)[0]["loss"] != read_metrics(b.run_dir)[0]["loss"]);
}

TEST_CASE("a diverging run stops with a clear message and keeps its finite checkpoints") {
    TempDir dir("train_diverge");
    // lr · weight decay = 1000: every 2-D weight is multiplied by about -999 per step, until the
    // activations overflow and the loss is NaN.
    TrainConfig cfg = tiny_run(dir, "run");
    cfg.lr = 10, cfg.lr_min = 10, cfg.warmup = 0, cfg.weight_decay = 100, cfg.grad_clip = 0;
    cfg.steps = 40, cfg.checkpoint_every = 1, cfg.keep_checkpoints = 3;
    cfg.diverge_factor = 0;  // NaN/Inf only: this test is about the non-finite path
    TrainResult r = train(cfg);
    REQUIRE(r.diverged);
    CAPTURE(r.message);
    CHECK(r.message.find(fmt::format("diverged at step {}: loss", r.steps_done + 1)) !=
          std::string::npos);
    CHECK(r.message.find("nan") != std::string::npos);
    CHECK(r.message.find("the last good checkpoint, step ") != std::string::npos);
    CHECK(r.sample.empty());
    const std::vector<json> metrics = read_metrics(cfg.run_dir);
    REQUIRE(metrics.size() == static_cast<size_t>(r.steps_done) + 1);
    CHECK(metrics.back()["diverged"] == true);
    CHECK(json::parse(read_file(cfg.run_dir + "/result.json"))["diverged"] == true);
    CHECK(metrics.back()["loss"].is_null());  // NaN is written as null
    const std::string latest = latest_model_checkpoint(cfg.run_dir);
    REQUIRE(!latest.empty());
    // The checkpoint of the last finished step is not kept: the loss measured on its weights
    // (the next step's) is the NaN that stopped the run.
    CHECK(load_model(latest).metadata.at("step") == std::to_string(r.steps_done - 1));
    for (const auto& name : files_in(cfg.run_dir))
        if (name.find(".safetensors") != std::string::npos)
            CHECK_MESSAGE(finite_checkpoint(dir / ("run/" + name)), name);
    const std::string svg = read_file(cfg.run_dir + "/plot.svg");  // written despite null values
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("nan") == std::string::npos);
}

TEST_CASE("an update that overflows the weights is caught before it is saved") {
    // The loss before a step is finite, but lr · weight decay = 1e40 sends every 2-D weight to
    // -inf in one update; the checkpoint of that step must not be written.
    TempDir dir("train_overflow");
    TrainConfig cfg = tiny_run(dir, "run");
    // Killed after step 5: checkpoint 4 is written once step 5's loss vouched for it, and
    // checkpoint 5, still waiting for step 6's, is lost with the process.
    cfg.steps = 40, cfg.checkpoint_every = 1, cfg.sample_tokens = 0;
    train(cfg, false, {.kill_after = 5});
    TrainConfig hot = load_run_config(cfg.run_dir);  // resume it with an absurd learning rate
    hot.lr = 1e20, hot.lr_min = 1e20, hot.weight_decay = 1e20, hot.grad_clip = 0,
    hot.progress = false;
    TrainResult r = train(hot, /*resume=*/true);
    REQUIRE(r.diverged);
    CAPTURE(r.message);
    CHECK(r.message.find("diverged at step 5") != std::string::npos);
    CHECK(r.message.find("NaN or Inf") != std::string::npos);
    CHECK(latest_model_checkpoint(cfg.run_dir) == cfg.run_dir + "/step-000004.model.safetensors");
    for (const auto& name : files_in(cfg.run_dir))
        if (name.find(".safetensors") != std::string::npos)
            CHECK_MESSAGE(finite_checkpoint(dir / ("run/" + name)), name);
}

TEST_CASE("train refuses a directory that holds a run; one without a checkpoint starts again") {
    TempDir dir("train_refuse");
    TrainConfig cfg = tiny_run(dir, "run");
    cfg.steps = 2, cfg.sample_tokens = 0;
    train(cfg);
    CHECK(throws_with([&] { train(cfg); }, {cfg.run_dir, "already holds a run", "--resume"}));
    CHECK(throws_with([&] { load_run_config(dir / "nothing"); }, {"nothing", "config.json"}));
    TrainConfig empty = tiny_run(dir, "empty");
    fs::create_directories(empty.run_dir);
    std::ofstream(empty.run_dir + "/config.json") << empty.to_json();
    // Killed before its first checkpoint: nothing to resume, so --resume starts it again in place.
    CHECK(train(empty, true).steps_done == empty.steps);
    TrainConfig bad = tiny_run(dir, "bad");
    bad.tokenizer = "words";
    CHECK(throws_with([&] { train(bad); }, {"tokenizer", "words"}));
    bad = tiny_run(dir, "bad2");
    bad.data_path = dir / "missing.txt";
    CHECK(throws_with([&] { train(bad); }, {"missing.txt"}));
    // A resumed run's config names the directory it was found in, even if it was moved.
    fs::rename(cfg.run_dir, dir / "moved");
    CHECK(load_run_config(dir / "moved").run_dir == dir / "moved");
}

TEST_CASE("generate: greedy is deterministic, top-k 1 is greedy, the context is cropped") {
    GPTConfig c;
    c.vocab_size = 9, c.block_size = 4, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    GPT model(c, 3);
    Generator g1(1), g2(2), g3(3);
    const auto greedy = generate(model, {1, 2}, {.max_new_tokens = 10, .temperature = 0}, g1);
    CHECK(greedy.size() == 12);  // runs past block_size 4: the context is cropped
    CHECK(std::vector<int32_t>(greedy.begin(), greedy.begin() + 2) == std::vector<int32_t>{1, 2});
    CHECK(generate(model, {1, 2}, {.max_new_tokens = 10, .temperature = 0}, g2) == greedy);
    CHECK(generate(model, {1, 2}, {.max_new_tokens = 10, .temperature = 1.0, .top_k = 1}, g3) ==
          greedy);
    Generator s1(5), s2(5);
    const auto sampled = generate(model, {1}, {.max_new_tokens = 30, .temperature = 2.0}, s1);
    CHECK(generate(model, {1}, {.max_new_tokens = 30, .temperature = 2.0}, s2) == sampled);
    for (int32_t id : sampled) CHECK((id >= 0 && id < 9));
    CHECK(model.training());  // restored after sampling in eval mode
    CHECK(throws_with([&] { generate(model, {}, {}, s1); }, {"prompt"}));
}

// ---- optimisers, schedule, clipping --------------------------------------------------------

namespace {

Tensor param_with_grad(const std::vector<double>& value, const std::vector<double>& grad,
                       Shape shape) {
    Tensor p = from_vector(value, shape, kF64);
    p.requires_grad_();
    p.set_grad(from_vector(grad, shape, kF64));
    return p;
}

}  // namespace

TEST_CASE("AdamW: two steps against a hand computation; weight decay on 2-D parameters only") {
    for (bool independent : {false, true}) {
        CAPTURE(independent);
        const std::vector<double> w0{0.5, -1.0, 2.0, 0.25}, b0{1.0, -3.0};
        const std::vector<std::vector<double>> gw{{0.1, -0.2, 0.3, 1e-3}, {-0.4, 0.5, 0.1, 2.0}};
        const std::vector<std::vector<double>> gb{{1.0, 0.5}, {0.2, -0.7}};
        Tensor w = param_with_grad(w0, gw[0], {2, 2}), b = param_with_grad(b0, gb[0], {2});
        AdamWOptions o{.lr = 0.1,
                       .beta1 = 0.8,
                       .beta2 = 0.9,
                       .eps = 1e-3,
                       .weight_decay = 0.5,
                       .independent_weight_decay = independent,
                       .lr_max = 0.4};
        AdamW opt({w, b}, o);
        const double lrs[2] = {0.1, 0.05};
        // By hand, element by element, each step applying the decay to the pre-step value.
        auto reference = [&](std::vector<double> p, const std::vector<std::vector<double>>& g,
                             bool decays) {
            std::vector<double> m(p.size(), 0), v(p.size(), 0);
            for (int t = 1; t <= 2; ++t)
                for (size_t i = 0; i < p.size(); ++i) {
                    const double gi = g[t - 1][i];
                    m[i] = 0.8 * m[i] + 0.2 * gi;
                    v[i] = 0.9 * v[i] + 0.1 * gi * gi;
                    const double mh = m[i] / (1 - std::pow(0.8, t)),
                                 vh = v[i] / (1 - std::pow(0.9, t));
                    const double lambda = decays ? (independent ? 0.5 / 0.4 : 0.5) : 0.0;
                    p[i] -= lrs[t - 1] * (mh / (std::sqrt(vh) + 1e-3) + lambda * p[i]);
                }
            return p;
        };
        opt.step(lrs[0]);
        CHECK(opt.steps() == 1);
        w.set_grad(from_vector(gw[1], {2, 2}, kF64));
        b.set_grad(from_vector(gb[1], {2}, kF64));
        opt.step(lrs[1]);
        const std::vector<double> want_w = reference(w0, gw, true),
                                  want_b = reference(b0, gb, false);
        for (size_t i = 0; i < 4; ++i)
            CHECK(w.to_vector<double>()[i] == doctest::Approx(want_w[i]).epsilon(1e-14));
        for (size_t i = 0; i < 2; ++i)
            CHECK(b.to_vector<double>()[i] == doctest::Approx(want_b[i]).epsilon(1e-14));
        // The state round-trips through state() / load_state().
        AdamW copy({w, b}, o);
        copy.load_state(opt.state(), opt.steps());
        CHECK(copy.steps() == 2);
        CHECK(qk::test::max_abs_diff(copy.state()[1], opt.state()[1]) == 0);
        CHECK(throws_with([&] { copy.load_state({opt.state()[0]}, 1); },
                          {"AdamW", "1", "expected 4"}));
    }
}

TEST_CASE("AdamW skips parameters without a gradient and rejects ones without requires_grad") {
    Tensor a = param_with_grad({1, 2}, {1, 1}, {2});
    Tensor b = from_vector({3, 4}, {2}, kF64);
    b.requires_grad_();
    AdamW opt({a, b}, {});
    opt.step(0.1);
    CHECK(b.to_vector<double>() == std::vector<double>{3, 4});
    CHECK(a.to_vector<double>()[0] < 1);
    CHECK(throws_with(
        [] {
            AdamW({from_vector({1, 2}, {2}, kF64)}, {});
        },
        {"AdamW", "require grad"}));
}

TEST_CASE("SGD with momentum and weight decay: two steps by hand") {
    Tensor w = param_with_grad({1.0, -2.0}, {0.5, 0.25}, {1, 2}),
           b = param_with_grad({3.0}, {1.0}, {1});
    SGD opt({w, b}, /*momentum=*/0.9, /*weight_decay=*/0.1);
    opt.step(0.1);
    // step 1: g = grad + 0.1 p (2-D only); v = g; p -= 0.1 v
    const double gw0 = 0.5 + 0.1 * 1.0, gw1 = 0.25 + 0.1 * -2.0;
    double pw0 = 1.0 - 0.1 * gw0, pw1 = -2.0 - 0.1 * gw1, pb = 3.0 - 0.1 * 1.0;
    CHECK(w.to_vector<double>()[0] == doctest::Approx(pw0).epsilon(1e-15));
    CHECK(w.to_vector<double>()[1] == doctest::Approx(pw1).epsilon(1e-15));
    CHECK(b.item() == doctest::Approx(pb).epsilon(1e-15));
    // step 2 with the same raw gradients: v = 0.9 v + g
    w.set_grad(from_vector({0.5, 0.25}, {1, 2}, kF64));
    opt.step(0.1);
    const double v0 = 0.9 * gw0 + (0.5 + 0.1 * pw0), vb = 0.9 * 1.0 + 1.0;
    CHECK(w.to_vector<double>()[0] == doctest::Approx(pw0 - 0.1 * v0).epsilon(1e-15));
    CHECK(b.item() == doctest::Approx(pb - 0.1 * vb).epsilon(1e-15));
}

TEST_CASE("cosine_lr: linear warmup, the peak, the cosine midpoint and the floor") {
    auto lr = [](int64_t step) { return cosine_lr(step, 10, 110, 1.0, 0.1); };
    CHECK(lr(0) == doctest::Approx(0.1));
    CHECK(lr(4) == doctest::Approx(0.5));
    CHECK(lr(9) == doctest::Approx(1.0));
    CHECK(lr(10) == doctest::Approx(1.0));
    CHECK(lr(60) == doctest::Approx(0.55));  // halfway through the decay: (max + min) / 2
    CHECK(lr(110) == doctest::Approx(0.1));
    CHECK(lr(500) == doctest::Approx(0.1));
    for (int64_t s = 10; s < 110; ++s) CHECK(lr(s + 1) <= lr(s));
    CHECK(cosine_lr(0, 0, 10, 1.0, 0.0) == doctest::Approx(1.0));  // no warmup
}

TEST_CASE("wsd_lr: the same warmup, lr held, then a straight line to the floor") {
    // warmup 10, cooldown 40 of 110: flat over [10, 70), the line over [70, 110).
    auto lr = [](int64_t step) { return wsd_lr(step, 10, 40, 110, 1.0, 0.1); };
    for (int64_t s = 0; s < 10; ++s) CHECK(lr(s) == cosine_lr(s, 10, 110, 1.0, 0.1));
    for (int64_t s = 10; s < 70; ++s) CHECK(lr(s) == 1.0);
    CHECK(lr(70) == 1.0);
    CHECK(lr(90) == doctest::Approx(0.55));             // halfway down the line
    CHECK(lr(109) == doctest::Approx(0.1 + 0.9 / 40));  // one step short of the floor
    CHECK(lr(110) == 0.1);
    CHECK(lr(500) == 0.1);
    for (int64_t s = 70; s < 110; ++s)  // equal steps down
        CHECK(lr(s) - lr(s + 1) == doctest::Approx(0.9 / 40));
    // A cooldown longer than the schedule after warmup starts the line at the peak.
    CHECK(wsd_lr(10, 10, 500, 110, 1.0, 0.0) == 1.0);
    CHECK(wsd_lr(60, 10, 500, 110, 1.0, 0.0) == doctest::Approx(0.5));
    CHECK(wsd_lr(0, 0, 10, 10, 1.0, 0.0) == 1.0);  // no warmup
}

TEST_CASE("TrainConfig::lr_at follows --lr-schedule and --cooldown over the schedule's length") {
    TrainConfig c;
    c.steps = 200, c.warmup = 20, c.lr = 1e-2, c.lr_min = 1e-4;
    for (int64_t s : {0, 19, 20, 100, 199, 200})
        CHECK(c.lr_at(s) == cosine_lr(s, 20, 200, 1e-2, 1e-4));
    c.lr_schedule = "wsd", c.cooldown = 0.25;
    for (int64_t s : {0, 19, 20, 149, 150, 175, 199, 200})
        CHECK(c.lr_at(s) == wsd_lr(s, 20, 50, 200, 1e-2, 1e-4));
    c.schedule_steps = 100;  // an extended run keeps its schedule: 25 steps of cooldown
    CHECK(c.lr_at(75) == 1e-2);
    CHECK(c.lr_at(76) < 1e-2);
    CHECK(c.lr_at(150) == 1e-4);
    const TrainConfig back = TrainConfig::from_json(c.to_json());
    CHECK(back.lr_schedule == "wsd");
    CHECK(back.cooldown == 0.25);
    c.lr_schedule = "linear";
    CHECK(throws_with([&] { c.validate(); }, {"--lr-schedule", "linear", "cosine or wsd"}));
    c.lr_schedule = "wsd";
    for (double bad : {0.0, -0.1, 1.5, std::nan("")}) {
        c.cooldown = bad;
        CHECK(throws_with([&] { c.validate(); }, {"--cooldown"}));
    }
}

TEST_CASE("clip_grad_norm scales to max_norm and returns the norm before clipping") {
    Tensor a = param_with_grad({0, 0}, {3, 4}, {2}), b = param_with_grad({0}, {12}, {1});
    CHECK(clip_grad_norm({a, b}, 100.0) == doctest::Approx(13.0));
    CHECK(a.grad().to_vector<double>() == std::vector<double>{3, 4});  // under the cap: untouched
    CHECK(clip_grad_norm({a, b}, 1.3) == doctest::Approx(13.0));
    CHECK(a.grad().to_vector<double>()[1] == doctest::Approx(0.4).epsilon(1e-6));
    CHECK(b.grad().item() == doctest::Approx(1.2).epsilon(1e-6));
    CHECK(clip_grad_norm({a, b}, 0.0) == doctest::Approx(1.3).epsilon(1e-6));  // 0: measure only
    b.set_grad(from_vector({NAN}, {1}, kF64));
    CHECK(throws_with([&] { clip_grad_norm({a, b}, 1.0); }, {"clip_grad_norm", "nan"}));
    CHECK(std::isnan(clip_grad_norm({a, b}, 1.0, false)));
    CHECK(a.grad().to_vector<double>()[1] == doctest::Approx(0.4).epsilon(1e-6));  // not scaled
}

// ---- tokenizers and data -------------------------------------------------------------------

TEST_CASE(
    "char tokenizer: sorted unique characters, round trip, unknown character, serialization") {
    const std::string text = "hello, world\nHELLO!";
    Tokenizer tok = Tokenizer::char_level(text);
    CHECK(tok.vocab_size() == 15);
    CHECK(tok.decode({0, 1, 2}) == "\n !");  // sorted bytes: newline, space, '!'
    CHECK(tok.decode(tok.encode(text)) == text);
    CHECK(throws_with([&] { tok.encode("hey"); }, {"'y'", "position 2", "vocabulary"}));
    CHECK(throws_with([&] { tok.decode({15}); }, {"15", "[0, 15)"}));
    CHECK(throws_with([&] { tok.decode({-1}); }, {"-1"}));
    Tokenizer back = Tokenizer::deserialize(tok.serialize());
    CHECK(!back.is_byte_level());
    CHECK(back.vocab_size() == 15);
    CHECK(back.encode(text) == tok.encode(text));
    CHECK(throws_with([] { Tokenizer::char_level(""); }, {"empty"}));
}

TEST_CASE("byte tokenizer: all 256 bytes round trip; deserialize rejects malformed strings") {
    Tokenizer tok = Tokenizer::byte_level();
    std::string all;
    for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
    CHECK(tok.vocab_size() == 256);
    CHECK(tok.encode(all)[255] == 255);
    CHECK(tok.decode(tok.encode(all)) == all);
    CHECK(tok.serialize() == "bytes");
    CHECK(Tokenizer::deserialize("bytes").is_byte_level());
    for (const char* bad :
         {"", "words", "chars:", "chars:6", "chars:zz", "chars: a", "chars:6261", "chars:6161"})
        CHECK_MESSAGE(throws_with([&] { Tokenizer::deserialize(bad); }, {"Tokenizer"}), bad);
}

TEST_CASE("TextDataset: targets are ids shifted by one, 90/10 split, seeded windows") {
    std::vector<int32_t> tokens(1000);
    std::iota(tokens.begin(), tokens.end(), 0);  // token i at position i: windows are readable
    TextDataset data(tokens, 16);
    CHECK(data.train_tokens() == 900);
    CHECK(data.val_tokens() == 100);
    for (bool train : {true, false}) {
        Generator gen(5);
        Tensor ids, targets;
        data.batch(train, 64, gen, ids, targets);
        CHECK(ids.shape() == Shape{64, 16});
        CHECK(ids.dtype() == kI32);
        const auto x = ids.to_vector<int32_t>(), y = targets.to_vector<int32_t>();
        for (size_t i = 0; i < x.size(); ++i) {
            CHECK(y[i] == x[i] + 1);
            if (i % 16) CHECK(x[i] == x[i - 1] + 1);  // one contiguous window per row
            CHECK((train ? (x[i] >= 0 && y[i] < 900) : (x[i] >= 900 && y[i] < 1000)));
        }
        Generator again(5), other(6);
        Tensor ids2, targets2;
        data.batch(train, 64, again, ids2, targets2);
        CHECK(ids2.to_vector<int32_t>() == x);
        data.batch(train, 64, other, ids2, targets2);
        CHECK(ids2.to_vector<int32_t>() != x);
        CHECK(gen.counter() == again.counter());  // the sampler's state is the generator's
    }
    CHECK(throws_with([&] { TextDataset(tokens, 99); }, {"TextDataset", "100 val"}));
}

TEST_CASE(
    "nanoGPT's validation protocol: every 256-token window of the validation split, exactly") {
    // 10,000 tokens of a 20-symbol vocabulary: a validation split of 1,000, three whole windows
    // (tokens [0, 257), [256, 513), [512, 769)) and a partial one dropped.
    Generator gen(11);
    std::vector<int32_t> tokens(10000);
    for (auto& t : tokens) t = static_cast<int32_t>(gen.uniform() * 20);
    TextDataset data(tokens, 256);
    GPTConfig config;
    config.vocab_size = 20, config.block_size = 256, config.n_layer = 1, config.n_head = 2;
    config.n_embd = 16, config.pos_emb = PosEmb::rope;
    GPT model(config, 3);
    const double got = nanogpt_val_loss(model, data);
    // The reference: each window's mean loss on its own, averaged.
    NoGradGuard no_grad;
    model.eval();
    const std::vector<int32_t> val(tokens.begin() + 9000, tokens.end());
    double sum = 0;
    for (int64_t k = 0; k < 3; ++k) {
        const auto first = val.begin() + k * 256;
        const Tensor ids = from_ids(std::vector<int32_t>(first, first + 256), {1, 256});
        const Tensor targets = from_ids(std::vector<int32_t>(first + 1, first + 257), {1, 256});
        sum += model.forward(ids, targets).cross_entropy.item();
    }
    CHECK(got == doctest::Approx(sum / 3).epsilon(1e-6));
    CHECK(got > 2.5);  // an untrained model: about log 20 = 3.0
    // A model that attends fewer than 256 tokens is refused, by the config and by the measure.
    config.block_size = 64;
    GPT short_model(config, 3);
    CHECK(throws_with([&] { (void)nanogpt_val_loss(short_model, data); },
                      {"nanogpt", "256", "block_size", "64"}));
    TrainConfig cfg;
    cfg.model.block_size = 64;
    cfg.eval_protocol = "nanogpt";
    CHECK(throws_with([&] { cfg.validate(); }, {"--eval-protocol nanogpt", "256", "64"}));
    cfg.eval_protocol = "nanoGPT";
    CHECK(throws_with([&] { cfg.validate(); }, {"--eval-protocol", "qknorm or nanogpt"}));
    cfg.model.block_size = 256;
    cfg.eval_protocol = "nanogpt";
    CHECK(TrainConfig::from_json(cfg.to_json()).eval_protocol == "nanogpt");
}

TEST_CASE("a run with --eval-protocol nanogpt reports that figure beside its own") {
    TempDir dir("train_nanogpt");
    TrainConfig cfg = tiny_run(dir, "nanogpt");
    cfg.model.block_size = 256, cfg.model.pos_emb = PosEmb::rope;
    cfg.steps = 4, cfg.eval_every = 2, cfg.checkpoint_every = 4, cfg.sample_tokens = 0;
    cfg.eval_protocol = "nanogpt";
    const TrainResult r = train(cfg);
    REQUIRE(std::isfinite(r.final_val_loss_nanogpt));
    int reported = 0;
    for (const auto& line : qk::test::step_metrics(cfg.run_dir))
        if (line.contains("val_loss_nanogpt")) {
            CHECK(line.contains("val_loss"));
            ++reported;
        }
    CHECK(reported == 1);  // at the last step (it reads the whole split), with the project's
    const auto result = nlohmann::json::parse(read_file(cfg.run_dir + "/result.json"));
    CHECK(result.at("final_val_loss_nanogpt").get<double>() == r.final_val_loss_nanogpt);
    // Without the flag the field is null and the metrics do not carry it.
    TrainConfig plain = tiny_run(dir, "plain");
    plain.steps = 2, plain.eval_every = 2, plain.checkpoint_every = 2, plain.sample_tokens = 0;
    CHECK(std::isnan(train(plain).final_val_loss_nanogpt));
    CHECK(nlohmann::json::parse(read_file(plain.run_dir + "/result.json"))
              .at("final_val_loss_nanogpt")
              .is_null());
}
