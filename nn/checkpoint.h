// Checkpoints of a run: the model (standard safetensors, nanoGPT names, config and tokenizer in
// __metadata__) and the training state (AdamW moments, step, sampler and dropout RNG states).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"

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
// and dtypes; a missing, extra or mismatched tensor is an error naming it.
LoadedModel load_model(const std::string& path);
void load_weights_into(GPT& model, const std::string& path);

void save_training_state(const std::string& path, const GPT& model, const AdamW& optimizer,
                         const TrainingState& state);
TrainingState load_training_state(const std::string& path, GPT& model, AdamW& optimizer);

}  // namespace qk::nn
