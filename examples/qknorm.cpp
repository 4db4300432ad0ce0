// qknorm — the command-line program: train a QK-norm GPT, sample from it.
//
//   qknorm train [--qk-norm layernorm] [--steps 2000] [--run-dir runs/default] ...
//   qknorm train --resume runs/default
//   qknorm sample --run runs/default --prompt "ROMEO:" --tokens 400
//
// Every flag has a default; `qknorm train --help` lists them with what they do.
#include <fmt/chrono.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "core/threading.h"
#include "nn/checkpoint.h"
#include "nn/sample.h"
#include "nn/sweep.h"
#include "nn/trainer.h"

using namespace qk;
using namespace qk::nn;

namespace {

struct ModelFlags {
    std::string norm = "layernorm", qk_norm = "layernorm", qk_scope = "head";
};

void add_attention_flags(CLI::App* cmd, GPTConfig& m, ModelFlags& flags) {
    cmd->add_option(
           "--qk-norm", flags.qk_norm,
           "normalisation of q and k: none (baseline), layernorm, rmsnorm, l2 (Henry et al., "
           "learnable scale g), lp (q/|q|_p, learnable g)")
        ->check(CLI::IsMember({"none", "layernorm", "rmsnorm", "l2", "lp"}))
        ->capture_default_str();
    cmd->add_option(
           "--qk-norm-scope", flags.qk_scope,
           "layernorm/rmsnorm statistics per head over D (head) or over all C channels (full)")
        ->check(CLI::IsMember({"head", "full"}))
        ->capture_default_str();
    cmd->add_option("--attn-softcap", m.attn_softcap,
                    "soft-cap c of the attention logits, c*tanh(s/c); 0 = off")
        ->capture_default_str();
    cmd->add_option("--qkv-norm", m.qkv_norm, "normalise v too and drop ln_1 (Rybakov et al.)")
        ->capture_default_str();
}

void add_regularisation_flags(CLI::App* cmd, GPTConfig& m) {
    cmd->add_option("--logit-softcap", m.logit_softcap, "soft-cap of the output logits; 0 = off")
        ->capture_default_str();
    cmd->add_option("--z-loss", m.z_loss, "weight of the z-loss mean(logsumexp(logits)^2); 0 = off")
        ->capture_default_str();
}

// With attention_flags false (the sweep), the variant strings choose the attention instead.
void add_model_flags(CLI::App* cmd, TrainConfig& cfg, ModelFlags& flags, bool attention_flags) {
    GPTConfig& m = cfg.model;
    cmd->add_option("--n-layer", m.n_layer, "transformer blocks (L)")->capture_default_str();
    cmd->add_option("--n-head", m.n_head, "attention heads per block (H)")->capture_default_str();
    cmd->add_option("--n-embd", m.n_embd, "model width C (head dim D = C / H)")
        ->capture_default_str();
    cmd->add_option("--block-size", m.block_size, "context length T")->capture_default_str();
    cmd->add_option("--dropout", m.dropout, "dropout probability (attention, residual, embedding)")
        ->capture_default_str();
    cmd->add_option("--bias", m.bias, "biases in every Linear and norm (true|false)")
        ->capture_default_str();
    cmd->add_option("--tie-embeddings", m.tie_embeddings, "share wte with the LM head (true|false)")
        ->capture_default_str();
    cmd->add_option("--norm", flags.norm, "block norms ln_1, ln_2, ln_f")
        ->check(CLI::IsMember({"layernorm", "rmsnorm"}))
        ->capture_default_str();
    add_regularisation_flags(cmd, m);
    if (attention_flags) add_attention_flags(cmd, m, flags);
    cmd->add_option("--lp-p", m.lp_p, "p of the lp variant (>= 1)")->capture_default_str();
    cmd->add_option("--qk-scale-init", m.qk_scale_init,
                    "initial g for l2/lp: henry (log2(T^2-T)), sqrt_d, or a number")
        ->capture_default_str();
    cmd->add_option("--qk-scale-per-head", m.qk_scale_per_head,
                    "one g per head instead of one per layer")
        ->capture_default_str();
}

// With single_run false (the sweep), the grid sets the learning rate, seed and run directory.
void add_training_flags(CLI::App* cmd, TrainConfig& cfg, bool single_run) {
    cmd->add_option("--data", cfg.data_path,
                    "text file to train on (default: bundled Tiny Shakespeare)");
    cmd->add_option("--tokenizer", cfg.tokenizer, "char (sorted unique characters) or byte (256)")
        ->check(CLI::IsMember({"char", "byte"}))
        ->capture_default_str();
    cmd->add_option("--device", cfg.device,
                    "cpu, or cuda: the CUDA backend (a GPU, or in an emulation build the CUDA "
                    "kernels run on the cpu: correct but slow, for tests)")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
    cmd->add_option("--batch-size", cfg.batch_size, "sequences per step (B)")
        ->capture_default_str();
    cmd->add_option("--steps", cfg.steps, "optimisation steps")->capture_default_str();
    cmd->add_option("--warmup", cfg.warmup, "linear warmup steps before the cosine decay")
        ->capture_default_str();
    if (single_run) cmd->add_option("--lr", cfg.lr, "peak learning rate")->capture_default_str();
    if (single_run)
        cmd->add_option("--lr-min", cfg.lr_min, "learning rate at the end of the cosine decay")
            ->capture_default_str();
    cmd->add_option("--beta1", cfg.beta1, "AdamW beta1")->capture_default_str();
    cmd->add_option("--beta2", cfg.beta2, "AdamW beta2")->capture_default_str();
    cmd->add_option("--weight-decay", cfg.weight_decay, "AdamW weight decay (2-D weights only)")
        ->capture_default_str();
    cmd->add_option(
           "--independent-wd", cfg.independent_weight_decay,
           "decay by (lr/lr_max)*wd per step, independent of the peak lr (Wortsman et al.)")
        ->capture_default_str();
    cmd->add_option("--grad-clip", cfg.grad_clip, "global gradient-norm clip; 0 = off")
        ->capture_default_str();
    cmd->add_option("--eval-every", cfg.eval_every, "validate every N steps")
        ->capture_default_str();
    cmd->add_option("--eval-batches", cfg.eval_batches,
                    "validation batches (the same ones each time)")
        ->capture_default_str();
    cmd->add_option("--stats-every", cfg.stats_every,
                    "record the attention stability signals every N steps")
        ->capture_default_str();
    cmd->add_option("--checkpoint-every", cfg.checkpoint_every, "write a checkpoint every N steps")
        ->capture_default_str();
    cmd->add_option("--keep-checkpoints", cfg.keep_checkpoints,
                    "how many recent checkpoints to keep")
        ->capture_default_str();
    if (single_run)
        cmd->add_option("--seed", cfg.seed, "seed of the weights, the batches and dropout")
            ->capture_default_str();
    if (single_run)
        cmd->add_option(
            "--run-dir", cfg.run_dir,
            "where the checkpoints, metrics.jsonl and plot.svg go (default: runs/<date-time>)");
    if (single_run)
        cmd->add_option("--sample-tokens", cfg.sample_tokens,
                        "characters to generate at the end; 0 = none")
            ->capture_default_str();
}

// "qk_norm=layernorm (head), soft-cap 50", "qk_norm=lp (p=3, g0=henry)": the switches that are on.
std::string describe_attention(const GPTConfig& m) {
    std::string s = "qk_norm=" + to_string(m.qk_norm);
    if (m.qk_norm == QKNorm::layernorm || m.qk_norm == QKNorm::rmsnorm)
        s += fmt::format(" ({})", to_string(m.qk_norm_scope));
    if (m.qk_norm == QKNorm::l2 || m.qk_norm == QKNorm::lp)
        s += m.qk_norm == QKNorm::lp ? fmt::format(" (p={}, g0={})", m.lp_p, m.qk_scale_init)
                                     : fmt::format(" (g0={})", m.qk_scale_init);
    if (m.attn_softcap > 0) s += fmt::format(", soft-cap {}", m.attn_softcap);
    if (m.qkv_norm) s += ", qkv-norm";
    return s;
}

void apply_model_flags(TrainConfig& cfg, const ModelFlags& flags) {
    cfg.model.norm = parse_norm_kind(flags.norm);
    cfg.model.qk_norm = parse_qk_norm(flags.qk_norm);
    cfg.model.qk_norm_scope = parse_norm_scope(flags.qk_scope);
}

// Experiment 1 of the stability lab (README: Stability lab) is the default grid: a 2-layer model
// that trains in about a minute, the QK-norm family, learning rates 1e-3 ... 3e-1.
void set_sweep_defaults(SweepSpec& spec) {
    TrainConfig& b = spec.base;
    b.model.n_layer = 2, b.model.n_head = 4, b.model.n_embd = 128, b.model.block_size = 64;
    b.model.bias = false;
    b.batch_size = 32, b.steps = 600, b.warmup = 30;  // 5 % warmup, then cosine
    b.weight_decay = 1e-4, b.independent_weight_decay = true;
    b.eval_every = 100, b.stats_every = 10, b.checkpoint_every = 200, b.keep_checkpoints = 1;
    b.sample_tokens = 0;
    spec.variants = {"baseline", "qk_layernorm", "qk_rmsnorm", "l2",
                     "softcap",  "qk_norm_cap",  "qkv_norm"};
    spec.lrs = {1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
    spec.seeds = {1};
    spec.out_dir = "sweeps/default";
}

void add_sweep_flags(CLI::App* cmd, SweepSpec& spec) {
    cmd->add_option("--variants", spec.variants,
                    "comma-separated variants, each a preset with optional :key=value overrides; "
                    "presets: baseline, qk_layernorm, qk_rmsnorm, l2, lp, softcap, qk_norm_cap, "
                    "qkv_norm; keys: p, g0, cap, scope, L, H, C (e.g. lp:p=3:g0=1)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--lrs", spec.lrs, "comma-separated peak learning rates")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--seeds", spec.seeds, "comma-separated seeds")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--lr-min-ratio", spec.lr_min_ratio,
                    "each run's cosine decays to lr * this ratio")
        ->capture_default_str();
    cmd->add_option("--jobs", spec.jobs, "runs trained at the same time, one process each")
        ->capture_default_str();
    cmd->add_option("--out", spec.out_dir,
                    "sweep directory: runs/, results.csv, sensitivity.csv and the plots; a "
                    "second call skips finished runs and resumes interrupted ones")
        ->capture_default_str();
    cmd->add_option("--plot-param", spec.plot_param,
                    "also plot the final loss against this variant override (e.g. p), one curve "
                    "per remaining variant string, one panel per LR (param_sweep.svg)");
    cmd->add_option("--plot-lr", spec.plot_lr,
                    "learning rate of the logit and entropy plots; 0 = the largest")
        ->capture_default_str();
}

int run_train(TrainConfig cfg, const ModelFlags& flags, const std::string& resume_dir,
              const std::string& from_json, bool quiet) {
    bool resume = !resume_dir.empty();
    if (resume) {
        cfg = load_run_config(resume_dir);
    } else if (!from_json.empty()) {
        cfg = TrainConfig::from_json(read_text_file(from_json));
    } else {
        apply_model_flags(cfg, flags);
    }
    cfg.progress = !quiet;
    if (cfg.run_dir.empty())
        cfg.run_dir = fmt::format("runs/{:%Y%m%d-%H%M%S}", fmt::localtime(std::time(nullptr)));
    fmt::print(
        "qknorm train: L={} H={} C={} T={} B={}, attention: {}, steps {}, lr {}, on {}, run dir "
        "{}{}\n",
        cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size, cfg.batch_size,
        describe_attention(cfg.model), cfg.steps, cfg.lr, cfg.device, cfg.run_dir,
        resume ? " (resuming)" : "");
    TrainResult result = train(cfg, resume);
    if (result.diverged) {
        fmt::print(stderr, "qknorm train: {}\n", result.message);
        return 2;
    }
    fmt::print("final train loss {:.4f}, val loss {:.4f} after {} steps\n", result.final_loss,
               result.final_val_loss, result.steps_done);
    fmt::print("metrics: {0}/metrics.jsonl, plot: {0}/plot.svg\n", cfg.run_dir);
    if (!result.sample.empty()) fmt::print("\n--- sample ---\n{}\n--------------\n", result.sample);
    return 0;
}

// threads: the count asked for (--threads or QK_NUM_THREADS), or 0 to share the cores out.
int run_sweep_command(SweepSpec spec, const ModelFlags& flags, int threads) {
    apply_model_flags(spec.base, flags);
    spec.qknorm_exe = std::filesystem::read_symlink("/proc/self/exe").string();
    // Each run is a child process: it inherits the thread count through the environment. Runs
    // side by side get a share of the cores each, so that N runs do not fight over them.
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
    fmt::print("\n{:<28} {:>10} {:>9} {:>14} {:>9}\n", "variant", "best loss", "best lr",
               "LR sensitivity", "diverged");
    for (const VariantSummary& v : result.variants)
        fmt::print("{:<28} {:>10.4f} {:>9.3g} {:>14.4f} {:>6}/{}\n", v.variant, v.best_loss,
                   v.best_lr, v.lr_sensitivity, v.diverged, v.runs);
    fmt::print(
        "\ntables: {0}/results.csv, {0}/sensitivity.csv; plots: {0}/lr_sweep.svg, "
        "{0}/max_logit.svg, {0}/entropy.svg\n",
        spec.out_dir);
    return 0;
}

// `option` replaces the model and training flags: refuse them next to it rather than ignore them.
void check_alone(const CLI::App* cmd, const std::string& option, const std::string& why) {
    if (cmd->get_option(option)->count() == 0) return;
    for (const CLI::Option* other : cmd->get_options())
        QK_CHECK(
            other->count() == 0 || other->get_name() == option || other->get_name() == "--quiet",
            "train: {} {}; {} cannot be combined with it", option, why, other->get_name());
}

// The newest run directory under runs/ (their names are dates, so they sort by time).
std::string newest_run() {
    std::string newest;
    if (std::filesystem::exists("runs"))
        for (const auto& entry : std::filesystem::directory_iterator("runs"))
            if (entry.is_directory() && entry.path().string() > newest)
                newest = entry.path().string();
    QK_CHECK(!newest.empty(), "sample: no run under runs/; pass --run DIR or --ckpt FILE");
    return newest;
}

int run_sample(const std::string& run, const std::string& ckpt, const std::string& prompt,
               const SampleOptions& options, uint64_t seed) {
    const std::string path =
        !ckpt.empty() ? ckpt : latest_model_checkpoint(run.empty() ? newest_run() : run);
    QK_CHECK(!path.empty(), "sample: {} holds no checkpoint; pass --run DIR or --ckpt FILE", run);
    LoadedModel loaded = load_model(path);
    Generator gen(seed);
    std::vector<int32_t> ids =
        prompt.empty() ? std::vector<int32_t>{0} : loaded.tokenizer.encode(prompt);
    fmt::print("{}\n", loaded.tokenizer.decode(generate(*loaded.model, ids, options, gen)));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"qknorm: train GPT-style transformers with QK-norm and its variants"};
    app.require_subcommand(1);
    // `qknorm sweep --config FILE`: a TOML file whose [sweep] section sets any sweep flag (see
    // examples/stability/); flags on the command line win. Fallthrough lets the option follow
    // the subcommand's name.
    app.set_config("--config", "", "TOML file setting flags, in a [train] or [sweep] section");
    app.fallthrough();
    app.allow_config_extras(CLI::config_extras_mode::error);  // a mistyped key is an error
    // The default model: QK-LayerNorm per head, sized to reach a validation loss below 1.55 on
    // Tiny Shakespeare within ten minutes on the 2 cores of the reference machine (README:
    // Training). At that budget (about 5 M tokens) batch 16 beat batch 32 (more steps, and
    // faster per token), C = 192 beat C = 256, lr 3e-3 beat 4.5e-3, beta2 0.95 beat 0.99, and
    // decaying to lr/100 beat lr/10. 40 validation batches of 16 are the 40,960 tokens that
    // 20 of 32 were. The stability signals every 25 steps (216 points) instead of 10 save 2 %.
    TrainConfig cfg;
    cfg.model.qk_norm = QKNorm::layernorm;
    cfg.model.n_layer = 4;
    cfg.model.n_head = 6;
    cfg.model.n_embd = 192;
    cfg.model.block_size = 64;
    cfg.batch_size = 16;
    cfg.steps = 5400;
    cfg.warmup = 100;
    cfg.lr = 3e-3;
    cfg.lr_min = 3e-5;
    cfg.eval_every = 500;
    cfg.eval_batches = 40;
    cfg.stats_every = 25;
    cfg.run_dir = "";  // runs/<date-time> unless --run-dir is given
    ModelFlags flags;
    std::string resume_dir;
    bool quiet = false;
    int threads = num_threads();
    CLI::Option* threads_option =
        app.add_option("--threads", threads,
                       "cpu threads for OpenBLAS and the kernels (env QK_NUM_THREADS; default: "
                       "every core, shared out between the runs of a sweep)")
            ->capture_default_str();

    CLI::App* train_cmd = app.add_subcommand(
        "train", "train a model (defaults: the QK-norm model on Tiny Shakespeare)");
    add_model_flags(train_cmd, cfg, flags, true);
    add_training_flags(train_cmd, cfg, true);
    train_cmd->add_option("--resume", resume_dir,
                          "continue the run in this directory (its config is reused)");
    train_cmd->add_flag("--quiet", quiet, "no progress bar");
    std::string from_json;
    train_cmd->add_option("--from-json", from_json,
                          "take every setting from this file (a run's config.json) instead of "
                          "the flags; `qknorm sweep` starts its runs this way");

    CLI::App* sweep_cmd = app.add_subcommand(
        "sweep", "train a grid of variants x learning rates x seeds and compare them");
    SweepSpec sweep;
    ModelFlags sweep_flags;
    set_sweep_defaults(sweep);
    add_model_flags(sweep_cmd, sweep.base, sweep_flags, false);
    add_training_flags(sweep_cmd, sweep.base, false);
    add_sweep_flags(sweep_cmd, sweep);

    CLI::App* sample_cmd = app.add_subcommand("sample", "generate text from a trained model");
    std::string run, ckpt, prompt;
    SampleOptions options;
    uint64_t seed = 0;
    sample_cmd->add_option(
        "--run", run,
        "run directory, its latest checkpoint is used (default: the newest under runs/)");
    sample_cmd->add_option("--ckpt", ckpt, "a model checkpoint file, instead of --run");
    sample_cmd->add_option("--prompt", prompt, "text to continue (default: a newline)");
    sample_cmd->add_option("--tokens", options.max_new_tokens, "tokens to generate")
        ->capture_default_str();
    sample_cmd->add_option("--temperature", options.temperature, "softmax temperature; 0 = greedy")
        ->capture_default_str();
    sample_cmd->add_option("--top-k", options.top_k, "sample among the k most likely; 0 = all")
        ->capture_default_str();
    sample_cmd->add_option("--seed", seed, "sampling seed")->capture_default_str();

    CLI11_PARSE(app, argc, argv);
    try {
        set_num_threads(threads);
        if (train_cmd->parsed()) {
            check_alone(train_cmd, "--resume", "continues the run with the configuration it saved");
            check_alone(train_cmd, "--from-json", "takes every setting from the file");
            return run_train(cfg, flags, resume_dir, from_json, quiet);
        }
        if (sweep_cmd->parsed()) {
            const bool threads_given = threads_option->count() > 0 || std::getenv("QK_NUM_THREADS");
            return run_sweep_command(sweep, sweep_flags, threads_given ? threads : 0);
        }
        return run_sample(run, ckpt, prompt, options, seed);
    } catch (const Error& e) {
        fmt::print(stderr, "qknorm: {}\n", e.what());
        return 1;
    }
}
