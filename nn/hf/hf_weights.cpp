// The tensors of a Hugging Face model directory <-> the GPT's parameters.
//
// One table (weight_map) says, for each of our parameters, which checkpoint tensors make it:
// the same tensor (a norm gain, an embedding), its transpose (GPT-2's Conv1D stores (in, out)),
// or q_proj, k_proj and v_proj stacked by rows into c_attn. Loading walks it forwards, saving
// backwards, so the two cannot disagree. A checkpoint is hostile input like any other: each
// tensor must be used exactly once, have the shape the config implies, and come from a shard
// file inside the directory.
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "autograd/grad_mode.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "nn/hf/hf.h"
#include "nn/model/checkpoint_files.h"
#include "ops/join.h"

namespace qk::nn {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// One of our parameters and the checkpoint tensors that make it.
struct Mapping {
    std::string ours;
    std::vector<std::string> theirs;  // one, or q, k, v for c_attn
    bool transposed = false;          // GPT-2's Conv1D: stored as (in, out)
};

std::vector<Mapping> gpt2_map(const GPTConfig& c) {
    std::vector<Mapping> m;
    auto same = [&](const std::string& name) { m.push_back({name, {name}}); };
    auto conv1d = [&](const std::string& name) { m.push_back({name, {name}, true}); };
    same("transformer.wte.weight");
    same("transformer.wpe.weight");
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = fmt::format("transformer.h.{}.", i);
        for (const char* norm : {"ln_1", "ln_2"}) {
            same(p + norm + ".weight");
            same(p + norm + ".bias");
        }
        for (const char* linear : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
            conv1d(p + linear + ".weight");
            same(p + linear + ".bias");
        }
    }
    same("transformer.ln_f.weight");
    same("transformer.ln_f.bias");
    return m;
}

// Qwen3, OLMo 2 and Gemma 3 share Llama's names; only the block norms differ.
std::vector<Mapping> llama_map(HFFamily family, const GPTConfig& c) {
    std::vector<Mapping> m{{"transformer.wte.weight", {"model.embed_tokens.weight"}}};
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string ours = fmt::format("transformer.h.{}.", i);
        const std::string theirs = fmt::format("model.layers.{}.", i);
        auto map = [&](const std::string& a, const std::string& b) {
            m.push_back({ours + a + ".weight", {theirs + b + ".weight"}});
        };
        const std::string attn = theirs + "self_attn.";
        m.push_back({ours + "attn.c_attn.weight",
                     {attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"}});
        map("attn.c_proj", "self_attn.o_proj");
        map("attn.q_norm", "self_attn.q_norm");
        map("attn.k_norm", "self_attn.k_norm");
        map("mlp.c_gate", "mlp.gate_proj");
        map("mlp.c_fc", "mlp.up_proj");
        map("mlp.c_proj", "mlp.down_proj");
        switch (family) {
            case HFFamily::qwen3:  // pre-norm: "post_attention" is the norm before the MLP
                map("ln_1", "input_layernorm");
                map("ln_2", "post_attention_layernorm");
                break;
            case HFFamily::olmo2:
                map("post_ln_1", "post_attention_layernorm");
                map("post_ln_2", "post_feedforward_layernorm");
                break;
            case HFFamily::gemma3:
                map("ln_1", "input_layernorm");
                map("post_ln_1", "post_attention_layernorm");
                map("ln_2", "pre_feedforward_layernorm");
                map("post_ln_2", "post_feedforward_layernorm");
                break;
            case HFFamily::gpt2:
                break;
        }
    }
    m.push_back({"transformer.ln_f.weight", {"model.norm.weight"}});
    return m;
}

std::vector<Mapping> weight_map(HFFamily family, const GPTConfig& c) {
    std::vector<Mapping> m = family == HFFamily::gpt2 ? gpt2_map(c) : llama_map(family, c);
    if (!c.tie_embeddings) m.push_back({"lm_head.weight", {"lm_head.weight"}});
    return m;
}

// Every tensor of the directory by name, with the file it came from.
struct Checkpoint {
    std::map<std::string, std::pair<Tensor, std::string>> tensors;
    void add(const std::string& file, const SafetensorsFile& f) {
        for (const auto& [name, t] : f.tensors) {
            const auto [it, fresh] = tensors.emplace(name, std::pair{t, file});
            QK_CHECK(fresh, "{}: tensor '{}' is also in {}", file, name, it->second.second);
        }
    }
};

// The shard files model.safetensors.index.json names, relative to the directory and inside it
// ("./model-00001-of-00002.safetensors" is the same file, as transformers reads it).
std::vector<std::string> shard_files(const std::string& index_path,
                                     std::map<std::string, std::string>& weight_map_out) {
    json index;
    try {
        const std::string text = read_regular_file(index_path, "shard index", 100 << 20);
        check_json_extent(text, index_path, 16, uint64_t{16} << 20);
        index = json::parse(text);
    } catch (const json::exception& e) {
        throw Error(fmt::format("{}: not valid JSON: {}", index_path, json_error_text(e)));
    }
    QK_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "{}: must be an object with a 'weight_map' object", index_path);
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) {
        QK_CHECK(file.is_string(), "{}: weight_map['{}'] must be a file name, got {}", index_path,
                 name, file.dump());
        const std::string f = file.get<std::string>();
        const fs::path normal = fs::path(f).lexically_normal();
        const bool inside = !f.empty() && normal.is_relative() && !normal.has_root_name() &&
                            *normal.begin() != ".." && normal != "." && normal.has_filename();
        QK_CHECK(inside, "{}: weight_map['{}'] = '{}' points outside the model directory",
                 index_path, name, f);
        weight_map_out[name] = normal.string();
        files.insert(normal.string());
    }
    return {files.begin(), files.end()};
}

// transformers' order: model.safetensors when it is there (an index beside it is not read),
// else the index and its shards.
Checkpoint read_checkpoint(const std::string& dir) {
    Checkpoint ck;
    const std::string single = dir + "/model.safetensors";
    const std::string index_path = dir + "/model.safetensors.index.json";
    if (fs::exists(single) || !fs::exists(index_path)) {
        QK_CHECK(fs::exists(single),
                 "{}: neither model.safetensors nor "
                 "model.safetensors.index.json is there",
                 dir);
        ck.add(single, load_safetensors(single));
        return ck;
    }
    std::map<std::string, std::string> listed;
    for (const std::string& file : shard_files(index_path, listed))
        ck.add(dir + "/" + file, load_safetensors(dir + "/" + file));
    for (const auto& [name, entry] : ck.tensors) {
        const auto it = listed.find(name);
        QK_CHECK(it != listed.end() && dir + "/" + it->second == entry.second,
                 "{}: tensor '{}' is in {} but the index {}", index_path, name, entry.second,
                 it == listed.end() ? "does not list it" : "says " + it->second);
    }
    for (const auto& [name, file] : listed)
        QK_CHECK(ck.tensors.count(name), "{}: lists tensor '{}' in {}, which does not hold it",
                 index_path, name, file);
    return ck;
}

// The checkpoint must hold at least the model's matrices (min_parameter_values), checked before
// the model is built: a config.json that says vocab_size 2^24 beside a 130 kB file is refused,
// not allocated as a 137 GB model.
void check_checkpoint_holds(const Checkpoint& ck, const HFConfig& hf, const std::string& dir) {
    const GPTConfig& c = hf.config;
    const double needed = min_parameter_values(c);
    double held = 0;
    for (const auto& [name, entry] : ck.tensors) held += static_cast<double>(entry.first.numel());
    QK_CHECK(held >= needed,
             "{}: config.json describes a model of at least {:.0f} weights (vocab_size {}, "
             "hidden_size {}, {} layers, MLP width {}), but the checkpoint holds {:.0f}; the "
             "config does not belong to these weights",
             dir, needed, c.vocab_size, c.n_embd, c.n_layer, c.mlp_width(), held);
}

// The checkpoint's names as the map writes them: GPT-2 files from the Hub have no "transformer."
// prefix, and old ones keep the causal-mask buffers attn.bias / attn.masked_bias (not weights).
void normalise_gpt2_names(Checkpoint& ck) {
    Checkpoint out;
    for (auto& [name, entry] : ck.tensors) {
        const bool mask_buffer = name.size() > 10 && (name.ends_with(".attn.bias") ||
                                                      name.ends_with(".attn.masked_bias"));
        if (mask_buffer) continue;
        const bool bare = !name.starts_with("transformer.") && name != "lm_head.weight";
        const std::string full = bare ? "transformer." + name : name;
        QK_CHECK(out.tensors.emplace(full, entry).second,
                 "{}: tensor '{}' appears with and without the 'transformer.' prefix", entry.second,
                 full);
    }
    ck = std::move(out);
}

// Takes a tensor out of the checkpoint (each is used once), checked against the expected shape.
Tensor take(Checkpoint& ck, const std::string& name, const Shape& expected, const std::string& dir,
            const std::string& arch) {
    const auto it = ck.tensors.find(name);
    QK_CHECK(it != ck.tensors.end(), "{}: tensor '{}' is missing ({} with this config.json has it)",
             dir, name, arch);
    const auto [t, file] = it->second;
    QK_CHECK(t.shape() == expected && t.dtype() != kI32,
             "{}: tensor '{}' is {} {}; {} with this config.json needs a float tensor of shape {}",
             file, name, t.dtype(), t.shape(), arch, expected);
    ck.tensors.erase(it);
    return t;
}

// The tensors of dir (read into `ck`) into `model`, built from `hf` (its config.json).
void load_weights(GPT& model, Checkpoint ck, const std::string& dir, const HFConfig& hf) {
    const std::string arch = architecture_name(hf.family);
    if (hf.family == HFFamily::gpt2) normalise_gpt2_names(ck);
    const DType dtype = model.wte->weight.dtype();
    std::map<std::string, Tensor> params;
    for (const auto& [name, p] : model.named_parameters()) params[name] = p;
    NoGradGuard no_grad;
    const int64_t widths[3] = {hf.config.q_width(), hf.config.kv_width(), hf.config.kv_width()};
    for (const Mapping& m : weight_map(hf.family, hf.config)) {
        const auto it = params.find(m.ours);
        QK_CHECK(it != params.end(), "load_hf_model: the map names '{}', which the model lacks",
                 m.ours);
        const Tensor& p = it->second;
        Tensor value;
        if (m.theirs.size() == 3) {  // q, k, v stacked by rows
            std::vector<Tensor> parts;
            for (size_t i = 0; i < 3; ++i)
                parts.push_back(
                    take(ck, m.theirs[i], {widths[i], p.size(1)}, dir, arch).to(p.dtype()));
            value = cat(parts, 0);
        } else {
            Shape stored = p.shape();
            if (m.transposed) std::swap(stored[0], stored[1]);
            value = take(ck, m.theirs[0], stored, dir, arch).to(p.dtype());
            if (m.transposed) value = value.t().contiguous();
        }
        copy_into(p, value);
        params.erase(it);
    }
    QK_CHECK(params.empty(),
             "load_hf_model: {} parameter(s) of the model have no source, e.g. '{}'", params.size(),
             params.empty() ? "" : params.begin()->first);
    // A tied head may be stored anyway; it must then be the embedding itself.
    if (hf.config.tie_embeddings && ck.tensors.count("lm_head.weight")) {
        const auto [head, file] = ck.tensors.at("lm_head.weight");
        QK_CHECK(head.shape() == model.wte->weight.shape() &&
                     head.to(dtype).to_vector<double>() == model.wte->weight.to_vector<double>(),
                 "{}: lm_head.weight differs from the embedding, but config.json ties them "
                 "(tie_word_embeddings)",
                 file);
        ck.tensors.erase("lm_head.weight");
    }
    if (!ck.tensors.empty()) {
        const auto& [name, entry] = *ck.tensors.begin();
        throw Error(
            fmt::format("{}: tensor '{}' is not part of {} with this config.json ({} "
                        "such tensor(s))",
                        entry.second, name, arch, ck.tensors.size()));
    }
}

}  // namespace

std::unique_ptr<GPT> load_hf_model(const std::string& dir, DType dtype,
                                   std::optional<Precision> precision) {
    HFConfig hf = read_hf_config(dir + "/config.json");
    if (precision) {
        hf.config.precision = *precision;
        hf.config.validate();
    }
    Checkpoint ck = read_checkpoint(dir);
    check_checkpoint_holds(ck, hf, dir);
    auto model = std::make_unique<GPT>(hf.config, 0, dtype);
    load_weights(*model, std::move(ck), dir, hf);
    return model;
}

void load_hf_weights(GPT& model, const std::string& dir) {
    const HFConfig hf = read_hf_config(dir + "/config.json");
    const std::string difference =
        first_difference(with_runtime_of(hf.config, model.config()), model.config());
    QK_CHECK(difference.empty(),
             "load_hf_weights: the model is not the one {}/config.json describes ({}: theirs vs "
             "the model's)",
             dir, difference);
    load_weights(model, read_checkpoint(dir), dir, hf);
}

namespace {

// The files of a Hugging Face model directory that an export replaces, and would otherwise leave
// stale: the config, the single weights file, the index and its shards, and the tokenizer's files
// (a source's tokenizer.json beside a model trained with another tokenizer would load with it).
bool model_file(const std::string& name) {
    static const std::set<std::string> names{
        "config.json",      "model.safetensors", "model.safetensors.index.json",
        "tokenizer.json",   "tokenizer.model",   "tokenizer_config.json",
        "vocab.json",       "merges.txt",        "special_tokens_map.json",
        "added_tokens.json"};
    const bool shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                       name.size() > 12 && name.substr(name.size() - 12) == ".safetensors";
    return names.count(name) || shard;
}

// Refuses what an export must not write into; with `overwrite`, clears the model's own files.
void prepare_export_dir(const std::string& dir, bool overwrite) {
    if (!fs::exists(dir)) return;
    QK_CHECK(fs::is_directory(dir), "export --hf: {} exists and is not a directory", dir);
    QK_CHECK(checkpoint_steps(dir).empty() && !fs::exists(fs::path(dir) / "metrics.jsonl"),
             "export --hf: {} is a qknorm run directory (checkpoints, metrics.jsonl); its files "
             "are never replaced: export into a directory of its own",
             dir);
    std::vector<std::string> present;
    for (const auto& entry : fs::directory_iterator(dir))
        present.push_back(entry.path().filename());
    std::sort(present.begin(), present.end());
    if (present.empty()) return;
    QK_CHECK(overwrite,
             "export --hf: {} is not empty (it holds {}); export into a new or empty directory, "
             "or pass --force to replace the model in it (config.json, every weights file and "
             "the tokenizer's files)",
             dir, fmt::join(present, ", "));
    for (const std::string& name : present)
        if (model_file(name)) fs::remove(fs::path(dir) / name);
}

}  // namespace

HFFamily save_hf_model(const GPT& model, const std::string& dir, bool overwrite) {
    const GPTConfig& c = model.config();
    const HFFamily family = hf_family_for(c);
    prepare_export_dir(dir, overwrite);
    std::map<std::string, Tensor> params;
    for (const auto& [name, p] : model.named_parameters()) params[name] = p;
    std::vector<std::pair<std::string, Tensor>> tensors;
    const int64_t widths[3] = {c.q_width(), c.kv_width(), c.kv_width()};
    for (const Mapping& m : weight_map(family, c)) {
        const Tensor p = params.at(m.ours).detach().to(Device::cpu).to(kF32);
        if (m.theirs.size() == 3) {
            for (int64_t i = 0, row = 0; i < 3; row += widths[i++])
                tensors.emplace_back(m.theirs[i], p.narrow(0, row, widths[i]).contiguous());
        } else {
            tensors.emplace_back(m.theirs[0], m.transposed ? p.t().contiguous() : p);
        }
    }
    fs::create_directories(dir);
    save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
    write_file_atomic(dir + "/config.json", hf_config_json(family, c));
    return family;
}

}  // namespace qk::nn
