// The gradients of one training step (nn/train/trainer.cpp's inner loop): the global batch drawn,
// this rank's micro-batches run forward and backward, the gradients averaged over the ranks; the
// stability signals of the step gathered over micro-batches and ranks. Internal to the trainer.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "nn/model/gpt.h"
#include "nn/signals/modality_signals.h"
#include "nn/text/data.h"
#include "nn/train/run_optimizer.h"
#include "nn/train/train_config.h"

namespace qk::nn {

// One step's gradients, in .grad of every parameter.
struct StepGradients {
    double loss = NAN;  // the cross-entropy of the global batch: the mean over all its sequences
    bool backward_done = false;
};

// Draws the global batch and runs this rank's K micro-batches of it, each backward scaled by 1/K
// so that the gradients add up to the gradient of the rank's mean loss (times loss_scale, which
// RunOptimizer::clip divides out again). With several ranks, the last micro-batch's backward also
// starts averaging them over the ranks, and finish_gradients() completes it: every rank then
// holds the gradient of the global batch's mean loss (or, with --zero 1, its shard of it). The
// stability signals go to *stats when given, and split by modality (of the last micro-batch,
// summed over the ranks) to *modality when given too.
StepGradients accumulate_gradients(GPT& model, const TextDataset& data, const TrainConfig& cfg,
                                   Generator& data_gen, RunOptimizer& optimizer,
                                   std::vector<AttentionStats>* stats, double loss_scale,
                                   ModalitySignals* modality = nullptr,
                                   const ModalityVocab& vocab = {});

// The per-layer signals of a metrics.jsonl line.
nlohmann::json stats_to_json(const std::vector<AttentionStats>& stats);

}  // namespace qk::nn
