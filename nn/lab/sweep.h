// `qknorm sweep`: a grid of attention variants × learning rates × seeds, trained one after another
// or N at a time, resumable, summarised in one results table, Wortsman et al.'s LR sensitivity and
// three plots (final loss against LR, max attention logit and attention entropy against step).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/train/trainer.h"

namespace qk::nn {

// A variant is a preset name with optional overrides, written `name` or `name:key=value:...`:
//   baseline, qk_layernorm, qk_rmsnorm, l2, lp, softcap, qk_norm_cap, qkv_norm
//   keys: p (lp's p), g0 (qk_scale_init), cap (attention soft-cap c), scope (head|full),
//         L, H, C (n_layer, n_head, n_embd), precision (fp32|bf16|fp16|fp8), fp8attn (0|1:
//         --fp8-attention), opt (adamw|muon),
//         pos (learned|rope), order (before_rope|after_rope), clip (QK-Clip's tau),
//         gclip (the gradient-norm clip; 0 = off)
// e.g. `lp:p=3:g0=1`, `baseline:C=256`, `qk_rmsnorm:scope=full`, `baseline:opt=muon:clip=100`.
struct Variant {
    std::string spec;  // as written: the variant's label in tables and plots
    std::string preset;
    std::vector<std::pair<std::string, std::string>> overrides;
};

Variant parse_variant(const std::string& spec);  // throws qk::Error on an unknown name or key
void apply_variant(const Variant& variant, TrainConfig& config);  // model and training keys
const std::vector<std::string>& variant_presets();
const std::vector<std::string>& variant_keys();  // the :key=value overrides a variant takes

struct SweepSpec {
    TrainConfig base;  // model and training settings shared by every run
    std::vector<std::string> variants;
    std::vector<double> lrs;
    std::vector<uint64_t> seeds;
    double lr_min_ratio = 0.1;  // each run decays to lr · lr_min_ratio
    int jobs = 1;               // runs trained at the same time (one process each)
    std::string out_dir = "sweeps/default";
    double plot_lr = 0;      // the LR of the logit/entropy plots; 0: the largest in the grid
    std::string plot_param;  // an override key (e.g. "p"): also plot the final loss against it
    bool progress = true;
    // How a run is trained: the default starts `qknorm train --from-json` processes (the path of
    // the qknorm program must be set in qknorm_exe); tests pass an in-process function.
    std::string qknorm_exe;
    std::function<void(const TrainConfig&, bool resume)> train_fn;
};

// One run, read back from its directory.
struct RunSummary {
    std::string variant, run_dir;
    double lr = 0;
    uint64_t seed = 0;
    bool finished = false, diverged = false;
    int64_t steps_done = 0;
    double init_val_loss = NAN, final_val_loss = NAN, seconds = 0;
    std::vector<double> max_logit;      // per layer: the largest max |s| seen during training
    std::vector<double> final_entropy;  // per layer: attention entropy at the last stats step
};

struct VariantSummary {
    std::string variant;
    double best_loss = NAN, best_lr = NAN;  // seed-mean final val loss at the best LR
    double lr_sensitivity = NAN;            // Wortsman et al. 2023, see sweep.cpp
    // The largest grid LR at which no seed diverged, nor at any smaller LR (NaN: the smallest
    // LR diverged already). A run diverges as train() says (--diverge-factor).
    double max_stable_lr = NAN;
    int runs = 0, diverged = 0;
};

struct SweepResult {
    std::vector<RunSummary> runs;
    std::vector<VariantSummary> variants;
    // Ctrl-C or SIGTERM stopped the sweep: no run started after it, each running one stopped
    // after its step with a checkpoint, and no table or plot was written; calling the sweep
    // again (the same flags and --out) skips the finished runs and resumes the others.
    int stop_signal = 0;
    std::string stop_report;  // what finished, what stopped where, what did not start
};

std::string run_dir_name(const std::string& variant, double lr, uint64_t seed);
RunSummary summarize_run(const std::string& run_dir);
std::vector<VariantSummary> summarize_variants(const std::vector<RunSummary>& runs);

// Trains every run of the grid that has not finished yet, then writes into spec.out_dir:
// results.csv, results.jsonl, sensitivity.csv, lr_sweep.svg, max_logit.svg, entropy.svg, and
// param_sweep.svg when plot_param is set.
// Refuses a grid that cannot run, before anything trains: an empty grid, --jobs or
// --lr-min-ratio out of range, --out a file, a variant or any run's configuration invalid.
void check_sweep(const SweepSpec& spec);
SweepResult run_sweep(const SweepSpec& spec);

}  // namespace qk::nn
