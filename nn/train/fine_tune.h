// Fine-tuning: a training run that starts from a Hugging Face model directory
// (TrainConfig::init_from, `qknorm train --init-from DIR`; docs/models.md#fine-tuning-one).
#pragma once

#include "nn/model/gpt.h"
#include "nn/train/train_config.h"

namespace qk::nn {

// The training window an imported model gets when --context is not given, if its block_size is
// longer (nanoGPT crops GPT-2 to its block_size the same way): a 40,960-token window would not
// fit a CPU's batch.
inline constexpr int64_t kDefaultFineTuneContext = 1024;

// With init_from set: cfg.model becomes the architecture its config.json describes, keeping the
// runtime switches cfg.model had (precision, fused attention, dropout, z-loss), and a context of
// 0 becomes min(block_size, kDefaultFineTuneContext). Rank 0 reads the file and hands the result
// to the others. Running it twice changes nothing more. Without init_from it does nothing.
void import_model_config(TrainConfig& cfg);

// The weights of cfg.init_from into `model` (built from the imported config, on the cpu): read on
// rank 0, sent to the others.
void import_model_weights(const TrainConfig& cfg, GPT& model);

}  // namespace qk::nn
