// The files of a run as hostile or surprising input, below the command line: checkpoints of every
// position scheme load, a run directory's cleanup touches only what the run wrote, one process per
// run directory, metrics.jsonl of the wrong kind, a checkpoint whose config.json was edited, a
// config.json with keys this version does not know, the sweep's grid cells and its reuse of runs.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "error_in_child.h"
#include "helpers.h"
#include "nn/lab/sweep.h"
#include "nn/signals/plot.h"
#include "nn/train/checkpoint.h"
#include "nn/train/run_control.h"
#include "nn/train/trainer.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int64_t parameter_values(const GPT& model) {
    int64_t n = 0;
    for (const auto& [name, p] : model.named_parameters()) n += p.numel();
    return n;
}

TrainConfig short_run(const TempDir& dir, const std::string& name) {
    TrainConfig c = tiny_run(dir, name);
    c.steps = 6, c.warmup = 1, c.eval_every = 3, c.eval_batches = 1, c.checkpoint_every = 3;
    c.sample_tokens = 0;
    return c;
}

}  // namespace

TEST_CASE("load_model takes the default RoPE model's checkpoint; the size bound is a lower bound") {
    // The default model: RoPE (no wpe), L4 C192 H6 T64, V = 65. Its bound once counted a position
    // table it does not have, and `qknorm sample` refused every RoPE checkpoint.
    TempDir dir("run_files_load");
    GPTConfig config;
    config.vocab_size = 65, config.block_size = 64, config.n_layer = 4, config.n_head = 6;
    config.n_embd = 192, config.qk_norm = QKNorm::layernorm, config.pos_emb = PosEmb::rope;
    const GPT model(config, 3);
    std::string text;
    for (int c = 0; c < 65; ++c) text += static_cast<char>(' ' + c);
    save_model(dir / "default.safetensors", model, Tokenizer::char_level(text));
    const LoadedModel loaded = load_model(dir / "default.safetensors");
    CHECK(loaded.model->config().pos_emb == PosEmb::rope);
    CHECK(parameter_values(*loaded.model) == parameter_values(model));
    // Every switch that adds or removes parameters: the bound never exceeds the real count.
    for (const PosEmb pos : {PosEmb::learned, PosEmb::rope})
        for (const bool bias : {false, true})
            for (const bool tied : {false, true})
                for (const MLPKind mlp : {MLPKind::gelu, MLPKind::swiglu})
                    for (const NormKind norm : {NormKind::layernorm, NormKind::rmsnorm}) {
                        GPTConfig c;
                        c.vocab_size = 11, c.block_size = 40, c.n_layer = 2, c.n_head = 2;
                        c.n_embd = 8, c.pos_emb = pos, c.bias = bias, c.tie_embeddings = tied;
                        c.norm = norm, c.mlp = mlp, c.mlp_hidden = mlp == MLPKind::gelu ? 0 : 20;
                        CAPTURE(to_string(mlp));
                        CAPTURE(to_string(pos));
                        CAPTURE(bias);
                        CAPTURE(tied);
                        CHECK(min_parameter_values(c) <= parameter_values(GPT(c, 0)));
                    }
}

TEST_CASE("a run directory's cleanup removes only the temporaries the run wrote") {
    TempDir dir("run_files_cleanup");
    TrainConfig cfg = short_run(dir, "run");
    fs::create_directories(cfg.run_dir);
    const std::string run = cfg.run_dir;
    // A user's files with ".tmp." in their names, a folder, a symlink shaped like a leftover.
    std::ofstream(run + "/notes.tmp.txt") << "mine";
    std::ofstream(run + "/report.tmp.2024") << "mine";
    fs::create_directories(run + "/cache.tmp.d");
    std::ofstream(run + "/cache.tmp.d/data") << "mine";
    std::ofstream(dir / "target") << "mine";
    fs::create_symlink(dir / "target", run + "/metrics.jsonl.tmp.99999998");
    fs::create_directories(run + "/config.json.tmp.99999997");  // a folder, not our file
    // What a kill leaves: a temporary of one of the run's files, of a process that is gone.
    std::ofstream(run + "/step-000003.model.safetensors.tmp.99999999") << "partial";
    std::ofstream(run + "/metrics.jsonl.tmp.99999996") << "partial";
    CHECK(train(cfg).steps_done == 6);
    for (const char* kept : {"notes.tmp.txt", "report.tmp.2024", "cache.tmp.d/data",
                             "metrics.jsonl.tmp.99999998", "config.json.tmp.99999997"}) {
        CAPTURE(kept);
        CHECK(fs::exists(fs::symlink_status(run + "/" + kept)));
    }
    CHECK(read_file(dir / "target") == "mine");
    CHECK(!fs::exists(run + "/step-000003.model.safetensors.tmp.99999999"));
    CHECK(!fs::exists(run + "/metrics.jsonl.tmp.99999996"));
}

TEST_CASE("one process per run directory: a second trainer is refused while the first holds it") {
    TempDir dir("run_files_lock");
    TrainConfig cfg = short_run(dir, "run");
    fs::create_directories(cfg.run_dir);
    {
        const RunDirLock held(cfg.run_dir, "train: --run-dir");
        CHECK(throws_with([&] { train(cfg); }, {cfg.run_dir, "in use by another qknorm process"}));
        CHECK(!fs::exists(cfg.run_dir + "/config.json"));
    }
    CHECK(train(cfg).steps_done == 6);  // released with its holder
}

TEST_CASE("resume reads metrics.jsonl as hostile input: a FIFO, /dev/zero, /dev/urandom") {
    TempDir dir("run_files_metrics");
    TrainConfig cfg = short_run(dir, "run");
    train(cfg, false, {.kill_after = 4});
    const std::string metrics = cfg.run_dir + "/metrics.jsonl";
    auto replace_with = [&](const std::function<void()>& make) {
        fs::remove(metrics);
        make();
    };
    replace_with([&] { REQUIRE(::mkfifo(metrics.c_str(), 0644) == 0); });
    CHECK(error_in_child([&] { train(cfg, true); }).find("FIFO") != std::string::npos);
    for (const char* device : {"/dev/zero", "/dev/urandom"}) {
        CAPTURE(device);
        replace_with([&] { fs::create_symlink(device, metrics); });
        const std::string error = error_in_child([&] { train(cfg, true); });
        CHECK(error.find("metrics") != std::string::npos);
        CHECK(error.find("character device") != std::string::npos);
    }
    replace_with([&] { std::ofstream(metrics) << "{\"step\": 1}\n"; });
    CHECK(train(cfg, true).steps_done == 6);
}

TEST_CASE("resume compares the checkpoint's own model config with config.json") {
    TempDir dir("run_files_edited");
    TrainConfig cfg = short_run(dir, "run");
    train(cfg, false, {.kill_after = 4});
    json edited = json::parse(read_file(cfg.run_dir + "/config.json"));
    edited["model"]["n_head"] = 4;  // the same shapes: the weights would load
    std::ofstream(cfg.run_dir + "/config.json") << edited.dump(2);
    const TrainConfig again = load_run_config(cfg.run_dir);
    CHECK(throws_with([&] { train(again, true); },
                      {"n_head = 2", "config.json says n_head = 4", "edited"}));
}

TEST_CASE("a train config's JSON refuses keys it does not know, at the top and in the model") {
    TempDir dir("run_files_keys");
    const json good = json::parse(short_run(dir, "run").to_json());
    CHECK_NOTHROW(TrainConfig::from_json(good.dump()));
    json top = good;
    top["stpes"] = 5;
    CHECK(throws_with([&] { TrainConfig::from_json(top.dump()); }, {"unknown key 'stpes'"}));
    json model = good;
    model["model"]["n_heads"] = 4;
    CHECK(throws_with([&] { TrainConfig::from_json(model.dump()); },
                      {"unknown key 'model.n_heads'"}));
    json nan_theta = good;
    nan_theta["model"]["rope_theta"] = nullptr;  // what a NaN was once saved as
    CHECK(throws_with([&] { TrainConfig::from_json(nan_theta.dump()); }, {"rope_theta"}));
}

TEST_CASE("a run that diverges before its first checkpoint says there is none to keep") {
    TempDir dir("run_files_no_checkpoint");
    TrainConfig cfg = short_run(dir, "run");
    cfg.lr = 10, cfg.lr_min = 10, cfg.warmup = 0, cfg.weight_decay = 100, cfg.grad_clip = 0;
    cfg.checkpoint_every = 100, cfg.steps = 40, cfg.diverge_factor = 0;
    const TrainResult r = train(cfg);
    REQUIRE(r.diverged);
    CAPTURE(r.message);
    CHECK(r.message.find("no checkpoint was written before it") != std::string::npos);
    CHECK(r.message.find("last good checkpoint") == std::string::npos);
}

TEST_CASE("sweep: one run directory per grid cell, whole layer counts, settings checked on reuse") {
    TempDir dir("run_files_sweep");
    SweepSpec spec;
    spec.base = short_run(dir, "unused");
    spec.variants = {"qk_layernorm"};
    spec.lrs = {1e-3, 1.0000001e-3};  // print alike with 6 digits
    spec.seeds = {1};
    spec.out_dir = dir / "sweep";
    spec.progress = false;
    CHECK(run_dir_name("x", 1e-3, 1) != run_dir_name("x", 1.0000001e-3, 1));
    const SweepResult result = run_sweep(spec);
    REQUIRE(result.runs.size() == 2);
    CHECK(result.runs[0].run_dir != result.runs[1].run_dir);
    CHECK(result.runs[0].lr != result.runs[1].lr);

    SweepSpec twice = spec;
    twice.lrs = {1e-3, 2e-3, 1e-3};
    CHECK(throws_with([&] { run_sweep(twice); }, {"lr 0.001", "twice"}));
    SweepSpec fractional = spec;
    fractional.variants = {"baseline:L=2.9"};
    CHECK(throws_with([&] { run_sweep(fractional); }, {"'L'", "whole number", "2.9"}));
    // The same folder, other settings: the finished runs are not reported as this sweep's.
    SweepSpec longer = spec;
    longer.base.steps = 9;
    CHECK(throws_with([&] { run_sweep(longer); }, {"was trained with steps = 6", "asks for 9"}));
    CHECK(run_sweep(spec).runs.size() == 2);  // the same settings: reused, nothing trains
}

TEST_CASE("a plot's y axis can leave out the first points, which are drawn at its edge") {
    // A loss curve from 1000 at step 0 down to 1..2: fitted from x >= 5, no tick reaches 1000.
    plot::Series loss{"loss", {0}, {1000}};
    for (int x = 5; x <= 100; ++x) loss.x.push_back(x), loss.y.push_back(1 + 1.0 / x);
    plot::Panel panel{"loss", "step", "nats", false, false, {loss}};
    const std::string all = plot::render_svg({panel});
    panel.y_range_from_x = 5;
    const std::string fitted = plot::render_svg({panel});
    CHECK(all.find(">1000<") != std::string::npos);
    CHECK(fitted.find(">1000<") == std::string::npos);
    CHECK(fitted.find(">1.1<") != std::string::npos);
}
