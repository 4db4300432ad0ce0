// The training loop behind `qknorm train` and `qknorm sweep`: data, AdamW with warmup + cosine,
// clipping, periodic validation, stability signals, metrics.jsonl, atomic checkpoints, resume,
// a plot of the run, and a sample at the end.
#pragma once

#include <cmath>
#include <functional>
#include <string>

#include "nn/model/checkpoint_files.h"
#include "nn/train/train_config.h"

namespace qk::nn {

struct TrainResult {
    int64_t steps_done = 0;
    double final_loss = 0, final_val_loss = 0;
    double final_val_bpb = 0;  // final_val_loss in bits per byte of raw text
    // nanoGPT's figure at the end (--eval-protocol nanogpt; NaN otherwise)
    double final_val_loss_nanogpt = NAN;
    bool diverged = false;  // a NaN or Inf loss, or a spike, stopped the run
    int stop_signal = 0;    // SIGINT or SIGTERM stopped it after a step, with a checkpoint
    std::string message;
    std::string sample;
};

// What a test can hook into a run (tests/, and QK_FAULT_INJECT in examples/qknorm.cpp); nothing
// here is needed to train.
struct TrainHooks {
    std::function<void(int64_t step)> before_step = {};  // at the start of each step, 0-based
    // End the run after this many steps as if the process had been killed there: no checkpoint
    // beyond the regular ones, no plot, no result.json, no sample. 0 = never.
    int64_t kill_after = 0;
};

// Trains from scratch into config.run_dir (which must not hold a run yet) or, with resume,
// continues the run found there from its latest checkpoint. Ctrl-C or SIGTERM stops it after
// the step in progress, with a checkpoint (result.stop_signal).
TrainResult train(const TrainConfig& config, bool resume = false, const TrainHooks& hooks = {});

// plot.svg in cfg.run_dir, drawn from its metrics.jsonl under a title from cfg
// (nn/train/run_plot.cpp).
void write_run_plot(const TrainConfig& cfg);

// "4m05s" or "1h02m": the ETAs of the progress bar and of `qknorm sweep`.
std::string format_duration(double seconds);
// The bundled Tiny Shakespeare, found next to the sources or installed data.
std::string default_data_path();

}  // namespace qk::nn
