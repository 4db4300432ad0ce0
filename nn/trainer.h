// The training loop behind `qknorm train` and `qknorm sweep`: data, AdamW with warmup + cosine,
// clipping, periodic validation, stability signals, metrics.jsonl, atomic checkpoints, resume,
// a plot of the run, and a sample at the end.
#pragma once

#include <functional>
#include <string>

#include "nn/train_config.h"

namespace qk::nn {

struct TrainResult {
    int64_t steps_done = 0;
    double final_loss = 0, final_val_loss = 0;
    bool diverged = false;  // a NaN or Inf loss, or a spike, stopped the run
    int stop_signal = 0;    // SIGINT or SIGTERM stopped it after a step, with a checkpoint
    std::string message;
    std::string sample;
};

// Trains from scratch into config.run_dir (which must not hold a run yet) or, with resume,
// continues the run found there from its latest checkpoint.
TrainResult train(const TrainConfig& config, bool resume = false);

// plot.svg in cfg.run_dir, drawn from its metrics.jsonl under a title from cfg (nn/run_plot.cpp).
void write_run_plot(const TrainConfig& cfg);

// The newest complete checkpoint of a run ("" if none): the model file path.
std::string latest_model_checkpoint(const std::string& run_dir);
// "4m05s" or "1h02m": the ETAs of the progress bar and of `qknorm sweep`.
std::string format_duration(double seconds);
// The bundled Tiny Shakespeare, found next to the sources or installed data.
std::string default_data_path();

}  // namespace qk::nn
