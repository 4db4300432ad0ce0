// TrainConfig: every setting of a training run (the model's GPTConfig, the data, the optimizer,
// the schedule, the cadence of evaluation and checkpoints), with its checks and its JSON form
// (a run's config.json).
#pragma once

#include <string>

#include "nn/model/config.h"
#include "nn/text/modality.h"

namespace qk::nn {

struct TrainConfig {
    GPTConfig model;
    std::string data_path;  // empty: the bundled Tiny Shakespeare
    // A Hugging Face model directory to start from (docs/models.md#fine-tuning-one): its
    // config.json replaces the model's architecture (this config keeps its runtime switches:
    // with_runtime_of) and its weights the random initialisation. Empty: a model trained from
    // scratch.
    std::string init_from;
    // The training windows' length; 0 = the model's block_size. An imported model's block_size
    // is the length it was built for (40,960 for Qwen3): fine-tuning uses a shorter window.
    int64_t context = 0;
    int64_t context_length() const { return context > 0 ? context : model.block_size; }
    std::string tokenizer = "char";  // char | byte
    // A second modality (nn/text/modality.h, docs/modalities.md): image spans mixed into the text
    // stream (image_fraction 0: text only). With any image, or with modality_signals (the
    // text-only control), the tokenizer gains the codes and markers and metrics.jsonl splits the
    // signals by modality.
    ModalityMix modalities;
    bool modality_signals = false;
    bool multimodal() const { return modality_signals || modalities.image_fraction > 0; }
    std::string device = "cpu";  // cpu | cuda: where the weights, batches and steps live
    bool tf32 = false;           // cuda: float32 GEMMs on TF32 tensor cores (set_tf32)
    int64_t batch_size = 32;     // the global batch: split over the ranks and micro-batches
    int64_t grad_accum = 1;      // micro-batches per optimizer step (gradients summed in between)
    int64_t steps = 2000;
    int64_t warmup = 100;
    double lr = 1e-3, lr_min = 1e-4;
    double beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1;
    bool independent_weight_decay = false;  // AdamW's parameters only
    // adamw | muon: Muon (nn/optim/muon.h) for the blocks' 2-D weights, AdamW for the rest
    // (nn/train/run_optimizer.h). Both take the same lr schedule and weight decay.
    std::string optimizer = "adamw";
    double muon_momentum = 0.95;
    // QK-Clip threshold τ (nn/optim/qk_clip.h): after each step, the q and k rows of every head
    // whose max |s| in that step passed τ are scaled down. qk_norm none only; 0 = off.
    double qk_clip = 0;
    double grad_clip = 1.0;
    // A training loss above diverge_factor × the lowest loss of the run so far stops it as
    // diverged, as a NaN or Inf does; 0 = stop on non-finite losses only.
    double diverge_factor = 3.0;
    // --precision fp16: dynamic loss scaling (nn/optim/loss_scale.h), from this scale, doubled
    // after this many clean steps in a row.
    double loss_scale = 65536.0;
    int64_t loss_scale_interval = 2000;
    // Validation every N steps and at the end; 0 = auto, eval_interval(): about 20 points a run.
    int64_t eval_every = 0, eval_batches = 20;
    // "qknorm": the validation loss above (eval_batches random windows of the context). "nanogpt":
    // also nanoGPT's figure, every window of 256 tokens tiling the validation split
    // (nn/train/eval_protocol.h), at the end of the run, beside it in metrics.jsonl and
    // result.json. Needs a model that attends 256 tokens back (block size >= 256).
    std::string eval_protocol = "qknorm";
    // The stability signals every N steps (they cost an extra pass); 0 = auto, stats_interval().
    int64_t stats_every = 0;
    int64_t eval_interval() const;
    int64_t checkpoint_every = 500, keep_checkpoints = 2;
    uint64_t seed = 1337;
    std::string run_dir = "runs/default";
    int64_t sample_tokens = 300;
    bool progress = true;  // the progress bar on stderr
    // How the user started the program, for the commands a message suggests ("./build/examples/
    // qknorm train --resume ..."): not saved, like progress.
    std::string program = "qknorm";
    // The length of the learning-rate schedule (warmup, then cosine to lr_min at this step);
    // 0 = steps. A finished run extended with `--resume DIR --steps N` keeps its schedule: the
    // steps past its end run at lr_min.
    int64_t schedule_steps = 0;
    int64_t schedule_length() const { return schedule_steps > 0 ? schedule_steps : steps; }
    // The schedule's shape after warmup: "cosine" decays to lr_min; "wsd" (warmup, stable, decay)
    // holds lr, then decays linearly to lr_min over the last `cooldown` of the schedule (a
    // fraction in (0, 1]).
    std::string lr_schedule = "cosine";
    double cooldown = 0.3;
    double lr_at(int64_t step) const;
    // Data-parallel knobs (docs/distributed.md), saved in config.json; a run may resume on
    // another number of ranks, and `--resume` takes new values of these from the command line.
    // Every rank must pass the same values.
    double bucket_mb = 25;     // gradients are averaged in buckets of about this many MB
    bool overlap = true;       // start each bucket's average during backward, as soon as ready
    double dist_timeout = 60;  // seconds a collective waits for the other ranks, then the job ends
    int64_t zero = 0;  // 1: ZeRO-1, AdamW's moments sharded over the ranks (nn/optim/zero.h)

    // Every field finite, in range and consistent with the others, else a qk::Error that names
    // the flag, the value and what it accepts ("train: --lr must be > 0, got -0.003").
    void validate() const;
    // config.json: numbers as JSON numbers, switches as booleans. from_json also reads the files
    // written before, whose model section held every value as a string.
    std::string to_json() const;
    static TrainConfig from_json(const std::string& json);  // validated
    // The steps between two measurements of the stability signals: stats_every, or with 0 (auto)
    // steps / 50, so that the plot of any run has at least 50 points, capped at 25 (a long run
    // measures often enough, and the default 9000-step run spends 2 % less than every 10).
    int64_t stats_interval() const;
};

// "qk_norm=layernorm (head), soft-cap 50", "qk_norm=lp (p=3, g0=henry)": the switches that are on.
std::string describe_attention(const GPTConfig& m);
// Two lines that say what a run is, for the title of its plot: the model ("L=4 H=6 C=192 T=64,
// qk_norm=layernorm (head), rope (theta 10000), bf16"), then the training (batch, steps,
// optimizer and learning rates, seed).
std::string describe_run(const TrainConfig& c);

// The configuration of the run in run_dir (its config.json), with run_dir set to that directory.
TrainConfig load_run_config(const std::string& run_dir);

}  // namespace qk::nn
