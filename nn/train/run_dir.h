// The run directory on disk, for the trainer (nn/train/trainer.cpp): checkpoint files by step, the
// cleanup of what a kill leaves behind, and metrics.jsonl cut back to the step a run resumes at.
// Only files the run itself wrote are ever removed.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/model/checkpoint_files.h"
#include "nn/train/checkpoint.h"
#include "nn/train/run_optimizer.h"
#include "nn/train/train_config.h"

namespace qk::nn {

// Writes the checkpoint of state.step and keeps the newest cfg.keep_checkpoints. Collective (with
// --zero 1 the moments are gathered first); rank 0 writes.
void write_checkpoint(const TrainConfig& cfg, const GPT& model, const RunOptimizer& optimizer,
                      const Tokenizer& tok, const TrainingState& state);

// What a resumed run reads back from metrics.jsonl: the last training and validation losses
// (so that resuming a finished run reports them) and the lowest training loss (the reference of
// the divergence check, so that a resumed run takes the decisions an unbroken one would).
struct MetricsSoFar {
    double last_loss = NAN, last_val_loss = NAN, min_loss = INFINITY;
};

// Keeps the lines of metrics.jsonl of steps <= last_step and returns what they say.
MetricsSoFar truncate_metrics(const std::string& run_dir, int64_t last_step);

// Makes run_dir ready (removing the leftovers of a kill) and says how the run starts: true to
// resume from its latest checkpoint, false from scratch.
bool prepare_run_dir(const TrainConfig& cfg, bool resume);

// What a diverged run leaves to resume from: "the last good checkpoint, step N, is kept", or
// that there is none.
std::string kept_checkpoint_note(const std::string& run_dir);

// Throws unless the model config in the checkpoint's own metadata (of the file at path) is `now`.
void check_checkpoint_config(const std::string& path,
                             const std::map<std::string, std::string>& metadata,
                             const GPTConfig& now);

}  // namespace qk::nn
