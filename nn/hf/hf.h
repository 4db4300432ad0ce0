// Hugging Face model directories in and out (docs/models.md): config.json and model.safetensors
// (or shards listed in model.safetensors.index.json) of GPT2LMHeadModel, Qwen3ForCausalLM,
// Olmo2ForCausalLM and Gemma3ForCausalLM, mapped onto the one configurable GPT of nn/model/gpt.h.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/model/gpt.h"
#include "nn/text/tokenizer.h"

namespace qk::nn {

enum class HFFamily { gpt2, qwen3, olmo2, gemma3 };
std::string architecture_name(HFFamily family);  // "Qwen3ForCausalLM", ...

struct HFConfig {
    HFFamily family;
    GPTConfig config;
};

// Reads config.json as transformers 4.x writes it (rope_theta, rope_local_base_freq,
// sliding_window_pattern) or 5.x (rope_parameters, layer_types). Throws qk::Error naming the file
// and the key for a missing, mistyped or contradictory key, and for any key or value the engine
// does not implement (a RoPE scaling type, MoE, another activation): never ignored silently.
HFConfig read_hf_config(const std::string& config_json_path);
// The config.json of a family for a GPTConfig (5.x form); throws if the config is not one the
// family's transformers class can express.
std::string hf_config_json(HFFamily family, const GPTConfig& config);
// The family whose transformers class computes exactly this model, or throws naming the switch
// that none of them has.
HFFamily hf_family_for(const GPTConfig& config);

// A model directory read into a GPT of the given dtype (float32 or float64): every tensor of the
// checkpoint used exactly once, F32/F64/BF16/F16 converted, GPT-2's Conv1D weights transposed and
// q, k, v concatenated into c_attn. Missing, extra, duplicated or misshapen tensors and shard
// files outside the directory are errors naming the file and the tensor. `precision`, when
// given, is how the model computes (bf16 for inference, say), not what it is.
std::unique_ptr<GPT> load_hf_model(const std::string& dir, DType dtype = kF32,
                                   std::optional<Precision> precision = {});
// The same into a model already built from that config.json (its runtime switches, e.g.
// precision or dropout, may differ: with_runtime_of); the model lives on the cpu.
void load_hf_weights(GPT& model, const std::string& dir);
// Writes config.json and model.safetensors (float32) for `model` into dir, for the family
// hf_family_for(model.config()) picks, and returns it; transformers' from_pretrained loads it.
// dir must be new or empty: a user's own files are never replaced silently. With `overwrite`
// (`qknorm export --force`) a model directory is replaced whole: its config.json and every
// weights file (model.safetensors, the index and its shards) go first, so no stale shard or index
// can outlive the export. A qknorm run directory (checkpoints, metrics.jsonl) is refused even so.
HFFamily save_hf_model(const GPT& model, const std::string& dir, bool overwrite = false);

// The tokenizer a model was trained with, as the files a Hugging Face directory holds for it, so
// that AutoTokenizer gives the ids the model knows: a BPE's tokenizer.json as it is; bytes as a
// byte-level BPE without merges (id = byte); a SentencePiece model as tokenizer.model with a
// tokenizer_config.json naming the class that reads it (no BOS or EOS added, as qknorm's encode).
// Returns the names written, or none when the tokenizer has no Hugging Face form (chars: one id
// per character of a corpus; mixed text and images), with the reason in *why.
std::vector<std::string> save_hf_tokenizer(const Tokenizer& tokenizer, HFFamily family,
                                           const std::string& dir, std::string* why);

}  // namespace qk::nn
