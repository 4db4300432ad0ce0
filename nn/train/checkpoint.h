// Checkpoints of a run: the model (standard safetensors, nanoGPT names, config and tokenizer in
// __metadata__) and the training state (the optimizer's named tensors, step, sampler and dropout
// RNG states).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "nn/model/gpt.h"
#include "nn/text/data.h"

namespace qk::nn {

// Everything besides the weights that resuming needs.
struct TrainingState {
    int64_t step = 0;                                // steps completed
    uint64_t data_seed = 0, data_counter = 0;        // the batch sampler's generator
    uint64_t dropout_seed = 0, dropout_counter = 0;  // the model's dropout generator
    std::map<std::string, std::string> extra;        // e.g. the training config, as JSON
};

// The tensors of a model's checkpoint: every parameter, the tied LM head saved once (as wte).
void save_model(const std::string& path, const GPT& model, const Tokenizer& tokenizer,
                const std::map<std::string, std::string>& extra_metadata = {});

struct LoadedModel {
    std::unique_ptr<GPT> model;
    Tokenizer tokenizer = Tokenizer::byte_level();
    std::map<std::string, std::string> metadata;
};
// Builds the model from the config in the file and loads every tensor, checking names, shapes
// and dtypes; a missing, extra or mismatched tensor is an error naming it. `precision`, when
// given, replaces the one the model was trained with (how it computes, not what it is); a model
// trained in fp8 loads in bf16 unless fp8 is asked for (its FP8 scales are training state).
LoadedModel load_model(const std::string& path, std::optional<Precision> precision = {});
void load_weights_into(GPT& model, const std::string& path);
// The same from a file already read (path names it in errors).
void load_weights_into(GPT& model, const SafetensorsFile& file, const std::string& path);

// An optimizer's state as a checkpoint holds it: named tensors (AdamW's moments
// `exp_avg.<parameter>` and `exp_avg_sq.<parameter>`, Muon's `muon_momentum.<matrix>`) and the
// number of steps it has taken.
struct OptimizerState {
    std::vector<std::pair<std::string, Tensor>> tensors;
    int64_t steps = 0;
};

void save_training_state(const std::string& path, const OptimizerState& optimizer,
                         const TrainingState& state);
// Reads the state saved at path. `optimizer` says which tensors to expect (names, shapes, dtypes:
// a missing or mismatched one is an error naming it) and receives their saved values and steps.
TrainingState load_training_state(const std::string& path, OptimizerState& optimizer);

}  // namespace qk::nn
