// qknorm — the command-line program: train a QK-norm GPT, sample from it, sweep the variants.
//
//   qknorm train [--qk-norm layernorm] [--steps 2000] [--run-dir runs/default] ...
//   qknorm train --resume runs/default
//   qknorm sample --run-dir runs/default --prompt "ROMEO:" --tokens 400
//
// Every flag has a default; `qknorm train --help` lists them with what they do (the flags are
// defined in examples/qknorm_flags.cpp). Exit status: 0 done, 1 an error (a file, a checkpoint,
// the data), 2 a usage error (a flag's value, a config file), 3 training diverged, 130 (143)
// stopped by Ctrl-C (SIGTERM) with a checkpoint to resume from. Every error
// is one line `qknorm: <what>: <why>` on stderr, never an abort.
#include <fmt/chrono.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/distributed.h"
#include "core/file_io.h"
#include "core/threading.h"
#include "examples/progress.h"
#include "examples/qknorm_config.h"
#include "examples/qknorm_flags.h"
#include "examples/qknorm_models.h"
#include "examples/qknorm_tokens.h"
#include "nn/model/sample.h"
#include "nn/optim/data_parallel.h"
#include "nn/text/data.h"
#include "nn/train/checkpoint.h"
#include "nn/train/fine_tune.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::cli;

namespace {

namespace fs = std::filesystem;

constexpr int kExitError = 1, kExitUsage = 2, kExitDiverged = 3;

// What `--resume DIR` takes from the command line besides the run's saved configuration: how
// long to train (more steps extend the run; its LR schedule keeps its length, and the steps past
// it run at --lr-min) and how the ranks share the work.
const std::vector<std::string> kResumeFlags{"--steps",     "--zero",    "--dist-timeout",
                                            "--bucket-mb", "--overlap", "--quiet"};

TrainConfig resumed_config(const std::string& resume_dir, const TrainConfig& given,
                           const CLI::App* cmd) {
    // Rank 0 reads the run's config and hands it to the others (they need no copy of it).
    const std::string saved = dist::is_root() ? load_run_config(resume_dir).to_json() : "";
    TrainConfig cfg = TrainConfig::from_json(broadcast_string(saved));
    cfg.run_dir = resume_dir;
    auto given_flag = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    if (given_flag("--steps") && given.steps != cfg.steps) {
        cfg.schedule_steps = cfg.schedule_length();
        cfg.steps = given.steps;
        if (cfg.steps < cfg.schedule_steps)
            throw UsageError(fmt::format(
                "train: --resume {} --steps {}: the run's schedule is {} steps long; --steps can "
                "extend a run, not shorten it",
                resume_dir, given.steps, cfg.schedule_steps));
        if (cfg.steps == cfg.schedule_steps) cfg.schedule_steps = 0;
    }
    if (given_flag("--zero")) cfg.zero = given.zero;
    if (given_flag("--dist-timeout")) cfg.dist_timeout = given.dist_timeout;
    if (given_flag("--bucket-mb")) cfg.bucket_mb = given.bucket_mb;
    if (given_flag("--overlap")) cfg.overlap = given.overlap;
    as_usage([&] { cfg.validate(); });
    return cfg;
}

// For the tests of data-parallel faults (tests/test_dist_cli.cpp): QK_FAULT_INJECT="kill:R:S" (or
// "stop:R:S") makes rank R SIGKILL (or SIGSTOP) itself at the start of step S, as a crashed (or
// frozen) process would. Unset, the run has no hooks.
TrainHooks fault_injection() {
    const char* spec = std::getenv("QK_FAULT_INJECT");
    char what[8] = {};
    long fault_rank = -1, fault_step = -1;
    if (!spec || std::sscanf(spec, "%4[a-z]:%ld:%ld", what, &fault_rank, &fault_step) != 3)
        return {};
    const int signal_number = std::string(what) == "stop" ? SIGSTOP : SIGKILL;
    TrainHooks hooks;
    hooks.before_step = [=](int64_t step) {
        if (fault_rank == dist::rank() && fault_step == step) std::raise(signal_number);
    };
    return hooks;
}

int run_train(TrainConfig cfg, const ModelFlags& flags, const std::string& resume_dir,
              const std::string& from_json, bool quiet, const CLI::App* cmd) {
    bool resume = !resume_dir.empty();
    if (resume) {
        cfg = resumed_config(resume_dir, cfg, cmd);
    } else if (!from_json.empty()) {
        cfg = TrainConfig::from_json(read_text_file(from_json, "train: --from-json"));
    } else {
        as_usage([&] { apply_model_flags(cfg, flags); });
        if (!cfg.init_from.empty()) apply_fine_tune_defaults(cmd, cfg);
        if (!cfg.init_from.empty() && cmd->get_option("--tokenizer")->count() == 0) {
            // The model's own tokenizer when its directory has one; else the ids an imported
            // embedding's rows can take.
            const std::string own = tokenizer_file_in(cfg.init_from);
            cfg.tokenizer = own.empty() ? "byte" : own;
        }
        import_model_config(cfg);  // the architecture, for the line below (a bad file: exit 1)
        as_usage([&] { cfg.validate(); });
        refuse_inert_flags(cmd, cfg);
    }
    cfg.progress = !quiet;
    cfg.program = cmd->get_parent()->get_name();  // argv[0], as the user typed it
    if (cfg.run_dir.empty())                      // rank 0's clock names it for every rank
        cfg.run_dir = broadcast_string(
            fmt::format("runs/{:%Y%m%d-%H%M%S}", fmt::localtime(std::time(nullptr))));
    if (!dist::is_root()) cfg.progress = false;  // rank 0 reports for every rank
    if (dist::is_root())
        fmt::print(
            "qknorm train: L={} H={} C={} T={} B={}, attention: {}, steps {}, lr {}, on {}, run "
            "dir "
            "{}{}\n",
            cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.context_length(),
            cfg.batch_size, describe_attention(cfg.model), cfg.steps, cfg.lr, cfg.device,
            cfg.run_dir, resume ? " (resuming)" : "");
    std::fflush(stdout);
    if (dist::is_root() && dist::world_size() > 1)
        fmt::print("data-parallel: {} ranks x {} sequences x {} micro-batch(es) per step\n",
                   dist::world_size(), cfg.batch_size / (dist::world_size() * cfg.grad_accum),
                   cfg.grad_accum);
    TrainResult result = train(cfg, resume, fault_injection());
    // Stopped by Ctrl-C or SIGTERM: the shell's status for a signal, 128 + its number.
    if (result.stop_signal) {
        if (dist::is_root()) fmt::print(stderr, "qknorm train: {}\n", result.message);
        return 128 + result.stop_signal;
    }
    if (!dist::is_root()) return result.diverged ? kExitDiverged : 0;
    if (result.diverged) {
        fmt::print(stderr, "qknorm train: {}\n", result.message);
        return kExitDiverged;
    }
    fmt::print("final train loss {:.4f}, val loss {:.4f} ({:.4f} bits per byte) after {} steps\n",
               result.final_loss, result.final_val_loss, result.final_val_bpb, result.steps_done);
    if (!std::isnan(result.final_val_loss_nanogpt))
        fmt::print("val loss by nanoGPT's protocol (every 256-token window): {:.4f}\n",
                   result.final_val_loss_nanogpt);
    fmt::print("metrics: {0}/metrics.jsonl, plot: {0}/plot.svg\n", cfg.run_dir);
    if (!result.sample.empty()) fmt::print("\n--- sample ---\n{}\n--------------\n", result.sample);
    return 0;
}

// threads: the count asked for (--threads or QK_NUM_THREADS), or 0 to share the cores out.
int run_sweep_command(SweepSpec spec, const ModelFlags& flags, int threads) {
    as_usage([&] { apply_model_flags(spec.base, flags); });
    spec.qknorm_exe = fs::read_symlink("/proc/self/exe").string();
    // Each run is a child process: it inherits the thread count through the environment. Runs
    // side by side get a share of the cores each, so that N runs do not fight over them.
    as_usage([&] { check_sweep(spec); });
    if (threads == 0) threads = std::max(1, available_cores() / std::max(spec.jobs, 1));
    setenv("QK_NUM_THREADS", std::to_string(threads).c_str(), 1);
    const size_t total = spec.variants.size() * spec.lrs.size() * spec.seeds.size();
    fmt::print(
        "qknorm sweep: {} variants x {} learning rates x {} seeds = {} runs, {} at a time, "
        "L={} C={} T={} B={} steps {}, into {}\n",
        spec.variants.size(), spec.lrs.size(), spec.seeds.size(), total, spec.jobs,
        spec.base.model.n_layer, spec.base.model.n_embd, spec.base.model.block_size,
        spec.base.batch_size, spec.base.steps, spec.out_dir);
    std::fflush(stdout);
    const SweepResult result = run_sweep(spec);
    if (result.stop_signal) {
        fmt::print(stderr,
                   "qknorm sweep: stopped ({}): {}\nContinue with the same command (the same "
                   "flags and --out {}): finished runs are skipped, stopped ones resume from "
                   "their checkpoint.\n",
                   result.stop_signal == SIGINT ? "Ctrl-C" : "SIGTERM", result.stop_report,
                   spec.out_dir);
        return 128 + result.stop_signal;
    }
    fmt::print("\n{:<28} {:>10} {:>9} {:>14} {:>9} {:>14}\n", "variant", "best loss", "best lr",
               "LR sensitivity", "diverged", "max stable lr");
    for (const VariantSummary& v : result.variants)
        fmt::print("{:<28} {:>10.4f} {:>9.3g} {:>14.4f} {:>6}/{:<2} {:>14.3g}\n", v.variant,
                   v.best_loss, v.best_lr, v.lr_sensitivity, v.diverged, v.runs, v.max_stable_lr);
    fmt::print(
        "\ntables: {0}/results.csv, {0}/sensitivity.csv; plots: {0}/lr_sweep.svg, "
        "{0}/max_logit.svg, {0}/entropy.svg\n",
        spec.out_dir);
    // A run that did not finish (it crashed, or its flags were refused) is a sweep that failed;
    // a diverged run is a finished one, and a result of the sweep.
    std::vector<std::string> failed;
    for (const RunSummary& run : result.runs)
        if (!run.finished) failed.push_back(run.run_dir);
    if (failed.empty()) return 0;
    fmt::print(stderr, "qknorm sweep: {} of {} runs failed; see {}/log.txt{}\n", failed.size(),
               result.runs.size(), failed.front(), failed.size() > 1 ? " and the others'" : "");
    return kExitError;
}

// `option` replaces the model and training flags: refuse them next to it rather than ignore them
// (all but those in `allowed`).
void check_alone(const CLI::App* cmd, const std::string& option, const std::string& why,
                 const std::vector<std::string>& allowed = {"--quiet"}) {
    if (cmd->get_option(option)->count() == 0) return;
    for (const CLI::Option* other : cmd->get_options())
        if (other->count() != 0 && other->get_name() != option &&
            std::find(allowed.begin(), allowed.end(), other->get_name()) == allowed.end())
            throw UsageError(fmt::format("train: {} {}; {} cannot be combined with it", option, why,
                                         other->get_name()));
}

// The model flags that --init-from keeps: they change how the model computes or trains, not
// which weights it has (GPTConfig's with_runtime_of).
const std::set<std::string> kRuntimeModelFlags{"--attention", "--precision", "--fp8-attention",
                                               "--dropout",   "--z-loss",    "--help"};

// The options of cmd that are not among `architecture`: what may sit next to --init-from.
std::vector<std::string> not_architecture_flags(const CLI::App* cmd,
                                                const std::vector<std::string>& architecture) {
    std::vector<std::string> allowed;
    for (const CLI::Option* option : cmd->get_options())
        if (std::find(architecture.begin(), architecture.end(), option->get_name()) ==
            architecture.end())
            allowed.push_back(option->get_name());
    return allowed;
}

// The newest run directory under runs/ (their names are dates, so they sort by time).
std::string newest_run() {
    std::string newest;
    if (fs::is_directory("runs"))
        for (const auto& entry : fs::directory_iterator("runs"))
            if (entry.is_directory() && entry.path().string() > newest)
                newest = entry.path().string();
    QK_CHECK(!newest.empty(), "sample: no run under runs/; pass --run-dir DIR or --ckpt FILE");
    return newest;
}

// The newest checkpoint of --run-dir (or the newest run), or --ckpt.
std::string checkpoint_to_sample(const SampleArgs& args) {
    const std::string run_dir = args.ckpt.empty() && args.run.empty() ? newest_run() : args.run;
    QK_CHECK(!args.ckpt.empty() || fs::is_directory(run_dir),
             "sample: --run-dir '{}' is not a directory (pass a run directory, or a checkpoint "
             "file with --ckpt)",
             run_dir);
    const std::string path = !args.ckpt.empty() ? args.ckpt : latest_model_checkpoint(run_dir);
    QK_CHECK(!path.empty(), "sample: {} holds no checkpoint; pass --run-dir DIR or --ckpt FILE",
             run_dir);
    return path;
}

int run_sample(const SampleArgs& args) {
    SampleOptions options = args.options;
    options.when_full = args.when_full == "stop" ? WhenFull::stop : WhenFull::slide;
    as_usage([&] { check_sample_options(options); });
    std::optional<Precision> precision;
    if (!args.precision.empty()) precision = parse_precision(args.precision);
    QK_CHECK(!args.ckpt.empty() + !args.run.empty() + !args.model.empty() <= 1,
             "sample: give the model as --run-dir RUN, --ckpt FILE or --model DIR (one of them)");
    LoadedModel loaded = args.model.empty() ? load_model(checkpoint_to_sample(args), precision)
                                            : load_hf_directory(args.model, "sample", precision);
    // bf16 inference reads bf16-stored weights: the same logits, half the bytes per token.
    if (loaded.model->config().precision == Precision::bf16) loaded.model->store_weights_bf16();
    options.vocab = loaded.tokenizer.vocab_size();
    const int64_t context = loaded.model->config().block_size;
    // Every prompt num_samples times; sample i draws with seed + i.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<Generator> gens;
    for (const std::string& text :
         args.prompts.empty() ? std::vector<std::string>{""} : args.prompts) {
        std::vector<int32_t> ids =
            text.empty() ? std::vector<int32_t>{0} : loaded.tokenizer.encode(text);
        if (static_cast<int64_t>(ids.size()) > context) {  // what the model can see of it
            fmt::print(stderr,
                       "qknorm sample: a --prompt of {} tokens is longer than the model's context "
                       "of {}: its last {} are kept\n",
                       ids.size(), context, context);
            ids.erase(ids.begin(), ids.end() - context);
        }
        for (int64_t n = 0; n < args.num_samples; ++n) {
            gens.emplace_back(args.seed + gens.size());
            prompts.push_back(ids);
        }
    }
    const bool stream = prompts.size() == 1;
    if (stream) {  // each token printed as soon as it is drawn: a long sample shows progress
        fmt::print("{}", loaded.tokenizer.decode(prompts[0]));
        std::fflush(stdout);
    }
    // Whole characters only, each sample's text decoded with its prompt (a token alone can be part
    // of a UTF-8 sequence); the stop strings are looked for in that text.
    std::vector<StreamDecoder> decoders;
    for (const auto& prompt : prompts) decoders.emplace_back(loaded.tokenizer, prompt);
    // Several texts are drawn together and printed at the end: a bar on stderr shows how far.
    Progress progress(fmt::format("sampling {} texts", prompts.size()), stream);
    std::vector<int64_t> drawn(prompts.size(), 0);
    std::vector<bool> stopped(prompts.size(), false);  // by a --stop text
    int64_t longest = 0;
    const auto texts = generate(*loaded.model, prompts, options, gens, [&](int64_t s, int32_t id) {
        StreamDecoder& decoder = decoders[static_cast<size_t>(s)];
        const std::string piece = decoder.push(id);
        if (stream) {
            fmt::print("{}", piece);
            std::fflush(stdout);
        }
        if (++drawn[static_cast<size_t>(s)] > longest)
            progress(longest = drawn[static_cast<size_t>(s)], options.max_new_tokens, "tokens");
        stopped[static_cast<size_t>(s)] =
            std::any_of(args.stops.begin(), args.stops.end(), [&](const std::string& stop) {
                return decoder.text().find(stop) != std::string::npos;
            });
        return !stopped[static_cast<size_t>(s)];
    });
    if (stream) fmt::print("{}\n", decoders[0].finish());
    std::fflush(stdout);
    for (size_t s = 0; s < texts.size(); ++s)  // ended by the context, not by a stop or the count
        if (!stopped[s] && drawn[s] < options.max_new_tokens)
            fmt::print(stderr,
                       "qknorm sample: {}the model's context of {} tokens is full after {} of the "
                       "{} tokens asked (--when-full stop; --when-full slide goes on)\n",
                       stream ? "" : fmt::format("sample {}: ", s + 1), context, drawn[s],
                       options.max_new_tokens);
    for (size_t s = 0; !stream && s < texts.size(); ++s)
        fmt::print("--- sample {} (seed {}) ---\n{}\n", s + 1, args.seed + s,
                   loaded.tokenizer.decode(texts[s]));
    return 0;
}

// The --config file, if one is named, read and checked against the flags before CLI11 reads it
// (CLI11 alone would block on a FIFO and take any value as text).
void check_config_flag(int argc, char** argv, CLI::App& app) {
    for (const std::string& path : flag_values(argc, argv, "--config"))
        if (!path.empty()) as_usage([&] { check_config_file(path, app); });
}

}  // namespace

// A message with every run of over 200 non-blank characters cut to its first 80 and a count: a
// hostile 20 MB flag value must not come back as 20 MB of error text (twice).
std::string elide_long_words(const std::string& message) {
    constexpr size_t kLongest = 200, kShown = 80;
    std::string out;
    for (size_t i = 0; i < message.size();) {
        size_t j = i;
        while (j < message.size() && !std::isspace(static_cast<unsigned char>(message[j]))) ++j;
        if (j - i > kLongest)
            out += fmt::format("{}...({} bytes)", message.substr(i, kShown), j - i);
        else
            out.append(message, i, j - i);
        for (i = j; i < message.size() && std::isspace(static_cast<unsigned char>(message[i])); ++i)
            out += message[i];
    }
    return out;
}

// std::filesystem's "filesystem error: cannot create directories: Not a directory [runs/x]" in
// words: "runs/x: cannot create directories: not a directory (a file is in the way ...)".
std::string describe(const fs::filesystem_error& e) {
    std::string operation = e.what();  // "filesystem error: OPERATION: REASON [PATH]..."
    const std::string prefix = "filesystem error: ";
    if (operation.rfind(prefix, 0) == 0) operation.erase(0, prefix.size());
    const std::string reason = ": " + e.code().message();
    const size_t at = operation.find(reason);
    operation = at == std::string::npos ? operation.substr(0, operation.find(" ["))
                                        : operation.substr(0, at);
    std::string why = e.code().message();
    if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
    if (e.code() == std::errc::not_a_directory) why += " (a file is in the way of a directory)";
    if (e.code() == std::errc::permission_denied) why += " (this user cannot write there)";
    if (e.code() == std::errc::no_space_on_device) why += " (the disk is full)";
    const std::string path = e.path1().empty() ? "" : e.path1().string() + ": ";
    return fmt::format("{}{}: {}", path, operation, why);
}

// Prints "qknorm: message" and returns status. Under mpirun it ends every rank of the job
// instead, so that the others do not wait for this one in their next collective.
int fail(const std::string& full_message, int status) {
    const std::string message = elide_long_words(full_message);
    if (dist::world_size() > 1) dist::abort_job("qknorm: " + message);
    fmt::print(stderr, "qknorm: {}\n", message);
    return status;
}

int main(int argc, char** argv) {
    CLI::App app{"qknorm: train GPT-style transformers with QK-norm and its variants"};
    app.require_subcommand(1);
    // `qknorm sweep --config FILE`: a TOML file whose [sweep] section sets any sweep flag (see
    // examples/stability/); flags on the command line win. Fallthrough lets the option follow
    // the subcommand's name.
    app.set_config("--config", "", "TOML file setting flags, in a [train] or [sweep] section");
    app.config_formatter(std::make_shared<TomlConfig>());  // toml++, checked first
    app.fallthrough();
    app.allow_config_extras(CLI::config_extras_mode::error);  // a mistyped key is an error
    // The default model: QK-LayerNorm per head with RoPE, bf16 mixed precision, sized to reach a
    // validation loss below 1.50 on Tiny Shakespeare within ten minutes on the 2 cores of the
    // reference machine (docs/results.md#the-default-model has the table of candidates). At that
    // budget (about 9 M tokens) batch 16 beat batch 32 (more steps, and faster per token),
    // C = 192 beat C = 256 and L = 6, beta2 0.95 beat 0.99, decaying to lr/100 beat lr/10;
    // bf16 buys 25-50 % more steps than fp32 in the same time, RoPE 0.01 nats over learned
    // positions at equal steps, and lr 4.5e-3 edged out 3e-3 with RoPE. Dropout hurt (at this
    // budget, about nine passes over the training split). Then the CPU speedrun's search
    // (docs/results.md#the-cpu-speedrun) moved it to context 256 at batch 4 (the same 1,024
    // characters a step, in longer windows) and to warmup-stable-decay with a 30 % cooldown.
    // `--preset speedrun` is this run with a stronger weight decay and nanoGPT's measure
    // (examples/presets/). 160 validation batches of 4 windows are 163,840 characters, 15 % of the
    // split: windows of 256 overlap in what they test, and 40 of them let the figure move with the
    // draw more than with the model (docs/results.md#the-default-model). Measured at the automatic
    // cadence (TrainConfig::eval_interval): every 450 steps here, steps / 20 in a shorter run (21
    // evaluations, about 35 s of the run). The stability signals too (TrainConfig::stats_interval):
    // every 25 steps here (360 points; every 10 cost 2 % more), every steps / 50 in a shorter run.
    TrainConfig cfg;
    cfg.model.qk_norm = QKNorm::layernorm;
    cfg.model.pos_emb = PosEmb::rope;
    cfg.model.precision = Precision::bf16;
    cfg.model.n_layer = 4;
    cfg.model.n_head = 6;
    cfg.model.n_embd = 192;
    cfg.model.block_size = 256;
    cfg.batch_size = 4;
    cfg.steps = 9000;
    cfg.warmup = 100;
    cfg.lr = 4.5e-3;
    cfg.lr_min = 4.5e-5;
    cfg.lr_schedule = "wsd";
    cfg.cooldown = 0.3;
    cfg.eval_batches = 160;
    cfg.run_dir = "";  // runs/<date-time> unless --run-dir is given
    ModelFlags flags = model_flags_of(cfg.model);
    std::string resume_dir;
    bool quiet = false;
    int threads = num_threads();
    // On the program and on each command, so that `qknorm train --help` lists it too.
    std::vector<CLI::Option*> threads_options;
    auto add_threads = [&](CLI::App* cmd) {
        threads_options.push_back(
            cmd->add_option(
                   "--threads", threads,
                   "cpu threads of the library's pool, which also splits the GEMMs (env "
                   "QK_NUM_THREADS; default: every core, shared out between the runs of a sweep)")
                ->check(CLI::Range(1, kMaxThreads))
                ->capture_default_str());
    };
    add_threads(&app);

    CLI::App* train_cmd = app.add_subcommand(
        "train", "train a model (defaults: the QK-norm model on Tiny Shakespeare)");
    add_model_flags(train_cmd, cfg, flags, true);
    std::vector<std::string> architecture_flags;  // those --init-from replaces
    for (const CLI::Option* option : train_cmd->get_options())
        if (!kRuntimeModelFlags.count(option->get_name()))
            architecture_flags.push_back(option->get_name());
    add_threads(train_cmd);
    add_training_flags(train_cmd, cfg, true);
    train_cmd->add_option("--resume", resume_dir,
                          "continue the run in this directory (its config is reused)");
    train_cmd->add_flag("--quiet", quiet, "no progress bar");
    std::string preset;  // applied before parsing (apply_preset_flag): the flags' new defaults
    add_preset_flag(train_cmd, preset);
    std::string from_json;
    train_cmd->add_option("--from-json", from_json,
                          "take every setting from this file (a run's config.json) instead of "
                          "the flags; `qknorm sweep` starts its runs this way");

    CLI::App* sweep_cmd = app.add_subcommand(
        "sweep", "train a grid of variants x learning rates x seeds and compare them");
    SweepSpec sweep;
    set_sweep_defaults(sweep);
    ModelFlags sweep_flags = model_flags_of(sweep.base.model);
    add_model_flags(sweep_cmd, sweep.base, sweep_flags, false);
    add_training_flags(sweep_cmd, sweep.base, false);
    add_sweep_flags(sweep_cmd, sweep);
    add_threads(sweep_cmd);

    CLI::App* sample_cmd = app.add_subcommand("sample", "generate text from a trained model");
    SampleArgs sample_args;
    add_sample_flags(sample_cmd, sample_args);
    add_threads(sample_cmd);

    ExportArgs export_args;
    CLI::App* export_cmd = add_export_command(app, export_args);
    InspectArgs inspect_args;
    CLI::App* inspect_cmd = add_inspect_command(app, inspect_args);
    TokenizerArgs tokenizer_args;
    CLI::App* tokenizer_cmd = add_tokenizer_command(app, tokenizer_args);
    PrepareArgs prepare_args;
    CLI::App* prepare_cmd = add_prepare_command(app, prepare_args);
    add_threads(prepare_cmd);
    add_threads(tokenizer_args.train);

    dist::init();  // joins the MPI world when mpirun or srun started this process
    try {
        if (const char* env = std::getenv("QK_NUM_THREADS"))
            as_usage([&] { parse_thread_count(env, "QK_NUM_THREADS"); });
        check_config_flag(argc, argv, app);
        as_usage([&] { apply_preset_flag(argc, argv, app, train_cmd); });
        try {
            app.parse(argc, argv);
        } catch (const CLI::ParseError& e) {
            if (e.get_exit_code() == 0) return app.exit(e);  // --help: prints the help
            return fail(fmt::format("{}\nRun with --help for more information.", e.what()),
                        kExitUsage);
        }
        if (prepare_cmd->parsed()) take_verbatim_positionals(prepare_cmd, prepare_args.inputs);
        if (tokenizer_args.train->parsed())
            take_verbatim_positionals(tokenizer_args.train, tokenizer_args.inputs);
        set_num_threads(threads);
        if (train_cmd->parsed()) {
            check_alone(train_cmd, "--resume",
                        fmt::format("continues the run with the configuration it saved (of the "
                                    "other flags it takes {})",
                                    fmt::join(kResumeFlags, ", ")),
                        kResumeFlags);
            check_alone(train_cmd, "--from-json", "takes every setting from the file");
            check_alone(train_cmd, "--init-from",
                        "takes the model from the directory (of the model flags it takes "
                        "--attention, --precision, --dropout and --z-loss)",
                        not_architecture_flags(train_cmd, architecture_flags));
            return run_train(cfg, flags, resume_dir, from_json, quiet, train_cmd);
        }
        if (dist::world_size() > 1)
            throw UsageError(fmt::format(
                "'qknorm {}' runs in one process; of the commands only train runs under mpirun",
                sweep_cmd->parsed()       ? "sweep"
                : export_cmd->parsed()    ? "export"
                : inspect_cmd->parsed()   ? "inspect"
                : tokenizer_cmd->parsed() ? "tokenizer"
                : prepare_cmd->parsed()   ? "prepare"
                                          : "sample"));
        if (export_cmd->parsed()) return run_export(export_args);
        if (inspect_cmd->parsed()) return run_inspect(inspect_args);
        if (tokenizer_cmd->parsed()) return run_tokenizer(tokenizer_args);
        if (prepare_cmd->parsed()) return run_prepare(prepare_args);
        if (sweep_cmd->parsed()) {
            const bool threads_given =
                std::any_of(threads_options.begin(), threads_options.end(),
                            [](const CLI::Option* o) { return o->count() > 0; }) ||
                std::getenv("QK_NUM_THREADS");
            return run_sweep_command(sweep, sweep_flags, threads_given ? threads : 0);
        }
        return run_sample(sample_args);
    } catch (const UsageError& e) {
        return fail(fmt::format("{}\nRun with --help for more information.", e.what()), kExitUsage);
    } catch (const fs::filesystem_error& e) {
        return fail(describe(e), kExitError);
    } catch (const nlohmann::json::exception& e) {  // one no check caught first
        return fail(json_error_text(e), kExitError);
    } catch (const std::bad_alloc&) {
        const bool trains = train_cmd->parsed() || sweep_cmd->parsed() || sample_cmd->parsed();
        return fail(trains ? "out of memory (a smaller --batch-size or model fits)"
                           : "out of memory (a smaller input file, or more memory)",
                    kExitError);
    } catch (const std::exception& e) {  // qk::Error, and anything a library below us throws
        return fail(e.what(), kExitError);
    }
}
