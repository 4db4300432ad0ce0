// The qknorm program as a user meets it: every bad flag, file and config gives one line
// `qknorm: <what>: <why>` and exit status 1 (an error) or 2 (usage), never an abort, a hang or a
// silent default. The program is run as a child process (its path comes from meson, QKNORM) with
// a deadline, so that a regression that hangs fails the test instead of CI.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/safetensors.h"
#include "helpers.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"
#include "run_program.h"

using namespace qk;
using namespace qk::test;

namespace {

// Runs qknorm (its path comes from meson, QKNORM) with args; see run_program.
Outcome run_qknorm(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                   int seconds = 60) {
    std::vector<std::string> argv{qknorm_program()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, env, seconds);
}

// The smallest model the program trains in a second or two; flags in `more` replace these.
std::vector<std::string> tiny(const TempDir& dir, std::vector<std::string> more = {}) {
    const std::vector<std::pair<std::string, std::string>> defaults{
        {"--n-layer", "1"},       {"--n-embd", "16"},    {"--n-head", "2"},
        {"--block-size", "16"},   {"--batch-size", "2"}, {"--eval-batches", "1"},
        {"--sample-tokens", "0"}, {"--warmup", "1"},     {"--data", write_corpus(dir)}};
    std::vector<std::string> args{"train", "--quiet"};
    for (const auto& [flag, value] : defaults)
        if (std::find(more.begin(), more.end(), flag) == more.end())
            args.insert(args.end(), {flag, value});
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

// The outcome is exit `code` with one line naming every fragment.
void check_refused(const Outcome& out, int code, std::initializer_list<std::string> fragments) {
    CAPTURE(out.output);
    CHECK(!out.timed_out);
    CHECK(out.exit_code == code);
    for (const std::string& f : fragments) CHECK(out.output.find(f) != std::string::npos);
}

}  // namespace

TEST_CASE("every numeric flag is checked where it enters, naming the flag, value and range") {
    TempDir dir("cli_flags");
    struct Case {
        std::vector<std::string> flags;
        std::vector<std::string> fragments;
    };
    const std::vector<Case> cases{
        {{"--lr", "-0.003"}, {"--lr", "-0.003", "> 0"}},
        {{"--lr", "nan"}, {"--lr", "nan", "finite"}},
        {{"--beta1", "2"}, {"--beta1", "2", "[0, 1)"}},
        {{"--weight-decay", "-1"}, {"--weight-decay", "-1", ">= 0"}},
        {{"--warmup", "-10"}, {"--warmup", "-10"}},
        {{"--grad-clip", "-1"}, {"--grad-clip", "-1"}},
        {{"--lr", "0.001", "--lr-min", "0.01"}, {"--lr-min", "0.01", "[0, --lr]"}},
        {{"--seed", "-1"}, {"--seed", "'-1'", "whole number"}},
        {{"--steps", "99999999999999999999"}, {"--steps", "99999999999999999999"}},
        {{"--steps", "2.5"}, {"--steps", "2.5", "whole number"}},
        {{"--logit-softcap", "inf"}, {"--logit-softcap", "inf", "[0.1, 1e+06]"}},
        {{"--logit-softcap", "1e-300"}, {"--logit-softcap", "1e-300", "[0.1, 1e+06]"}},
        {{"--attn-softcap", "1e-300"}, {"--attn-softcap", "1e-300", "[0.1, 1e+06]"}},
        {{"--z-loss", "inf"}, {"--z-loss", "inf", "[0, 1]"}},
        {{"--z-loss", "1e300"}, {"--z-loss", "1e+300", "[0, 1]"}},
        {{"--pos-emb", "learned", "--rope-theta", "nan"}, {"--rope-theta", "nan"}},  // unused
        {{"--qk-scale-init", "nan"}, {"--qk-scale-init", "nan"}},  // qk_norm layernorm: unused
        {{"--data", ""}, {"--data", "empty path"}},
        {{"--attn-softcap", "nan"}, {"--attn-softcap", "nan"}},
        {{"--n-layer", "1000000000"}, {"--n-layer", "1000000000", "[1, 1024]"}},
        {{"--dropout", "1"}, {"--dropout", "[0, 1)"}},
        {{"--diverge-factor", "0.5"}, {"--diverge-factor", "0.5"}},
        {{"--eval-every", "-1"}, {"--eval-every", "-1"}},  // 0 is auto
        {{"--qk-norm", "l2", "--qk-scale-init", "-3"}, {"--qk-scale-init", "-3"}},
        {{"--sample-tokens", "1000000000"}, {"--sample-tokens", "1000000000"}},
        {{"--tf32", "true"}, {"--tf32", "--device cuda", "--device cpu"}},
        {{"--precision", "fp4"}, {"--precision", "fp4", "fp32", "bf16", "fp16"}},
        {{"--precision", "fp16", "--loss-scale", "0"}, {"--loss-scale", "0", "[2^-24, 2^64]"}},
        {{"--precision", "fp16", "--loss-scale", "1e-40"}, {"--loss-scale", "1e-40", "[2^-24"}},
        {{"--precision", "fp16", "--loss-scale", "inf"}, {"--loss-scale", "inf"}},
        {{"--loss-scale-interval", "0"}, {"--loss-scale-interval", "0"}},
        {{"--pos-emb", "alibi"}, {"--pos-emb", "alibi", "learned", "rope"}},
        {{"--pos-emb", "rope", "--rope-theta", "0"}, {"rope_theta", "--rope-theta", "0"}},
        {{"--pos-emb", "learned", "--qk-norm-order", "after_rope"}, {"after_rope", "rope"}},
        {{"--pos-emb", "rope", "--n-embd", "18", "--n-head", "6"}, {"rope", "even", "18 / 6"}},
        {{"--optimizer", "sgd"}, {"--optimizer", "sgd", "adamw", "muon"}},
        {{"--muon-momentum", "1"}, {"--muon-momentum", "1", "[0, 1)"}},
        {{"--qk-clip", "-5", "--qk-norm", "none"}, {"--qk-clip", "-5", "> 0"}},
        {{"--qk-clip", "100"}, {"--qk-clip", "--qk-norm none", "layernorm"}},
        {{"--optimizer", "muon", "--zero", "1"}, {"--optimizer muon", "--zero 1"}},
        // One rule: a flag that does nothing in the run it describes is refused by name.
        {{"--loss-scale", "1024"}, {"--loss-scale", "does nothing", "--precision bf16"}},
        {{"--precision", "fp32", "--loss-scale-interval", "10"},
         {"--loss-scale-interval", "does nothing", "--precision fp32"}},
        {{"--image-size", "8"}, {"--image-size", "does nothing", "--image-fraction is 0"}},
        {{"--image-entropy", "4"}, {"--image-entropy", "does nothing"}},
        {{"--image-codes", "32"}, {"--image-codes", "does nothing", "--modality-signals"}},
        {{"--muon-momentum", "0.9"}, {"--muon-momentum", "does nothing", "adamw"}},
        {{"--lr-schedule", "cosine", "--cooldown", "0.5"},
         {"--cooldown", "does nothing", "--lr-schedule is cosine"}},
        {{"--lp-p", "3"}, {"--lp-p", "does nothing", "--qk-norm layernorm"}},
        {{"--qk-scale-per-head", "true"}, {"--qk-scale-per-head", "does nothing"}},
        {{"--qk-norm", "none", "--qk-norm-scope", "full"}, {"--qk-norm-scope", "does nothing"}},
        {{"--pos-emb", "learned", "--rope-theta", "500"}, {"--rope-theta", "does nothing"}},
        {{"--rope-local-theta", "500"}, {"--rope-local-theta", "does nothing", "--sliding-window"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.flags[0]);
        const Outcome out = run_qknorm(tiny(dir, c.flags), {}, 20);
        CAPTURE(out.output);
        CHECK(out.exit_code == 2);
        for (const std::string& f : c.fragments) CHECK(out.output.find(f) != std::string::npos);
    }
}

TEST_CASE("thread counts past the bound are refused, from the flag and from the environment") {
    TempDir dir("cli_threads");
    check_refused(run_qknorm({"--threads", "100000", "train"}, {}, 20), 2, {"--threads", "100000"});
    check_refused(run_qknorm(tiny(dir), {"QK_NUM_THREADS=100000"}, 20), 2,
                  {"QK_NUM_THREADS", "100000", "[1, 1024]"});
    check_refused(run_qknorm(tiny(dir), {"QK_NUM_THREADS=two"}, 20), 2, {"QK_NUM_THREADS", "two"});
}

TEST_CASE("paths of the wrong kind are named: a file as a directory, a directory as data") {
    TempDir dir("cli_paths");
    const std::string file = dir / "a_file";
    std::ofstream(file) << "x";
    check_refused(run_qknorm(tiny(dir, {"--steps", "1", "--run-dir", file})), 1,
                  {"qknorm: train: --run-dir", file, "is a file"});
    check_refused(run_qknorm({"sample", "--run", file}), 1, {"qknorm: sample:", file});
    check_refused(run_qknorm({"sweep", "--out", file, "--steps", "1", "--lrs", "0.01", "--variants",
                              "baseline"}),
                  2, {"qknorm: sweep: --out", file, "is a file"});
    // A directory of shards without --tokenizer: a usage error (2), found before the header.
    check_refused(run_qknorm({"train", "--data", dir.path.string(), "--run-dir", dir / "r1"}), 2,
                  {"--data", dir.path.string(), "is a directory"});
    CHECK(!std::filesystem::exists(dir / "r1"));
    const std::string empty = dir / "empty.txt";
    std::ofstream(empty).flush();
    check_refused(run_qknorm({"train", "--data", empty, "--run-dir", dir / "r2"}), 1,
                  {"--data", empty, "is empty"});
    check_refused(run_qknorm({"train", "--resume", file}), 1, {"resume", file});
    // A file in the way of a directory further down, in words rather than the library's
    // "filesystem error: cannot create directories: Not a directory [a_file/r]".
    const Outcome below = run_qknorm(tiny(dir, {"--steps", "1", "--run-dir", file + "/r"}));
    check_refused(
        below, 1,
        {file + "/r", "cannot create directories", "not a directory", "a file is in the way"});
    CHECK(below.output.find("filesystem error") == std::string::npos);
    check_refused(run_qknorm({"prepare", "--tokenizer", "byte", "--out", file + "/shards",
                              write_corpus(dir)}),
                  1, {"a file is in the way"});
    // A run whose config.json lost a key: named, without the JSON library's error code.
    const std::string run = dir / "run";
    test::require_ok(run_qknorm(tiny(dir, {"--steps", "1", "--run-dir", run})));
    std::string config = read_file(run + "/config.json");
    config.replace(config.find("\"model\""), 7, "\"mdl\"");
    std::ofstream(run + "/config.json") << config;
    const Outcome resumed = run_qknorm({"train", "--resume", run});
    check_refused(resumed, 1, {"key 'model' not found"});
    CHECK(resumed.output.find("json.exception") == std::string::npos);
    check_refused(run_qknorm({"sweep", "--jobs", "0"}), 2, {"--jobs", "0"});
    check_refused(run_qknorm({"sweep", "--variants", "lp:p=inf", "--lrs", "0.01"}), 2,
                  {"lp:p=inf", "inf"});
}

TEST_CASE("a config file: a regular file in TOML, every key a flag, every value of its type") {
    TempDir dir("cli_config");
    auto config = [&](const std::string& name, const std::string& text) {
        std::ofstream(dir / name) << text;
        return dir / name;
    };
    const std::string unclosed = config("unclosed.toml", "[sweep]\nlrs = [1e-3, 3e-3\nsteps = 5\n");
    check_refused(run_qknorm({"sweep", "--config", unclosed}), 2, {unclosed + ":3:"});
    const std::string fifo = dir / "fifo.toml";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    check_refused(run_qknorm({"sweep", "--config", fifo}, {}, 20), 2, {fifo});
    // Each refusal names the place, the key, what it holds and what the flag takes.
    const std::string text = config("text.toml", "[sweep]\njobs = 1\nsteps = \"5\"\n");
    check_refused(
        run_qknorm({"sweep", "--config", text}), 2,
        {text + ":3:1", "'steps' in [sweep] is a string (5)", "--steps takes an integer"});
    const std::string unknown = config("unknown.toml", "[sweep]\nstpes = 5\n");
    check_refused(run_qknorm({"sweep", "--config", unknown}), 2,
                  {unknown + ":2:1", "unknown key 'stpes' in [sweep]", "steps"});
    const std::string scalar = config("scalar.toml", "[sweep]\nlrs = 0.01\n");
    check_refused(run_qknorm({"sweep", "--config", scalar}), 2,
                  {scalar + ":2:1", "is a number (0.01)", "--lrs takes a number array"});
    const std::string flag = config("flag.toml", "[sweep]\nbias = \"no\"\n");
    check_refused(run_qknorm({"sweep", "--config", flag}), 2, {"--bias takes a boolean"});
    const std::string section = config("section.toml", "[swep]\nsteps = 5\n");
    check_refused(run_qknorm({"sweep", "--config", section}), 2,
                  {section + ":2:1", "[swep] is not a command"});
    const std::string nested = config("nested.toml", "[sweep]\nmodel.n_layer = 2\n");
    check_refused(run_qknorm({"sweep", "--config", nested}), 2,
                  {nested + ":2:1", "one level deep"});
    // A good file's values reach the flags: a whole tiny sweep from it.
    const std::string good =
        config("good.toml",
               "[sweep]\nvariants = [\"baseline\"]\nlrs = [0.01]\nseeds = [3]\nsteps = 2\n"
               "n-layer = 1\nn-embd = 16\nn-head = 2\nblock-size = 16\nbatch-size = 4\n"
               "eval-batches = 1\nbias = false\nout = \"" +
                   dir / "sweep" + "\"\n");
    const Outcome swept = run_qknorm({"sweep", "--config", good, "--data", write_corpus(dir)});
    CAPTURE(swept.output);
    CHECK(swept.exit_code == 0);
    CHECK(swept.output.find("1 variants x 1 learning rates x 1 seeds") != std::string::npos);
    CHECK(swept.output.find("L=1 C=16 T=16 B=4 steps 2") != std::string::npos);
    // Every committed experiment passes: the run then stops at --jobs 0, given on the command line
    // (which wins over the file), not at the file.
    for (const auto& e : std::filesystem::directory_iterator(QK_SOURCE_DIR "/examples/stability")) {
        if (e.path().extension() != ".toml") continue;
        const Outcome out = run_qknorm({"sweep", "--config", e.path().string(), "--jobs", "0"});
        CAPTURE(out.output);
        CHECK(out.exit_code == 2);
        CHECK(out.output.find("--jobs") != std::string::npos);
        CHECK(out.output.find(e.path().string()) == std::string::npos);
    }
}

TEST_CASE("--preset: its settings become the defaults, flags and --config win, --help shows them") {
    TempDir dir("cli_preset");
    const std::string preset_toml = read_file(QK_SOURCE_DIR "/examples/presets/speedrun.toml");
    // What the preset adds to the default run (the rest of it is the default today).
    CHECK(preset_toml.find("eval-protocol = \"nanogpt\"") != std::string::npos);
    // The tiny model's flags win over the preset's model; the preset's measure stays (the tiny
    // model given the 256 tokens of context it needs).
    const std::string run = dir / "run";
    const Outcome trained = run_qknorm(tiny(
        dir, {"--preset", "speedrun", "--block-size", "256", "--steps", "2", "--run-dir", run}));
    CAPTURE(trained.output);
    REQUIRE(trained.exit_code == 0);
    const nn::TrainConfig saved = nn::load_run_config(run);
    CHECK(saved.eval_protocol == "nanogpt");
    CHECK(saved.model.n_embd == 16);
    CHECK(saved.batch_size == 2);
    CHECK(saved.steps == 2);
    // --help lists the preset's values as the defaults.
    const Outcome help = run_qknorm({"train", "--preset", "speedrun", "--help"});
    CHECK(help.exit_code == 0);
    CHECK(help.output.find("=nanogpt") != std::string::npos);
    CHECK(run_qknorm({"train", "--help"}).output.find("=nanogpt") == std::string::npos);
    // A --config file wins over the preset too.
    const std::string own_measure = dir / "own_measure.toml";
    std::ofstream(own_measure) << "[train]\neval-protocol = \"qknorm\"\n";
    const std::string run2 = dir / "run2";
    const Outcome configured = run_qknorm(tiny(
        dir, {"--preset", "speedrun", "--config", own_measure, "--steps", "1", "--run-dir", run2}));
    CAPTURE(configured.output);
    REQUIRE(configured.exit_code == 0);
    CHECK(nn::load_run_config(run2).eval_protocol == "qknorm");
    // Every file of examples/presets/ is compiled in (meson.build lists them).
    for (const auto& e : std::filesystem::directory_iterator(QK_SOURCE_DIR "/examples/presets")) {
        CAPTURE(e.path());
        CHECK(run_qknorm({"train", "--preset", e.path().stem().string(), "--help"}).exit_code == 0);
    }
    check_refused(run_qknorm({"train", "--preset", "speedrn"}), 2,
                  {"--preset 'speedrn' is not a preset", "speedrun"});
    check_refused(run_qknorm({"train", "--resume", run, "--preset", "speedrun"}), 2,
                  {"--resume", "--preset"});
}

TEST_CASE("experiment 9's config runs end to end, two steps a run; a mixed model samples") {
    TempDir dir("cli_exp9");
    const std::string out = dir / "exp9";
    const Outcome swept = run_qknorm({"sweep",
                                      "--config",
                                      QK_SOURCE_DIR "/examples/stability/exp9_modalities.toml",
                                      "--steps",
                                      "2",
                                      "--warmup",
                                      "1",
                                      "--n-layer",
                                      "1",
                                      "--n-embd",
                                      "16",
                                      "--n-head",
                                      "2",
                                      "--block-size",
                                      "16",
                                      "--batch-size",
                                      "4",
                                      "--eval-batches",
                                      "1",
                                      "--lrs",
                                      "0.01",
                                      "--seeds",
                                      "1",
                                      "--out",
                                      out,
                                      "--data",
                                      write_corpus(dir)},
                                     {},
                                     // 24 runs: 38 s alone under ASan here, past the default 60
                                     // when other suites share the cores. A hang guard, no more.
                                     240);
    CAPTURE(swept.output);
    REQUIRE(swept.exit_code == 0);
    CHECK(swept.output.find("24 variants x 1 learning rates x 1 seeds") != std::string::npos);
    // The mixed post-norm run's model samples images and text through its mixed tokenizer.
    const Outcome sampled = run_qknorm(
        {"sample", "--run-dir", out + "/runs/baseline_place-post_img-0.5_ient-5__lr0.01__s1",
         "--prompt", "a[BOI]", "--tokens", "40"});
    CAPTURE(sampled.output);
    CHECK(sampled.exit_code == 0);
    CHECK(sampled.output.rfind("a[BOI]", 0) == 0);  // "[BOI]" alone: a CLI11 list
}

TEST_CASE("sample: options checked, tokens streamed, non-finite logits refused") {
    TempDir dir("cli_sample");
    const std::string run = dir / "run";
    REQUIRE(run_qknorm(tiny(dir, {"--steps", "2", "--run-dir", run})).exit_code == 0);
    check_refused(run_qknorm({"sample", "--run-dir", run, "--temperature", "nan"}), 2,
                  {"--temperature", "nan"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--tokens", "1000000000"}), 2,
                  {"--tokens", "1000000000"});
    const Outcome ok = run_qknorm({"sample", "--run", run, "--prompt", "All:", "--tokens", "12"});
    CAPTURE(ok.output);
    CHECK(ok.exit_code == 0);
    CHECK(ok.output.size() == 4 + 12 + 1);  // the prompt, 12 characters, a final newline
    CHECK(ok.output.rfind("All:", 0) == 0);
    // Brackets and commas are text: CLI11 once read "[Go, hie]" as two prompts, "Go" and " hie",
    // which this vocabulary holds; verbatim, its '[' is refused by name.
    check_refused(run_qknorm({"sample", "--run", run, "--prompt", "[Go, hie]", "--tokens", "2"}), 1,
                  {"character '['", "position 0"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--top-p", "0"}), 2,
                  {"--top-p must be in (0, 1]", "0"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--min-p", "1"}), 2, {"--min-p"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--repetition-penalty", "-2"}), 2,
                  {"--repetition-penalty"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--stop", ""}), 2,
                  {"--stop", "empty stop string"});
    check_refused(run_qknorm({"sample", "--run-dir", run, "--when-full", "wrap"}), 2,
                  {"--when-full", "wrap"});
    // The tiny model's context is 16 characters: of a longer prompt it sees the last 16, and
    // says so; at its end, --when-full stop says why the text is shorter than asked.
    const Outcome long_prompt =
        run_qknorm({"sample", "--run-dir", run, "--prompt", std::string(17, 'a'), "--tokens", "3"});
    CAPTURE(long_prompt.output);
    CHECK(long_prompt.exit_code == 0);
    CHECK(long_prompt.output.find("a --prompt of 17 tokens is longer than the model's context "
                                  "of 16: its last 16 are kept") != std::string::npos);
    const Outcome full = run_qknorm({"sample", "--run-dir", run, "--prompt", "All: the kin",
                                     "--tokens", "10", "--when-full", "stop"});
    CAPTURE(full.output);
    CHECK(full.exit_code == 0);
    CHECK(full.output.find("context of 16 tokens is full after 5 of the 10 tokens asked "
                           "(--when-full stop") != std::string::npos);
    // Several texts decode together and print at the end, with a bar on stderr meanwhile.
    const Outcome several = run_qknorm(
        {"sample", "--run-dir", run, "--prompt", "All:", "--prompt", "a", "--tokens", "8"});
    CAPTURE(several.output);
    CHECK(several.output.find("100% sampling 2 texts 8/8") != std::string::npos);
    CHECK(several.output.find("--- sample 2 (seed 1) ---\na") != std::string::npos);
    // Every character is a stop string: it stops after the first one; the filters all at once.
    const Outcome stopped =
        run_qknorm({"sample", "--run-dir",   run,    "--prompt", "All:", "--tokens",
                    "40",     "--top-p",     "0.9",  "--min-p",  "0.05", "--repetition-penalty",
                    "1.3",    "--when-full", "stop", "--stop",   "a",    "--stop",
                    "e",      "--stop",      " ",    "--stop",   "\n",   "--stop",
                    "t",      "--stop",      "s"});
    CAPTURE(stopped.output);
    CHECK(stopped.exit_code == 0);
    CHECK(stopped.output.size() < 4 + 40 + 1);
    // A stop string spanning two tokens (every token is one character here): greedy decoding is
    // repeatable, so the run stops right where that pair of characters first appeared before.
    const Outcome greedy = run_qknorm(
        {"sample", "--run-dir", run, "--prompt", "All:", "--tokens", "20", "--temperature", "0"});
    REQUIRE(greedy.output.size() == 4 + 20 + 1);
    const std::string drawn = greedy.output.substr(4, 20), pair = drawn.substr(5, 2);
    const Outcome paired = run_qknorm({"sample", "--run-dir", run, "--prompt", "All:", "--tokens",
                                       "20", "--temperature", "0", "--stop", pair});
    CAPTURE(paired.output);
    CHECK(paired.output == "All:" + drawn.substr(0, drawn.find(pair) + 2) + "\n");

    // A NaN in one weight: sampling must stop with an error, not print a plausible text.
    const std::string ckpt = nn::latest_model_checkpoint(run);
    SafetensorsFile file = load_safetensors(ckpt);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (auto& [name, t] : file.tensors) {
        Tensor copy = t.contiguous().clone();
        if (name == "transformer.h.0.attn.c_attn.weight") copy.data<float>()[5] = NAN;
        tensors.emplace_back(name, copy);
    }
    const std::string broken = dir / "broken.safetensors";
    save_safetensors(broken, tensors, file.metadata);
    check_refused(run_qknorm({"sample", "--ckpt", broken, "--tokens", "5"}), 1, {"not finite"});
}

TEST_CASE("sample takes --run-dir as train does, --run as its alias; the text ends in a newline") {
    TempDir dir("cli_sample_run_dir");
    const std::string run = dir / "run";
    REQUIRE(run_qknorm(tiny(dir, {"--steps", "2", "--run-dir", run})).exit_code == 0);
    auto sample = [&](const char* flag) {
        return run_qknorm(
            {"sample", flag, run, "--prompt", "All:", "--tokens", "9", "--seed", "5"});
    };
    const Outcome by_dir = sample("--run-dir"), by_alias = sample("--run");
    CAPTURE(by_dir.output);
    CAPTURE(by_alias.output);
    CHECK(by_dir.exit_code == 0);
    CHECK(by_alias.exit_code == 0);
    REQUIRE(by_dir.output.size() == 4 + 9 + 1);
    CHECK(by_dir.output.back() == '\n');
    CHECK(by_dir.output == by_alias.output);  // the same run, the same seed: the same text
    const Outcome help = run_qknorm({"sample", "--help"});
    CHECK(help.output.find("--run-dir") != std::string::npos);
    check_refused(run_qknorm({"sample", "--run-dir", dir / "none"}), 1,
                  {"qknorm: sample: --run-dir", "none"});
}

TEST_CASE("sample: several prompts and samples decode together; bf16-stored weights") {
    TempDir dir("cli_sample_batch");
    const std::string run = dir / "run";
    REQUIRE(run_qknorm(tiny(dir, {"--steps", "2", "--run-dir", run})).exit_code == 0);
    auto sample = [&](std::vector<std::string> more) {
        std::vector<std::string> args{"sample", "--run", run, "--tokens", "7"};
        args.insert(args.end(), more.begin(), more.end());
        return run_qknorm(args);
    };
    // Two prompts, two samples each: four texts, sample i drawn with seed 3 + i. The fourth
    // (prompt "Be", seed 6) is what that prompt gives alone with --seed 6.
    const Outcome batch =
        sample({"--prompt", "All:", "--prompt", "Be", "--num-samples", "2", "--seed", "3"});
    CAPTURE(batch.output);
    REQUIRE(batch.exit_code == 0);
    CHECK(batch.output.find("--- sample 4 (seed 6) ---\nBe") != std::string::npos);
    const Outcome alone = sample({"--prompt", "Be", "--seed", "6"});
    REQUIRE(alone.exit_code == 0);
    CHECK(batch.output.find(alone.output) != std::string::npos);  // "Be" + 7 tokens + "\n"
    const Outcome bf16 = sample({"--prompt", "All:", "--precision", "bf16"});
    CAPTURE(bf16.output);
    CHECK(bf16.exit_code == 0);
    CHECK(bf16.output.size() == 4 + 7 + 1);
    check_refused(sample({"--num-samples", "0"}), 2, {"--num-samples"});
    const Outcome fp16 = sample({"--prompt", "All:", "--precision", "fp16"});
    CHECK(fp16.exit_code == 0);
    CHECK(fp16.output.size() == 4 + 7 + 1);
    check_refused(sample({"--precision", "fp8"}), 2, {"--precision", "fp8"});
}

TEST_CASE("--pos-emb rope: no wpe in the checkpoint, the switch in its metadata, and it samples") {
    TempDir dir("cli_rope");
    const std::string run = dir / "run";
    const Outcome trained = run_qknorm(tiny(dir, {"--steps", "3", "--run-dir", run, "--pos-emb",
                                                  "rope", "--qk-norm-order", "after_rope"}));
    CAPTURE(trained.output);
    REQUIRE(trained.exit_code == 0);
    SafetensorsFile file = load_safetensors(nn::latest_model_checkpoint(run));
    bool has_wpe = false;
    for (const auto& [name, t] : file.tensors)
        has_wpe = has_wpe || name == "transformer.wpe.weight";
    CHECK(!has_wpe);
    CHECK(file.metadata.at("pos_emb") == "rope");
    CHECK(file.metadata.at("qk_norm_order") == "after_rope");
    CHECK(file.metadata.at("rope_theta") == "10000");
    const Outcome sampled =
        run_qknorm({"sample", "--run", run, "--prompt", "All:", "--tokens", "20"});
    CAPTURE(sampled.output);
    CHECK(sampled.exit_code == 0);
    CHECK(sampled.output.size() == 4 + 20 + 1);
}

TEST_CASE("--optimizer muon --qk-clip: recorded in config.json, clips reported, and it resumes") {
    TempDir dir("cli_muon");
    const std::string run = dir / "run";
    const Outcome trained =
        run_qknorm(tiny(dir, {"--steps", "4", "--run-dir", run, "--optimizer", "muon", "--qk-norm",
                              "none", "--qk-clip", "0.01", "--checkpoint-every", "2"}));
    CAPTURE(trained.output);
    REQUIRE(trained.exit_code == 0);
    const nn::TrainConfig saved = nn::load_run_config(run);
    CHECK(saved.optimizer == "muon");
    CHECK(saved.qk_clip == 0.01);
    CHECK(read_file(run + "/metrics.jsonl").find("\"heads_clipped\":") != std::string::npos);
    SafetensorsFile state = load_safetensors(run + "/step-000004.state.safetensors");
    CHECK(state.contains("muon_momentum.transformer.h.0.mlp.c_fc.weight"));
    CHECK(!state.contains("exp_avg.transformer.h.0.mlp.c_fc.weight"));
    CHECK(state.contains("exp_avg.transformer.wte.weight"));
}

TEST_CASE("a diverging run exits with status 3 and says why") {
    TempDir dir("cli_diverge");
    check_refused(run_qknorm(tiny(dir, {"--steps", "20", "--lr", "1e6", "--run-dir", dir / "r"})),
                  3, {"diverged", "--diverge-factor"});
}

TEST_CASE("free text is taken verbatim: a special token in brackets stays in its brackets") {
    // CLI11 read "[PAD]" as the list {"PAD"}: the tokenizer got a token PAD.
    TempDir dir("cli_verbatim");
    const std::string corpus = write_corpus(dir), out = dir / "tokenizer.json";
    const Outcome trained =
        run_qknorm({"tokenizer", "train", "--vocab-size", "300", "--special", "[PAD]", "--special",
                    "<a,b>", "--out", out, "--quiet", corpus});
    CAPTURE(trained.output);
    REQUIRE(trained.exit_code == 0);
    const std::string json = read_file(out);
    CHECK(json.find("\"[PAD]\"") != std::string::npos);
    CHECK(json.find("\"<a,b>\"") != std::string::npos);
    // --out is checked before anything is learned (`--out /` failed after the whole training).
    check_refused(run_qknorm({"tokenizer", "train", "--out", "/", "--quiet", corpus}), 1,
                  {"--out /", "is a directory"});
    check_refused(
        run_qknorm({"tokenizer", "train", "--out", dir / "no/such/t.json", "--quiet", corpus}), 1,
        {"does not exist"});
    // Ids that are not numbers, or past the vocabulary: usage errors, exit status 2.
    check_refused(run_qknorm({"tokenizer", "decode", "--tokenizer", out, "12", "x7"}), 2,
                  {"'x7' is not a token id"});
    check_refused(run_qknorm({"tokenizer", "decode", "--tokenizer", out, "100000"}), 2, {"100000"});
    const Outcome ids = run_qknorm({"tokenizer", "encode", "--tokenizer", out, "--text", "[PAD]"});
    CAPTURE(ids.output);
    CHECK(ids.output.rfind("0\n", 0) == 0);  // the first special token, one id
    // encode then decode gives the text back byte for byte (no newline added off a terminal).
    const Outcome line =
        run_qknorm({"tokenizer", "encode", "--tokenizer", out, "--text", "to be\n"});
    std::vector<std::string> line_ids{"tokenizer", "decode", "--tokenizer", out};
    std::istringstream words(line.output);
    for (std::string id; words >> id;) line_ids.push_back(id);
    const Outcome decoded = run_qknorm(line_ids);
    CHECK(decoded.output == "to be\n");
}

TEST_CASE("file names given as positionals are taken verbatim, brackets and commas included") {
    // CLI11 read "[a]" as the list {"a"}: prepare and tokenizer train read the file a.
    TempDir dir("cli_positional");
    const std::string bracketed = dir / "[a]", comma = dir / "b,c", dashed = dir / "-d";
    std::ofstream(bracketed) << "to be or not to be\n";
    std::ofstream(comma) << "that is the question\n";
    std::ofstream(dashed) << "whether tis nobler\n";
    std::ofstream(dir / "a") << "the wrong file, never read\n";
    const Outcome prepared =
        run_qknorm({"prepare", "--tokenizer", "byte", "--out", dir / "shards", "--quiet",
                    "--threads", "1", "--", dashed, bracketed, comma});
    CAPTURE(prepared.output);
    REQUIRE(prepared.exit_code == 0);
    CHECK(prepared.output.find("3 documents, 59 bytes") != std::string::npos);
    const Outcome trained =
        run_qknorm({"tokenizer", "train", "--out", dir / "t.json", "--quiet", bracketed, comma});
    CAPTURE(trained.output);
    CHECK(trained.exit_code == 0);
    // An unknown option among them is still refused, as a usage error.
    check_refused(
        run_qknorm({"prepare", "--tokenizer", "byte", "--out", dir / "x", bracketed, "--bogus"}), 2,
        {"not expected", "--bogus"});
    CHECK(!std::filesystem::exists(dir / "x"));
}
