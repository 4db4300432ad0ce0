// The training loop behind `qknorm train` and `qknorm sweep`: data, AdamW with warmup + cosine,
// clipping, periodic validation, stability signals, metrics.jsonl, atomic checkpoints, resume,
// a plot of the run, and a sample at the end.
#pragma once

#include <functional>
#include <string>

#include "nn/config.h"

namespace qk::nn {

struct TrainConfig {
    GPTConfig model;
    std::string data_path;           // empty: the bundled Tiny Shakespeare
    std::string tokenizer = "char";  // char | byte
    std::string device = "cpu";      // cpu | cuda: where the weights, batches and steps live
    int64_t batch_size = 32;
    int64_t steps = 2000;
    int64_t warmup = 100;
    double lr = 1e-3, lr_min = 1e-4;
    double beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1;
    bool independent_weight_decay = false;
    double grad_clip = 1.0;
    int64_t eval_every = 250, eval_batches = 20;
    int64_t stats_every = 10;  // stability signals every N steps (they cost an extra pass)
    int64_t checkpoint_every = 500, keep_checkpoints = 2;
    uint64_t seed = 1337;
    std::string run_dir = "runs/default";
    int64_t sample_tokens = 300;
    bool progress = true;  // the progress bar on stderr
    // Tests: stop after this many steps as if the process were killed (no plot, no sample), to
    // check that resuming gives the same losses. 0 = off. Not saved in config.json.
    int64_t stop_after = 0;

    std::string to_json() const;
    static TrainConfig from_json(const std::string& json);
};

struct TrainResult {
    int64_t steps_done = 0;
    double final_loss = 0, final_val_loss = 0;
    bool diverged = false;  // a NaN or Inf loss stopped the run
    std::string message;
    std::string sample;
};

// Trains from scratch into config.run_dir (which must not hold a run yet) or, with resume,
// continues the run found there from its latest checkpoint.
TrainResult train(const TrainConfig& config, bool resume = false);
TrainConfig load_run_config(const std::string& run_dir);

// The newest complete checkpoint of a run ("" if none): the model file path.
std::string latest_model_checkpoint(const std::string& run_dir);
// "4m05s" or "1h02m": the ETAs of the progress bar and of `qknorm sweep`.
std::string format_duration(double seconds);
// The bundled Tiny Shakespeare, found next to the sources or installed data.
std::string default_data_path();

}  // namespace qk::nn
