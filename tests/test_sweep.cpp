// The sweep machinery behind `qknorm sweep`: variant strings, the LR-sensitivity formula against a
// hand computation, a 2 × 2 grid of a tiny model end to end (the table and the plots are written
// and parse), resuming (finished runs are skipped, interrupted ones resumed), and bad grids.
#include <nlohmann/json.hpp>
#include <sstream>

#include "helpers.h"
#include "nn/lab/sweep.h"

using namespace qk;
using namespace qk::nn;
using qk::test::read_file;
using qk::test::TempDir;
using qk::test::throws_with;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

TrainConfig variant_config(const std::string& spec) {
    TrainConfig cfg;
    cfg.model.block_size = 64, cfg.model.n_embd = 128, cfg.model.n_head = 4;
    apply_variant(parse_variant(spec), cfg);
    return cfg;
}

GPTConfig variant_model(const std::string& spec) { return variant_config(spec).model; }

SweepSpec tiny_grid(const TempDir& dir) {
    SweepSpec spec;
    TrainConfig& b = spec.base;
    b.model.block_size = 16, b.model.n_layer = 2, b.model.n_head = 2, b.model.n_embd = 16;
    b.model.bias = false;
    b.data_path = qk::test::write_corpus(dir);
    b.batch_size = 4, b.steps = 6, b.warmup = 1;
    b.eval_every = 3, b.eval_batches = 2, b.stats_every = 2;
    b.checkpoint_every = 3, b.keep_checkpoints = 1;
    b.sample_tokens = 0;
    spec.variants = {"baseline", "qk_layernorm"};
    spec.lrs = {1e-3, 1e-2};
    spec.seeds = {7};
    spec.out_dir = dir / "sweep";
    spec.progress = false;
    return spec;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

RunSummary fake_run(const std::string& variant, double lr, double final_loss, double init_loss,
                    bool diverged = false) {
    RunSummary r;
    r.variant = variant, r.lr = lr, r.finished = true, r.diverged = diverged;
    r.init_val_loss = init_loss;
    r.final_val_loss = diverged ? NAN : final_loss;
    return r;
}

}  // namespace

TEST_CASE("variant strings: presets, overrides and errors") {
    CHECK(variant_model("baseline").qk_norm == QKNorm::none);
    CHECK(variant_model("qk_layernorm").qk_norm == QKNorm::layernorm);
    CHECK(variant_model("qk_rmsnorm").qk_norm == QKNorm::rmsnorm);
    CHECK(variant_model("l2").qk_norm == QKNorm::l2);
    const GPTConfig soft = variant_model("softcap");
    CHECK((soft.qk_norm == QKNorm::none && soft.attn_softcap == 50.0));
    const GPTConfig both = variant_model("qk_norm_cap");
    CHECK((both.qk_norm == QKNorm::layernorm && both.attn_softcap == 50.0 && !both.qkv_norm));
    const GPTConfig qkv = variant_model("qkv_norm");
    CHECK((qkv.qk_norm == QKNorm::layernorm && qkv.qkv_norm && qkv.attn_softcap == 0.0));

    const GPTConfig lp = variant_model("lp:p=3.5:g0=1");
    CHECK((lp.qk_norm == QKNorm::lp && lp.lp_p == 3.5 && lp.qk_scale_init == "1"));
    CHECK(lp.initial_qk_scale() == 1.0);
    const GPTConfig wide = variant_model("baseline:C=256:H=8:L=3");
    CHECK((wide.n_embd == 256 && wide.n_head == 8 && wide.n_layer == 3));
    CHECK(variant_model("qk_rmsnorm:scope=full").qk_norm_scope == NormScope::full);
    CHECK(variant_model("softcap:cap=30").attn_softcap == 30.0);
    CHECK(variant_model("baseline:precision=bf16").precision == Precision::bf16);
    CHECK(variant_model("baseline").precision == Precision::full);
    CHECK(variant_model("baseline:precision=fp16").precision == Precision::fp16);
    CHECK(throws_with([] { variant_model("baseline:precision=fp4"); }, {"precision", "fp4"}));
    CHECK(parse_variant("lp:p=3").spec == "lp:p=3");
    // The training keys: optimizer, positions, norm order, QK-Clip, gradient clipping.
    const TrainConfig muon = variant_config("baseline:opt=muon:clip=100:gclip=0:pos=rope");
    CHECK((muon.optimizer == "muon" && muon.qk_clip == 100.0 && muon.grad_clip == 0.0));
    CHECK(muon.model.pos_emb == PosEmb::rope);
    CHECK(variant_config("baseline").optimizer == "adamw");
    const TrainConfig defaults;
    CHECK(variant_config("baseline").grad_clip == defaults.grad_clip);
    CHECK(variant_model("qk_layernorm:pos=rope:order=after_rope").qk_norm_order ==
          QKNormOrder::after_rope);
    CHECK(throws_with([] { variant_config("baseline:opt=sgd"); }, {"opt", "adamw or muon", "sgd"}));
    CHECK(throws_with([] { variant_config("baseline:pos=alibi"); }, {"alibi"}));
    CHECK(
        throws_with([] { variant_config("baseline:clip=big"); }, {"must be a number, got 'big'"}));
    // QK-Clip with a QK-norm: refused by the run's checks (check_sweep runs them on every cell).
    CHECK(throws_with([] { variant_config("qk_layernorm:clip=100").validate(); },
                      {"--qk-clip", "--qk-norm none"}));

    CHECK(throws_with([] { parse_variant("qknorm"); }, {"unknown variant 'qknorm'"}));
    CHECK(throws_with([] { parse_variant("lp:q=3"); }, {"bad override 'q=3'"}));
    CHECK(throws_with([] { parse_variant("lp:p"); }, {"bad override 'p'"}));
    CHECK(throws_with([] { parse_variant("lp:p="); }, {"bad override 'p='"}));
    CHECK(throws_with([] { variant_model("lp:p=three"); }, {"must be a number, got 'three'"}));
    CHECK(throws_with([] { variant_model("baseline:C=100:H=3"); }, {"n_embd"}));

    CHECK(run_dir_name("lp:p=3:g0=1", 0.003, 2) == "lp_p-3_g0-1__lr0.003__s2");
    CHECK(run_dir_name("baseline", 1e-3, 1) == "baseline__lr0.001__s1");
}

TEST_CASE("LR sensitivity follows Wortsman et al.: mean over LRs of min(L, L0) minus the best") {
    // Variant a: losses 2.0 and 3.0 (seeds averaged: (1.8 + 2.2) / 2 = 2.0), then a loss above the
    // init loss (capped at L0 = 4) and a diverged run (counts as L0).
    // Sensitivity = mean(2.0, 3.0, 4.0, 4.0) − 2.0 = 1.25.
    std::vector<RunSummary> runs{
        fake_run("a", 1e-3, 1.8, 4.0),    fake_run("a", 1e-3, 2.2, 4.0),
        fake_run("a", 1e-2, 3.0, 4.0),    fake_run("a", 1e-1, 5.0, 4.0),
        fake_run("a", 1.0, 0, 4.0, true), fake_run("b", 1e-3, 2.5, 4.0),
        fake_run("b", 1e-2, 2.5, 4.0),
    };
    RunSummary unfinished = fake_run("b", 1e-1, 0.1, 4.0);
    unfinished.finished = false;  // not yet trained: left out, not counted as a loss of 0.1
    runs.push_back(unfinished);
    const std::vector<VariantSummary> v = summarize_variants(runs);
    REQUIRE(v.size() == 2);
    CHECK(v[0].variant == "a");
    CHECK(v[0].best_loss == doctest::Approx(2.0));
    CHECK(v[0].best_lr == 1e-3);
    CHECK(v[0].lr_sensitivity == doctest::Approx(1.25));
    CHECK((v[0].runs == 5 && v[0].diverged == 1));
    CHECK(v[1].variant == "b");
    CHECK(v[1].lr_sensitivity == doctest::Approx(0.0));  // flat: every LR is as good as the best
    CHECK(v[1].runs == 2);
    // The edge of stability: a diverges first at lr 1 (a loss above L0 is not a divergence).
    CHECK(v[0].max_stable_lr == 1e-1);
    CHECK(v[1].max_stable_lr == 1e-2);  // the unfinished run at 1e-1 says nothing yet
}

TEST_CASE("max stable LR: one diverged seed ends the stable range, even if higher LRs survive") {
    const std::vector<VariantSummary> v = summarize_variants({
        fake_run("a", 1e-3, 2.0, 4.0),
        fake_run("a", 1e-2, 2.0, 4.0),
        fake_run("a", 1e-2, 0, 4.0, true),  // seed 2 diverged at 1e-2
        fake_run("a", 1e-1, 2.5, 4.0),      // a lucky survivor above the edge
        fake_run("b", 1e-3, 0, 4.0, true),  // b diverges at the smallest LR already
        fake_run("b", 1e-2, 2.0, 4.0),
    });
    REQUIRE(v.size() == 2);
    CHECK(v[0].max_stable_lr == 1e-3);
    CHECK(std::isnan(v[1].max_stable_lr));
}

TEST_CASE("a 2 x 2 sweep trains every cell, writes the table and the plots, and resumes") {
    TempDir dir("sweep");
    SweepSpec spec = tiny_grid(dir);
    int trained = 0;
    spec.train_fn = [&](const TrainConfig& cfg, bool resume) {
        CHECK(!resume);
        ++trained;
        train(cfg, resume);
    };
    const SweepResult result = run_sweep(spec);
    CHECK(trained == 4);
    REQUIRE(result.runs.size() == 4);
    for (const RunSummary& r : result.runs) {
        CAPTURE(r.run_dir);
        CHECK((r.finished && !r.diverged && r.steps_done == 6));
        CHECK(std::isfinite(r.final_val_loss));
        CHECK(r.init_val_loss > r.final_val_loss);
        REQUIRE(r.max_logit.size() == 2);  // one per layer
        CHECK(r.max_logit[0] > 0);
        CHECK(r.final_entropy[1] > 0);
        const json config = json::parse(read_file(r.run_dir + "/config.json"));
        CHECK(config["lr"].get<double>() == r.lr);
        CHECK(config["lr_min"].get<double>() == doctest::Approx(r.lr * 0.1));
        CHECK(config["seed"].get<uint64_t>() == 7);
        CHECK(config["model"]["qk_norm"] == (r.variant == "baseline" ? "none" : "layernorm"));
    }
    CHECK(result.runs[0].variant == "baseline");
    CHECK(result.runs[3].variant == "qk_layernorm");
    CHECK(result.runs[3].lr == 1e-2);

    const std::vector<std::string> csv = lines_of(read_file(spec.out_dir + "/results.csv"));
    REQUIRE(csv.size() == 5);
    CHECK(csv[0].rfind("variant,lr,seed,finished,diverged,steps,init_val_loss,final_val_loss", 0) ==
          0);
    CHECK(csv[0].find("max_logit_l1") != std::string::npos);
    CHECK(csv[1].rfind("baseline,0.001,7,1,0,6,", 0) == 0);
    const std::vector<std::string> jsonl = lines_of(read_file(spec.out_dir + "/results.jsonl"));
    REQUIRE(jsonl.size() == 4);
    for (const std::string& line : jsonl) CHECK(json::parse(line)["max_logit"].size() == 2);
    const std::vector<std::string> sens = lines_of(read_file(spec.out_dir + "/sensitivity.csv"));
    REQUIRE(sens.size() == 3);
    CHECK(sens[1].rfind("baseline,", 0) == 0);
    for (const char* svg : {"lr_sweep.svg", "max_logit.svg", "entropy.svg"}) {
        CAPTURE(svg);
        const std::string text = read_file(spec.out_dir + "/" + svg);
        CHECK(text.rfind("<svg", 0) == 0);
        CHECK(text.find("</svg>") != std::string::npos);
        CHECK(text.find("qk_layernorm") != std::string::npos);  // the legend
        CHECK(text.find("<polyline") != std::string::npos);
    }

    SUBCASE("a second call trains nothing and gives the same table") {
        const std::string before = read_file(spec.out_dir + "/results.csv");
        trained = 0;
        run_sweep(spec);
        CHECK(trained == 0);
        CHECK(read_file(spec.out_dir + "/results.csv") == before);
    }
    SUBCASE("an interrupted run is resumed from its checkpoint, a fresh one restarted") {
        const std::string interrupted = result.runs[1].run_dir, fresh = result.runs[2].run_dir;
        fs::remove(interrupted + "/result.json");  // as if killed after its last checkpoint
        fs::remove(fresh + "/result.json");
        for (const auto& e : fs::directory_iterator(fresh))
            if (e.path().extension() == ".safetensors") fs::remove(e.path());
        std::vector<std::pair<std::string, bool>> calls;
        spec.train_fn = [&](const TrainConfig& cfg, bool resume) {
            calls.emplace_back(cfg.run_dir, resume);
            train(cfg, resume);
        };
        const SweepResult again = run_sweep(spec);
        REQUIRE(calls.size() == 2);
        CHECK(calls[0] == std::pair<std::string, bool>{interrupted, true});
        CHECK(calls[1] == std::pair<std::string, bool>{fresh, false});
        CHECK(again.runs[1].final_val_loss == result.runs[1].final_val_loss);  // bit-identical
        CHECK(again.runs[2].final_val_loss == result.runs[2].final_val_loss);
    }
}

TEST_CASE("plot_param plots the final loss against a variant override, one curve per rest") {
    TempDir dir("sweep_param");
    SweepSpec spec = tiny_grid(dir);
    spec.base.steps = 2, spec.base.eval_every = 2;
    spec.variants = {"lp:p=2:g0=1", "lp:p=3:g0=1", "lp:p=2:g0=henry", "lp:p=3:g0=henry"};
    spec.lrs = {1e-2};
    spec.plot_param = "p";
    run_sweep(spec);
    const std::string svg = read_file(spec.out_dir + "/param_sweep.svg");
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("against p, lr 0.01") != std::string::npos);
    CHECK(svg.find("lp:g0=1") != std::string::npos);
    CHECK(svg.find("lp:g0=henry") != std::string::npos);
    size_t polylines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos;
         at = svg.find("<polyline", at + 1))
        ++polylines;
    CHECK(polylines == 2);
}

TEST_CASE("bad grids are refused before anything trains") {
    TempDir dir("sweep_bad");
    SweepSpec spec = tiny_grid(dir);
    spec.train_fn = [](const TrainConfig&, bool) { FAIL("nothing should train"); };
    SweepSpec empty = spec;
    empty.lrs.clear();
    CHECK(throws_with([&] { run_sweep(empty); }, {"the grid is empty (2 variants, 0 learning"}));
    SweepSpec bad_lr = spec;
    bad_lr.lrs = {1e-3, -1.0};
    CHECK(throws_with([&] { run_sweep(bad_lr); }, {"learning rates must be > 0, got -1"}));
    SweepSpec bad_variant = spec;
    bad_variant.variants = {"baseline", "lp:p=0.5"};
    CHECK(throws_with([&] { run_sweep(bad_variant); }, {"lp_p"}));
    SweepSpec parallel = spec;
    parallel.jobs = 2;
    CHECK(throws_with([&] { run_sweep(parallel); }, {"needs the qknorm program"}));
    SweepSpec bad_plot = spec;
    bad_plot.plot_lr = 5e-3;
    CHECK(throws_with([&] { run_sweep(bad_plot); }, {"plot_lr 0.005 is not in the grid"}));
    SweepSpec bad_param = spec;
    bad_param.plot_param = "p";
    CHECK(throws_with([&] { run_sweep(bad_param); }, {"plot_param 'p' is not overridden"}));
    CHECK(!fs::exists(spec.out_dir + "/runs"));
}
