#include "nn/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "core/safetensors.h"

namespace qk::nn {

namespace {

// A whole number in [0, 2^63): std::stoull would take "-1" as 2^64 − 1 and "12abc" as 12.
uint64_t parse_u64(const std::map<std::string, std::string>& m, const std::string& key,
                   const std::string& path) {
    auto it = m.find(key);
    QK_CHECK(it != m.end(), "checkpoint {}: metadata '{}' is missing", path, key);
    const std::string& text = it->second;
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    QK_CHECK(ec == std::errc() && end == text.data() + text.size() &&
                 value <= static_cast<uint64_t>(INT64_MAX),
             "checkpoint {}: metadata '{}' = '{}' is not a whole number in [0, 2^63)", path, key,
             text);
    return value;
}

void check_matches(const std::string& path, const std::string& name, const Tensor& stored,
                   const Tensor& expected) {
    QK_CHECK(stored.shape() == expected.shape() && stored.dtype() == expected.dtype(),
             "checkpoint {}: tensor '{}' is {} {}, the model expects {} {}", path, name,
             stored.dtype(), stored.shape(), expected.dtype(), expected.shape());
}

}  // namespace

// The blocks' matrices (c_attn (Wq + 2 Wkv) × C, c_proj C × Wq, the MLP 2 or, gated, 3 matrices
// of C × hidden), the token table and, with learned positions only, the position table: RoPE
// models have no wpe. Norms, biases and g add more, so this is a lower bound, in double so that
// a hostile config cannot overflow it.
void save_model(const std::string& path, const GPT& model, const Tokenizer& tokenizer,
                const std::map<std::string, std::string>& extra_metadata) {
    auto metadata = model.config().to_strings();
    metadata["tokenizer"] = tokenizer.serialize();
    metadata["format"] = "qknorm-gpt";
    for (const auto& [k, v] : extra_metadata) metadata[k] = v;
    save_safetensors(path, model.named_parameters(), metadata);
}

void load_weights_into(GPT& model, const std::string& path) {
    load_weights_into(model, load_safetensors(path), path);
}

void load_weights_into(GPT& model, const SafetensorsFile& file, const std::string& path) {
    auto params = model.named_parameters();
    // Every check before the first copy, so that a bad file leaves the model untouched; each
    // error names the tensor (a bare count mismatch would not say which one).
    for (const auto& [name, param] : params) {
        QK_CHECK(file.contains(name), "checkpoint {}: tensor '{}' is missing", path, name);
        check_matches(path, name, file.get(name), param);
    }
    for (const auto& [name, stored] : file.tensors) {
        const bool known = std::any_of(params.begin(), params.end(),
                                       [&](const auto& p) { return p.first == name; });
        QK_CHECK(known, "checkpoint {}: tensor '{}' ({} {}) is not a parameter of this model", path,
                 name, stored.dtype(), stored.shape());
    }
    for (auto& [name, param] : params) copy_into(param, file.get(name));
}

LoadedModel load_model(const std::string& path, std::optional<Precision> precision) {
    SafetensorsFile file = load_safetensors(path);
    QK_CHECK(file.metadata.count("tokenizer"),
             "checkpoint {}: no tokenizer in __metadata__ (not a "
             "qknorm model checkpoint?)",
             path);
    LoadedModel out;
    GPTConfig config = GPTConfig::from_strings(file.metadata);
    // The config comes from the file too: bound the model it asks for by the values the file
    // holds before allocating it (a hostile n_embd = 10^9 would otherwise allocate exabytes).
    double stored = 0;
    for (const auto& [name, t] : file.tensors) stored += static_cast<double>(t.numel());
    const double needed = min_parameter_values(config);
    QK_CHECK(needed <= stored,
             "checkpoint {}: its config (L={}, C={}, V={}, T={}, {} positions) needs at least "
             "{:.0f} parameter values, the file holds {:.0f}",
             path, config.n_layer, config.n_embd, config.vocab_size, config.block_size,
             to_string(config.pos_emb), needed, stored);
    // A model trained in FP8 computes in bf16 unless asked otherwise: its FP8 scales are training
    // state (the run's state file), not part of the model.
    if (!precision && config.precision == Precision::fp8) precision = Precision::bf16;
    if (precision) config.precision = *precision;
    if (config.precision != Precision::fp8) config.fp8_attention = false;
    out.model = std::make_unique<GPT>(config, 0);
    out.tokenizer = Tokenizer::deserialize(file.metadata.at("tokenizer"));
    // Fewer is a fine-tuned import: its embedding keeps the rows the tokenizer does not use.
    QK_CHECK(out.tokenizer.vocab_size() <= config.vocab_size,
             "checkpoint {}: tokenizer has {} symbols, more than the config's vocab_size {}", path,
             out.tokenizer.vocab_size(), config.vocab_size);
    out.metadata = file.metadata;
    load_weights_into(*out.model, file, path);
    return out;
}

void save_training_state(const std::string& path, const OptimizerState& optimizer,
                         const TrainingState& state) {
    std::map<std::string, std::string> metadata = state.extra;
    metadata["step"] = std::to_string(state.step);
    metadata["optimizer_steps"] = std::to_string(optimizer.steps);
    metadata["data_seed"] = std::to_string(state.data_seed);
    metadata["data_counter"] = std::to_string(state.data_counter);
    metadata["dropout_seed"] = std::to_string(state.dropout_seed);
    metadata["dropout_counter"] = std::to_string(state.dropout_counter);
    save_safetensors(path, optimizer.tensors, metadata);
}

TrainingState load_training_state(const std::string& path, OptimizerState& optimizer) {
    SafetensorsFile file = load_safetensors(path);
    for (auto& [key, expected] : optimizer.tensors) {
        QK_CHECK(file.contains(key), "checkpoint {}: optimizer tensor '{}' is missing", path, key);
        check_matches(path, key, file.get(key), expected);
        expected = file.get(key);
    }
    TrainingState state;
    state.step = static_cast<int64_t>(parse_u64(file.metadata, "step", path));
    state.data_seed = parse_u64(file.metadata, "data_seed", path);
    state.data_counter = parse_u64(file.metadata, "data_counter", path);
    state.dropout_seed = parse_u64(file.metadata, "dropout_seed", path);
    state.dropout_counter = parse_u64(file.metadata, "dropout_counter", path);
    optimizer.steps = static_cast<int64_t>(parse_u64(file.metadata, "optimizer_steps", path));
    state.extra = file.metadata;
    return state;
}

}  // namespace qk::nn
