// Fine-tuning an imported model (`qknorm train --init-from DIR`, nn/train/fine_tune.h): the
// architecture comes from config.json and the runtime switches from the run, the weights are the
// checkpoint's bit for bit, every family trains with AdamW or Muon in fp32 or bf16 with the
// stability signals per layer and head, a run resumes without the directory it started from, and
// what comes out samples and exports back to Hugging Face's format. The fixtures are those of
// tests/test_hf.cpp (tests/data/hf).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda_parity.h"
#include "helpers.h"
#include "hf_fixtures.h"
#include "nn/hf/hf.h"
#include "nn/model/sample.h"
#include "nn/train/checkpoint.h"
#include "nn/train/fine_tune.h"
#include "nn/train/trainer.h"
#include "run_program.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A short fine-tuning run of a fixture on the suites' 6 KB corpus, read as bytes.
TrainConfig fine_tune_run(const TempDir& dir, const std::string& init_from,
                          const std::string& name) {
    TrainConfig c;
    c.init_from = init_from;
    c.tokenizer = "byte";
    c.context = 32;
    c.data_path = write_corpus(dir);
    c.batch_size = 8, c.steps = 16, c.warmup = 2, c.lr = 3e-3, c.lr_min = 3e-4;
    c.eval_every = 8, c.eval_batches = 2, c.stats_every = 4;
    c.checkpoint_every = 8, c.keep_checkpoints = 2;
    c.run_dir = dir / name;
    c.sample_tokens = 30;
    c.progress = false;
    return c;
}

// The per-step lines of metrics.jsonl (step 0, the validation loss at the start, left out).
std::vector<json> step_lines(const std::string& run_dir) {
    std::vector<json> lines;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    REQUIRE(!lines.empty());
    lines.erase(lines.begin());
    return lines;
}

void check_same_parameters(GPT& a, GPT& b) {
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].first);
        REQUIRE(pa[i].first == pb[i].first);
        CHECK(pa[i].second.to_vector<double>() == pb[i].second.to_vector<double>());
    }
}

}  // namespace

TEST_CASE("import_model_config: the architecture from config.json, the runtime from the run") {
    for (const std::string family : kFamilies) {
        CAPTURE(family);
        TrainConfig cfg;
        cfg.init_from = fixture(family);
        cfg.model.n_layer = 7, cfg.model.qk_norm = QKNorm::l2;                     // replaced
        cfg.model.precision = Precision::bf16, cfg.model.fused_attention = false;  // kept
        cfg.model.dropout = 0.1, cfg.model.z_loss = 1e-4;
        const GPTConfig runtime = cfg.model;
        import_model_config(cfg);
        const GPTConfig imported = read_hf_config(fixture(family) + "/config.json").config;
        CHECK(first_difference(cfg.model, with_runtime_of(imported, runtime)) == "");
        CHECK(cfg.model.precision == Precision::bf16);
        CHECK(!cfg.model.fused_attention);
        CHECK(cfg.model.n_layer == imported.n_layer);
        CHECK(cfg.context == 0);  // the fixtures' 64 positions fit
        cfg.validate();
        const GPTConfig once = cfg.model;
        import_model_config(cfg);  // the trainer runs it again: nothing changes
        CHECK(first_difference(cfg.model, once) == "");
    }
    // A model built for 40,960 positions trains on windows of 1024 unless --context says.
    ScratchDir long_context("qwen3");
    json config = long_context.read("config.json");
    config["max_position_embeddings"] = 40960;
    long_context.write("config.json", config);
    TrainConfig cfg;
    cfg.init_from = long_context.str();
    import_model_config(cfg);
    CHECK(cfg.model.block_size == 40960);
    CHECK(cfg.context == kDefaultFineTuneContext);
    CHECK(cfg.context_length() == 1024);
    cfg.context = 4096;
    import_model_config(cfg);
    CHECK(cfg.context == 4096);
    cfg.context = 40961;
    CHECK(throws_with([&] { cfg.validate(); }, {"--context must be in [0, 40960]", "40961"}));
}

TEST_CASE("import_model_weights: the checkpoint's values exactly, whatever the seed drew") {
    for (const std::string family : kFamilies) {
        CAPTURE(family);
        TrainConfig cfg;
        cfg.init_from = fixture(family);
        import_model_config(cfg);
        GPT model(cfg.model, 1234);
        import_model_weights(cfg, model);
        std::unique_ptr<GPT> reference = load_hf_model(fixture(family));
        check_same_parameters(model, *reference);
        // A model of another shape is refused by name, before any tensor is read.
        // A model of other switches is refused by name, even one whose shapes all fit.
        GPTConfig other = cfg.model;
        other.norm_eps *= 2;
        GPT wrong(other, 0);
        CHECK(throws_with([&] { import_model_weights(cfg, wrong); },
                          {"not the one", "config.json", "norm_eps"}));
    }
}

TEST_CASE("every family fine-tunes: the loss falls, the signals come per layer and head") {
    struct Case {
        std::string family;
        const char* optimizer;
        Precision precision;
        bool fused;
        double qk_clip;
    };
    // GPT-2 has no QK-norm: QK-Clip is its guard. Qwen3 with Muon (GQA: c_attn split by its q
    // and kv widths), Gemma 3 in bf16 through the fused kernel (sliding layers).
    const Case cases[] = {{"gpt2", "adamw", Precision::full, false, 2.0},
                          {"qwen3", "muon", Precision::bf16, true, 0},
                          {"olmo2", "adamw", Precision::full, true, 0},
                          {"gemma3", "adamw", Precision::bf16, true, 0}};
    for (const Case& c : cases) {
        CAPTURE(c.family);
        TempDir dir("fine_tune_" + c.family);
        TrainConfig cfg = fine_tune_run(dir, fixture(c.family), "run");
        cfg.optimizer = c.optimizer;
        cfg.qk_clip = c.qk_clip;
        cfg.model.precision = c.precision;
        cfg.model.fused_attention = c.fused;
        const TrainResult result = train(cfg);
        REQUIRE(!result.diverged);
        CHECK(result.steps_done == 16);
        const std::vector<json> lines = step_lines(cfg.run_dir);
        REQUIRE(lines.size() == 16);
        const double first = lines.front()["loss"], last = lines.back()["loss"];
        CHECK(last < first - 1.0);  // bytes of English text from a model that never saw them
        const GPTConfig model = read_hf_config(fixture(c.family) + "/config.json").config;
        int measured = 0;
        for (const json& line : lines) {
            if (!line.contains("layers")) continue;
            ++measured;
            REQUIRE(line["layers"].size() == static_cast<size_t>(model.n_layer));
            for (const json& layer : line["layers"]) {
                REQUIRE(layer["head_max_logit"].size() == static_cast<size_t>(model.n_head));
                double largest = 0;
                for (const json& head : layer["head_max_logit"]) {
                    CHECK(std::isfinite(head.get<double>()));
                    largest = std::max(largest, head.get<double>());
                }
                CHECK(layer["max_logit"].get<double>() == largest);
                for (const char* key : {"entropy", "q_norm", "k_norm"})
                    CHECK(layer[key].get<double>() > 0);
            }
        }
        CHECK(measured == 5);               // the first step, every 4th after it, and the last
        CHECK(result.sample.size() >= 30);  // 30 bytes drawn from the tokenizer's 256 ids
        // The checkpoint keeps the embedding's rows and the byte tokenizer beside them.
        LoadedModel loaded = load_model(latest_model_checkpoint(cfg.run_dir));
        CHECK(loaded.model->config().vocab_size == model.vocab_size);
        CHECK(loaded.tokenizer.vocab_size() == 256);
    }
}

TEST_CASE("a fine-tuning run resumes from its checkpoint, without the directory it came from") {
    TempDir dir("fine_tune_resume");
    ScratchDir source("qwen3");
    TrainConfig a = fine_tune_run(dir, source.str(), "straight");
    a.steps = 10, a.checkpoint_every = 4, a.optimizer = "muon", a.sample_tokens = 0;
    train(a);
    TrainConfig b = a;
    b.run_dir = dir / "interrupted";
    CHECK(train(b, false, {.kill_after = 6}).steps_done == 6);
    fs::remove_all(source.path);  // a resumed run reads its own checkpoint, not init_from
    TrainConfig reloaded = load_run_config(b.run_dir);
    CHECK(reloaded.init_from == source.str());
    CHECK(reloaded.context == 32);
    reloaded.progress = false;
    CHECK(train(reloaded, true).steps_done == 10);
    const std::vector<json> la = step_lines(a.run_dir), lb = step_lines(b.run_dir);
    REQUIRE(la.size() == 10);
    REQUIRE(lb.size() == 10);
    for (size_t i = 0; i < 10; ++i) {
        CAPTURE(i);
        CHECK(lb[i]["loss"].get<double>() == la[i]["loss"].get<double>());  // bit-identical
    }
    CHECK(read_file(a.run_dir + "/step-000010.model.safetensors") ==
          read_file(b.run_dir + "/step-000010.model.safetensors"));
}

TEST_CASE("sampling draws only the tokenizer's ids from a larger embedding") {
    std::unique_ptr<GPT> model = load_hf_model(fixture("qwen3"));  // 300 ids
    Generator gen(7);
    const SampleOptions options{.max_new_tokens = 200, .temperature = 2.0, .vocab = 256};
    const std::vector<int32_t> ids = generate(*model, {1, 2, 3}, options, gen);
    REQUIRE(ids.size() == 203);
    for (int32_t id : ids) CHECK(id < 256);
    SampleOptions all = options;
    all.vocab = 0;  // at temperature 2 some of the 200 draws land in 256..299
    Generator gen_all(7);
    const std::vector<int32_t> unlimited = generate(*model, {1, 2, 3}, all, gen_all);
    CHECK(*std::max_element(unlimited.begin(), unlimited.end()) >= 256);
    SampleOptions negative = options;
    negative.vocab = -1;
    CHECK(throws_with([&] { check_sample_options(negative); }, {"vocabulary limit", "-1"}));
}

TEST_CASE("qknorm train --init-from, then sample and export --hf: the program as a user runs it") {
    TempDir dir("fine_tune_cli");
    const std::string corpus = write_corpus(dir), run = dir / "run", out = dir / "exported";
    require_ok(
        run_program({qknorm_program(), "train", "--init-from", fixture("olmo2"), "--data", corpus,
                     "--steps", "6", "--batch-size", "4", "--context", "24", "--precision", "fp32",
                     "--sample-tokens", "0", "--quiet", "--run-dir", run},
                    {}, 120));
    const TrainConfig saved = load_run_config(run);
    CHECK(saved.tokenizer == "byte");  // the defaults with --init-from
    CHECK(saved.lr_schedule == "cosine");
    CHECK(saved.lr == doctest::Approx(5e-5));
    CHECK(saved.init_from == fixture("olmo2"));
    require_ok(run_program({qknorm_program(), "sample", "--run-dir", run, "--tokens", "20"}));
    const Outcome exported =
        run_program({qknorm_program(), "export", "--hf", out, "--run-dir", run});
    require_ok(exported);
    CHECK(exported.output.find("Olmo2ForCausalLM") != std::string::npos);
    // The same architecture as the directory it came from, and the fine-tuned weights.
    CHECK(first_difference(read_hf_config(out + "/config.json").config,
                           read_hf_config(fixture("olmo2") + "/config.json").config) == "");
    std::unique_ptr<GPT> back = load_hf_model(out);
    LoadedModel trained = load_model(latest_model_checkpoint(run));
    check_same_parameters(*back, *trained.model);
}

TEST_CASE("qknorm train --init-from refuses what it cannot honour, by name") {
    TempDir dir("fine_tune_refused");
    const std::string corpus = write_corpus(dir);
    auto train_from = [&](const std::string& from, std::vector<std::string> more) {
        std::vector<std::string> args = {qknorm_program(), "train",     "--init-from", from,
                                         "--data",         corpus,      "--steps",     "2",
                                         "--quiet",        "--run-dir", dir / "run"};
        args.insert(args.end(), more.begin(), more.end());
        return run_program(args);
    };
    const auto refused = [](const Outcome& out, int code, const std::string& says) {
        INFO(out.output);
        CHECK(out.exit_code == code);
        CHECK(out.output.find(says) != std::string::npos);
    };
    refused(train_from(fixture("qwen3"), {"--n-layer", "2"}), 2,
            "--n-layer cannot be combined with it");
    refused(train_from(fixture("qwen3"), {"--qk-norm", "none"}), 2,
            "--qk-norm cannot be combined with it");
    refused(train_from(fixture("qwen3"), {"--context", "65"}), 2, "--context must be in [0, 64]");
    refused(train_from(dir / "nowhere", {}), 2, "nowhere");
    refused(train_from(dir.path.string(), {}), 1, "config.json");  // a directory, not a model
    refused(run_program({qknorm_program(), "train", "--resume", dir / "run", "--init-from",
                         fixture("qwen3")}),
            2, "--init-from cannot be combined with it");
    // An embedding of 100 rows cannot take the 256 byte ids.
    GPTConfig small;
    small.vocab_size = 100, small.n_layer = 1, small.n_head = 2, small.n_embd = 16;
    small.block_size = 32, small.bias = false, small.norm = NormKind::rmsnorm;
    small.pos_emb = PosEmb::rope, small.mlp = MLPKind::swiglu, small.qk_norm = QKNorm::rmsnorm;
    small.norm_eps = 1e-6;
    GPT model(small, 0);
    save_hf_model(model, dir / "small");
    refused(train_from(dir / "small", {}), 1, "has 256 ids, more than the 100");
    // Refused after its run directory was made: the directory goes too (none was left empty).
    CHECK(!std::filesystem::exists(dir / "run"));
    // The char tokenizer's 30-odd symbols fit it.
    require_ok(train_from(dir / "small", {"--tokenizer", "char", "--context", "16", "--batch-size",
                                          "4", "--sample-tokens", "5"}));
    // Fine-tuning's defaults where no flag was given (pre-training's lr of 4.5e-3 would wreck a
    // trained model); the flags given (--steps 2, --batch-size 4) stay.
    const auto config = nlohmann::json::parse(read_file(dir / "run/config.json"));
    CHECK(config["lr"] == 5e-5);
    CHECK(config["lr_min"] == 5e-6);
    CHECK(config["warmup"] == 0);  // a tenth of the 2 steps
    CHECK(config["steps"] == 2);
    CHECK(config["batch_size"] == 4);
}

TEST_CASE("fine-tuning on the CUDA backend follows the cpu (Gemma 3: sliding layers, GQA)") {
    if (!cuda_runnable()) return;
    TempDir dir("fine_tune_cuda");
    TrainConfig cfg = fine_tune_run(dir, fixture("gemma3"), "cpu");
    cfg.batch_size = 2, cfg.context = 20, cfg.steps = 3, cfg.eval_every = 3, cfg.eval_batches = 1;
    cfg.stats_every = 1, cfg.sample_tokens = 0;
    cfg.model.precision = Precision::full;
    TrainConfig on_cuda = cfg;
    on_cuda.run_dir = dir / "cuda", on_cuda.device = "cuda";
    const TrainResult a = train(cfg), b = train(on_cuda);
    REQUIRE((!a.diverged && !b.diverged && b.steps_done == 3));
    const std::vector<json> la = step_lines(cfg.run_dir), lb = step_lines(on_cuda.run_dir);
    REQUIRE(la.size() == 3);
    REQUIRE(lb.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(lb[i]["loss"].get<double>() == doctest::Approx(la[i]["loss"]).epsilon(1e-5));
        for (size_t layer = 0; layer < la[i]["layers"].size(); ++layer)
            CHECK(lb[i]["layers"][layer]["max_logit"].get<double>() ==
                  doctest::Approx(la[i]["layers"][layer]["max_logit"]).epsilon(1e-4));
    }
}

// The path a newcomer takes, chained as issue reports walked it: train a Qwen3-shaped model on
// bytes, sample from the run, export it with its tokenizer, inspect and sample the exported
// directory, fine-tune it, sample the fine-tuned run, export that, and read it back with the same
// ids and weights. Each step through the qknorm program; transformers' side of the export (the
// same ids from AutoTokenizer, the same logits from from_pretrained) is tools/check_hf_export.py's.
TEST_CASE("the newcomer's path: train, sample, export, inspect, sample, fine-tune, export again") {
    TempDir dir("newcomer_path");
    const std::string corpus = write_corpus(dir), run = dir / "run", hf = dir / "hf";
    auto qknorm = [](std::vector<std::string> args) {
        args.insert(args.begin(), qknorm_program());
        const Outcome out = run_program(args, {}, 120);
        INFO(out.output);
        REQUIRE(out.exit_code == 0);
        return out.output;
    };
    qknorm({"train",     "--data",
            corpus,      "--tokenizer",
            "byte",      "--norm",
            "rmsnorm",   "--qk-norm",
            "rmsnorm",   "--pos-emb",
            "rope",      "--mlp",
            "swiglu",    "--bias",
            "false",     "--n-kv-head",
            "1",         "--n-layer",
            "1",         "--n-head",
            "2",         "--n-embd",
            "16",        "--block-size",
            "32",        "--steps",
            "3",         "--batch-size",
            "2",         "--sample-tokens",
            "0",         "--quiet",
            "--run-dir", run});
    CHECK(qknorm({"sample", "--run-dir", run, "--prompt", "to", "--tokens", "5"}).rfind("to", 0) ==
          0);
    CHECK(qknorm({"export", "--run-dir", run, "--hf", hf}).find("tokenizer.json") !=
          std::string::npos);
    CHECK(qknorm({"inspect", "--model", hf, "--text", corpus, "--out", dir / "inspect.svg"})
              .find("loss") != std::string::npos);
    const std::string from_hf = qknorm({"sample", "--model", hf, "--prompt", "to", "--tokens", "5",
                                        "--temperature", "0"}),
                      from_run = qknorm({"sample", "--run-dir", run, "--prompt", "to", "--tokens",
                                         "5", "--temperature", "0"});
    CHECK(from_hf == from_run);  // the exported model and its tokenizer are the run's
    const std::string tuned = dir / "tuned", tuned_hf = dir / "tuned_hf";
    qknorm({"train", "--init-from", hf, "--data", corpus, "--steps", "2", "--batch-size", "2",
            "--context", "16", "--sample-tokens", "0", "--quiet", "--run-dir", tuned});
    qknorm({"sample", "--run-dir", tuned, "--prompt", "to", "--tokens", "5"});
    qknorm({"export", "--run-dir", tuned, "--hf", tuned_hf});
    const LoadedModel trained = load_model(latest_model_checkpoint(tuned));
    check_same_parameters(*load_hf_model(tuned_hf), *trained.model);
    const std::string text = "to be or not";
    CHECK((Tokenizer::from_file(tokenizer_file_in(tuned_hf)).encode(text) ==
           trained.tokenizer.encode(text)));
}
