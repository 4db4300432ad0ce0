// Internal to the trainer (not installed: it speaks nlohmann::json). What a --precision fp8 run
// keeps besides its weights: the delayed-scaling state of every FP8 tensor (saved with the
// checkpoint's training state, so that a resumed run scales as an unbroken one), and the step's
// overflow counts for metrics.jsonl.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "nn/model/gpt.h"

namespace qk::nn {

// Every scaling state of model.fp8_scalings() as one JSON object, name -> state.
std::string fp8_state_json(const GPT& model);
// Loads what fp8_state_json wrote. A state for a tensor the model does not scale, or a model
// tensor without a state, is a qk::Error naming it and `origin`.
void load_fp8_state(GPT& model, const std::string& text, const std::string& origin);

// Data-parallel FP8 training: after each step's last backward, every scaling's amaxes of the step
// (one per micro-batch, at most `micro_batches` of them) are replaced by their elementwise max over
// the ranks, in one collective, as Transformer Engine reduces amaxes over the data-parallel group.
// Every rank then holds the same histories and scales (a checkpoint, written by rank 0, holds every
// rank's), and they are those of the whole global batch: the max over the ranks' rows is the
// batch's. Alone, nothing to do.
void sync_fp8_amaxes(GPT& model, int64_t micro_batches);

// The values that reached the format's largest finite value (or Inf, E5M2) in the training casts
// since the last call, summed over the ranks, then reset: per layer {"x", "weight", "grad"} summed
// over the layer's Linears, and with fp8_attention "q", "k" and "logits" (one count per head).
nlohmann::json take_fp8_saturation(GPT& model);

}  // namespace qk::nn
