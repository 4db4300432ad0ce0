#include "nn/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "nn/model/sample.h"
#include "nn/optim/lr_schedule.h"
#include "nn/text/data.h"
#include "nn/train/eval_protocol.h"

namespace qk::nn {

using json = nlohmann::json;

namespace {

// The largest step count and cadence a flag may ask for: far beyond any run (2^40 steps of a
// microsecond each is twelve days), and small enough that step arithmetic cannot overflow.
constexpr int64_t kMaxSteps = int64_t{1} << 40;

// "train: --lr must be a finite number > 0, got -0.003". Flags are named as the command line
// spells them, which is also how config.json and the sweep's TOML name them (with '_' for '-').
void require(bool ok, const char* flag, double value, const char* expected) {
    QK_CHECK(ok, "train: --{} must be {}, got {}", flag, expected, value);
}

void require_count(int64_t value, const char* flag, int64_t lo, int64_t hi) {
    QK_CHECK(value >= lo && value <= hi, "train: --{} must be a whole number in [{}, {}], got {}",
             flag, lo, hi, value);
}

bool finite_at_least(double v, double lo) { return std::isfinite(v) && v >= lo; }

// A JSON integer that fits int64: nlohmann would cast 2.5 or 1e30 (undefined behaviour) silently.
void get_integer(const json& j, const char* key, int64_t& out) {
    const json& v = j.at(key);
    QK_CHECK(v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= INT64_MAX),
             "train config: {} must be a whole number, got {}", key, v.dump());
    out = v.get<int64_t>();
}

// The model's fields that config.json holds as JSON numbers and booleans; the others (norm,
// qk_norm, qk_scale_init, ...) are names, strings. GPTConfig's string form (to_strings, the
// form of a checkpoint's metadata) is the list of fields, so that a new field reaches
// config.json at once, as a string until it is named here.
const std::set<std::string> kModelIntegers{"vocab_size", "block_size", "n_layer",
                                           "n_head",     "n_embd",     "mlp_hidden",
                                           "n_kv_head",  "head_size",  "sliding_window"};
const std::set<std::string> kModelNumbers{
    "dropout",    "lp_p",     "attn_softcap",    "logit_softcap",    "z_loss",
    "rope_theta", "norm_eps", "embedding_scale", "rope_local_theta", "query_pre_attn_scalar"};
const std::set<std::string> kModelBooleans{"bias",     "tie_embeddings",   "qk_scale_per_head",
                                           "qkv_norm", "norm_unit_offset", "fp8_attention"};

json model_to_json(const GPTConfig& m) {
    json j = json::object();
    for (const auto& [key, text] : m.to_strings()) {
        // Written only when on: the config.json of runs from before the switch stays the same
        // (a sweep compares it to resume a run).
        if (key == "fp8_attention" && text == "false") continue;
        // The strings are std::to_string's digits and fmt's shortest round-trip form of a
        // double: read back to the same bits.
        if (kModelIntegers.count(key))
            j[key] = std::stoll(text);
        else if (kModelNumbers.count(key))
            j[key] = std::stod(text);
        else if (kModelBooleans.count(key))
            j[key] = text == "true";
        else
            j[key] = text;
    }
    return j;
}

// The model section as GPTConfig::from_strings reads it (which checks each value): JSON numbers
// and booleans as config.json holds them now, or the strings of files written before.
std::map<std::string, std::string> model_strings(const json& j) {
    QK_CHECK(j.is_object(), "train config: model must be a JSON object, got {}", j.type_name());
    static const std::map<std::string, std::string> known = GPTConfig().to_strings();
    std::map<std::string, std::string> fields;
    for (const auto& [key, v] : j.items()) {
        QK_CHECK(known.count(key), "train config: unknown key 'model.{}'", key);
        if (v.is_string())
            fields[key] = v.get<std::string>();
        else if (v.is_boolean())
            fields[key] = v.get<bool>() ? "true" : "false";
        else if (v.is_number_float())
            fields[key] = fmt::format("{}", v.get<double>());
        else if (v.is_number())  // an integer: its digits as written, whatever its sign or size
            fields[key] = v.dump();
        else
            throw Error(fmt::format(
                "train config: model.{} must be a number, a boolean or a string, got {}", key,
                v.dump()));
    }
    return fields;
}

}  // namespace

// A 300-step run gets a point every 15 steps, the default's 9000 every 450: ~20 per run either way.
int64_t TrainConfig::eval_interval() const {
    return eval_every > 0 ? eval_every : std::max<int64_t>(1, (steps + 19) / 20);
}

double TrainConfig::lr_at(int64_t step) const {
    const int64_t total = schedule_length();
    if (lr_schedule == "wsd") {
        const auto cooldown_steps = static_cast<int64_t>(std::llround(cooldown * total));
        return wsd_lr(step, warmup, cooldown_steps, total, lr, lr_min);
    }
    return cosine_lr(step, warmup, total, lr, lr_min);
}

int64_t TrainConfig::stats_interval() const {
    return stats_every > 0 ? stats_every : std::clamp<int64_t>(steps / 50, 1, 25);
}

std::string describe_attention(const GPTConfig& m) {
    std::string s = "qk_norm=" + to_string(m.qk_norm);
    if (m.qk_norm == QKNorm::layernorm || m.qk_norm == QKNorm::rmsnorm)
        s += fmt::format(" ({})", to_string(m.qk_norm_scope));
    if (m.qk_norm == QKNorm::l2 || m.qk_norm == QKNorm::lp)
        s += m.qk_norm == QKNorm::lp ? fmt::format(" (p={}, g0={})", m.lp_p, m.qk_scale_init)
                                     : fmt::format(" (g0={})", m.qk_scale_init);
    if (m.attn_softcap > 0) s += fmt::format(", soft-cap {}", m.attn_softcap);
    if (m.qkv_norm) s += ", qkv-norm";
    if (m.fp8_attention) s += ", fp8 attention";
    if (m.pos_emb == PosEmb::rope)
        s += fmt::format(", rope (theta {}{})", m.rope_theta,
                         m.qk_norm_order == QKNormOrder::after_rope ? ", norm after" : "");
    return s;
}

std::string describe_run(const TrainConfig& c) {
    const GPTConfig& m = c.model;
    std::string model = fmt::format("L={} H={} C={} T={}, {}, {}, {} blocks", m.n_layer, m.n_head,
                                    m.n_embd, c.context_length(), describe_attention(m),
                                    to_string(m.precision), to_string(m.norm));
    if (!c.init_from.empty()) model = fmt::format("from {}: {}", c.init_from, model);
    if (m.dropout > 0) model += fmt::format(", dropout {}", m.dropout);
    if (m.logit_softcap > 0) model += fmt::format(", logit soft-cap {}", m.logit_softcap);
    if (m.z_loss > 0) model += fmt::format(", z-loss {}", m.z_loss);
    if (m.mlp != MLPKind::gelu || m.mlp_hidden > 0)
        model += fmt::format(", {} MLP {} wide", to_string(m.mlp), m.mlp_width());
    std::string training = fmt::format(
        "B={}{}, {} steps, {} lr {:g} to {:g} (warmup {}), weight decay {:g}", c.batch_size,
        c.grad_accum > 1 ? fmt::format(" in {} micro-batches", c.grad_accum) : "", c.steps,
        c.optimizer, c.lr, c.lr_min, c.warmup, c.weight_decay);
    if (c.qk_clip > 0) training += fmt::format(", QK-Clip tau {:g}", c.qk_clip);
    training += fmt::format(", grad clip {:g}, seed {}, on {}", c.grad_clip, c.seed, c.device);
    return model + "\n" + training;
}

void TrainConfig::validate() const {
    model.validate();
    require_count(batch_size, "batch-size", 1, 1 << 20);
    require_count(grad_accum, "grad-accum", 1, 1 << 20);
    QK_CHECK(batch_size % grad_accum == 0,
             "train: --batch-size {} must be a multiple of --grad-accum {} (each micro-batch has "
             "batch-size / grad-accum sequences)",
             batch_size, grad_accum);
    require(std::isfinite(bucket_mb) && bucket_mb > 0 && bucket_mb <= 1 << 16, "bucket-mb",
            bucket_mb, "a finite number of MB in (0, 65536]");
    require_count(zero, "zero", 0, 1);
    require(std::isfinite(dist_timeout) && dist_timeout > 0, "dist-timeout", dist_timeout,
            "a finite number of seconds > 0");
    require_count(steps, "steps", 1, kMaxSteps);
    require_count(warmup, "warmup", 0, kMaxSteps);
    QK_CHECK(schedule_steps >= 0 && schedule_steps <= steps,
             "train config: schedule_steps must be in [0, steps = {}] (0: the run's own steps), "
             "got {}",
             steps, schedule_steps);  // longer than steps: lr never peaks
    QK_CHECK(lr_schedule == "cosine" || lr_schedule == "wsd",
             "train: --lr-schedule must be cosine or wsd, got '{}'", lr_schedule);
    require(std::isfinite(cooldown) && cooldown > 0 && cooldown <= 1, "cooldown", cooldown,
            "a fraction of the schedule in (0, 1]");
    require(std::isfinite(lr) && lr > 0, "lr", lr, "a finite number > 0");
    require(finite_at_least(lr_min, 0) && lr_min <= lr, "lr-min", lr_min,
            "a finite number in [0, --lr]");
    require(finite_at_least(beta1, 0) && beta1 < 1, "beta1", beta1, "in [0, 1)");
    require(finite_at_least(beta2, 0) && beta2 < 1, "beta2", beta2, "in [0, 1)");
    require(finite_at_least(weight_decay, 0), "weight-decay", weight_decay, "a finite number >= 0");
    QK_CHECK(optimizer == "adamw" || optimizer == "muon",
             "train: --optimizer must be 'adamw' or 'muon', got '{}'", optimizer);
    require(finite_at_least(muon_momentum, 0) && muon_momentum < 1, "muon-momentum", muon_momentum,
            "in [0, 1)");
    QK_CHECK(!(optimizer == "muon" && zero == 1),
             "train: --optimizer muon does not combine with --zero 1 (ZeRO-1 shards AdamW's "
             "moments; Muon orthogonalises whole matrices on every rank): use --zero 0");
    require(qk_clip == 0 || (std::isfinite(qk_clip) && qk_clip > 0), "qk-clip", qk_clip,
            "0 (off) or a finite number > 0");
    QK_CHECK(qk_clip == 0 || model.qk_norm == QKNorm::none,
             "train: --qk-clip {} needs --qk-norm none (QK-Clip bounds the logits of an "
             "unnormalised attention; with a QK-norm they are bounded already), got --qk-norm {}",
             qk_clip, to_string(model.qk_norm));
    require(finite_at_least(grad_clip, 0), "grad-clip", grad_clip,
            "a finite number >= 0 (0 = no clipping)");
    require(diverge_factor == 0 || (std::isfinite(diverge_factor) && diverge_factor > 1),
            "diverge-factor", diverge_factor, "0 (off) or a finite number > 1");
    // Below 2^-24 (fp16's smallest subnormal) every scaled fp16 gradient is 0, and a float32
    // subnormal scale (1e-40) made every weight NaN at the first unscale.
    require(std::isfinite(loss_scale) && loss_scale >= 0x1p-24 && loss_scale <= 0x1p64,
            "loss-scale", loss_scale,
            "a finite number in [2^-24, 2^64] (below 2^-24 every fp16 gradient underflows to 0)");
    require_count(loss_scale_interval, "loss-scale-interval", 1, kMaxSteps);
    require_count(eval_every, "eval-every", 0, kMaxSteps);  // 0: auto
    require_count(eval_batches, "eval-batches", 1, 1 << 20);
    QK_CHECK(eval_protocol == "qknorm" || eval_protocol == "nanogpt",
             "train: --eval-protocol must be qknorm or nanogpt, got '{}'", eval_protocol);
    QK_CHECK(eval_protocol != "nanogpt" || model.block_size >= kNanoGptWindow,
             "train: --eval-protocol nanogpt evaluates windows of {0} tokens, and the model "
             "attends {1} at most: train with --block-size {0} or more (learned positions have no "
             "embedding past the block size, and RoPE never saw the rotations beyond it)",
             kNanoGptWindow, model.block_size);
    require_count(stats_every, "stats-every", 0, kMaxSteps);  // 0: auto
    require_count(checkpoint_every, "checkpoint-every", 1, kMaxSteps);
    require_count(keep_checkpoints, "keep-checkpoints", 1, 1 << 20);
    require_count(sample_tokens, "sample-tokens", 0, kMaxSampleTokens);
    QK_CHECK(context >= 0 && context <= model.block_size,
             "train: --context must be in [0, {}] (0 = the model's block size {}), got {}",
             model.block_size, model.block_size, context);
    QK_CHECK(tokenizer == "char" || tokenizer == "byte" || std::filesystem::exists(tokenizer),
             "train: --tokenizer must be 'char', 'byte' or a tokenizer file (tokenizer.json, "
             "tokenizer.model, a directory holding one, a checkpoint); '{}' is none of them",
             tokenizer);
    modalities.validate();
    // Checked here, with the other flags (a usage error before the run's header), not when the
    // data are opened.
    QK_CHECK(tokenizer != "char" || !std::filesystem::is_directory(data_path),
             "train: --data {} is a directory of token files: --tokenizer must name the tokenizer "
             "that made them (a tokenizer.json, a tokenizer.model or a directory holding one)",
             data_path);
    QK_CHECK(!multimodal() || !std::filesystem::is_directory(data_path),
             "train: images mix into a text file's stream; --data {} is a directory of token "
             "files",
             data_path);
    QK_CHECK(device == "cpu" || device == "cuda",
             "train: --device must be 'cpu' or 'cuda', got '{}'", device);
    QK_CHECK(!tf32 || device == "cuda",
             "train: --tf32 changes the float32 GEMMs of cuBLAS and needs --device cuda, got "
             "--device {}",
             device);
}

std::string TrainConfig::to_json() const {
    json j;
    j["model"] = model_to_json(model);
    j["data_path"] = data_path;
    j["init_from"] = init_from;
    j["context"] = context;
    j["tokenizer"] = tokenizer;
    j["image_fraction"] = modalities.image_fraction;
    j["image_entropy"] = modalities.image_entropy;
    j["image_size"] = modalities.image_size;
    j["image_codes"] = modalities.image_codes;
    j["modality_signals"] = modality_signals;
    j["device"] = device;
    j["tf32"] = tf32;
    j["batch_size"] = batch_size;
    j["grad_accum"] = grad_accum;
    j["steps"] = steps;
    j["warmup"] = warmup;
    j["lr"] = lr;
    j["lr_min"] = lr_min;
    j["lr_schedule"] = lr_schedule;
    j["cooldown"] = cooldown;
    j["beta1"] = beta1;
    j["beta2"] = beta2;
    j["weight_decay"] = weight_decay;
    j["independent_weight_decay"] = independent_weight_decay;
    j["optimizer"] = optimizer;
    j["muon_momentum"] = muon_momentum;
    j["qk_clip"] = qk_clip;
    j["grad_clip"] = grad_clip;
    j["diverge_factor"] = diverge_factor;
    j["loss_scale"] = loss_scale;
    j["loss_scale_interval"] = loss_scale_interval;
    j["eval_every"] = eval_every;
    j["eval_batches"] = eval_batches;
    j["eval_protocol"] = eval_protocol;
    j["stats_every"] = stats_every;
    j["checkpoint_every"] = checkpoint_every;
    j["keep_checkpoints"] = keep_checkpoints;
    j["seed"] = seed;
    j["run_dir"] = run_dir;
    j["sample_tokens"] = sample_tokens;
    // How the ranks share the work: not the math, but a resumed run keeps them unless the
    // command line says otherwise.
    j["schedule_steps"] = schedule_steps;
    j["zero"] = zero;
    j["bucket_mb"] = bucket_mb;
    j["overlap"] = overlap;
    j["dist_timeout"] = dist_timeout;
    return j.dump(2);
}

TrainConfig TrainConfig::from_json(const std::string& text) {
    TrainConfig c;
    // A run's config.json is about 40 values two levels deep: refuse a hostile one before the
    // parser builds a node per bracket.
    const JsonExtent extent = measure_json(text);
    QK_CHECK(extent.max_depth <= 4 && extent.elements <= 10'000,
             "train config: JSON nests {} levels deep with {} elements; a config nests at most 4 "
             "with at most 10000",
             extent.max_depth, extent.elements);
    try {
        json j = json::parse(text);
        QK_CHECK(j.is_object(), "train config: expected a JSON object, got {}", j.type_name());
        c.model = GPTConfig::from_strings(model_strings(j.at("model")));
        j.at("data_path").get_to(c.data_path);
        c.init_from = j.value("init_from", c.init_from);  // added with fine-tuning
        if (j.contains("context")) get_integer(j, "context", c.context);
        j.at("tokenizer").get_to(c.tokenizer);
        // added with the image modality
        c.modalities.image_fraction = j.value("image_fraction", c.modalities.image_fraction);
        c.modalities.image_entropy = j.value("image_entropy", c.modalities.image_entropy);
        if (j.contains("image_size")) get_integer(j, "image_size", c.modalities.image_size);
        if (j.contains("image_codes")) get_integer(j, "image_codes", c.modalities.image_codes);
        c.modality_signals = j.value("modality_signals", c.modality_signals);
        c.device = j.value("device", std::string("cpu"));  // runs saved before devices existed
        c.tf32 = j.value("tf32", false);                   // and before TF32
        get_integer(j, "batch_size", c.batch_size);
        if (j.contains("grad_accum")) get_integer(j, "grad_accum", c.grad_accum);  // added later
        get_integer(j, "steps", c.steps);
        get_integer(j, "warmup", c.warmup);
        j.at("lr").get_to(c.lr);
        j.at("lr_min").get_to(c.lr_min);
        c.lr_schedule = j.value("lr_schedule", c.lr_schedule);  // runs saved before wsd: cosine
        c.cooldown = j.value("cooldown", c.cooldown);
        j.at("beta1").get_to(c.beta1);
        j.at("beta2").get_to(c.beta2);
        j.at("weight_decay").get_to(c.weight_decay);
        j.at("independent_weight_decay").get_to(c.independent_weight_decay);
        c.optimizer = j.value("optimizer", c.optimizer);  // added with Muon
        c.muon_momentum = j.value("muon_momentum", c.muon_momentum);
        c.qk_clip = j.value("qk_clip", c.qk_clip);  // and QK-Clip
        j.at("grad_clip").get_to(c.grad_clip);
        c.diverge_factor = j.value("diverge_factor", c.diverge_factor);  // added later
        c.loss_scale = j.value("loss_scale", c.loss_scale);              // with fp16
        if (j.contains("loss_scale_interval"))
            get_integer(j, "loss_scale_interval", c.loss_scale_interval);
        get_integer(j, "eval_every", c.eval_every);
        get_integer(j, "eval_batches", c.eval_batches);
        c.eval_protocol = j.value("eval_protocol", c.eval_protocol);  // added later
        get_integer(j, "stats_every", c.stats_every);
        get_integer(j, "checkpoint_every", c.checkpoint_every);
        get_integer(j, "keep_checkpoints", c.keep_checkpoints);
        // A seed of -1 would convert silently to 2^64 − 1: JSON integers must fit their field.
        QK_CHECK(j.at("seed").is_number_unsigned(),
                 "train config: seed must be a whole number >= 0, got {}", j.at("seed").dump());
        j.at("seed").get_to(c.seed);
        j.at("run_dir").get_to(c.run_dir);
        get_integer(j, "sample_tokens", c.sample_tokens);
        if (j.contains("schedule_steps")) get_integer(j, "schedule_steps", c.schedule_steps);
        if (j.contains("zero")) get_integer(j, "zero", c.zero);  // saved since resume kept them
        c.bucket_mb = j.value("bucket_mb", c.bucket_mb);
        c.overlap = j.value("overlap", c.overlap);
        c.dist_timeout = j.value("dist_timeout", c.dist_timeout);
        // A key this version does not read is refused, as in a TOML config: a typo ("stpes") or a
        // setting of a newer version must not be silently dropped.
        static const json known = json::parse(TrainConfig().to_json());  // every key it writes
        for (const auto& [key, value] : j.items()) {
            if (known.contains(key)) continue;
            std::vector<std::string> keys;
            for (const auto& [k, v] : known.items()) keys.push_back(k);
            throw Error(fmt::format("train config: unknown key '{}'; the keys are {}", key,
                                    fmt::join(keys, ", ")));
        }
    } catch (const json::exception& e) {
        throw Error(fmt::format("train config: {}", json_error_text(e)));
    }
    c.validate();
    return c;
}

TrainConfig load_run_config(const std::string& run_dir) {
    const std::string path = run_dir + "/config.json";
    QK_CHECK(!std::filesystem::exists(run_dir) || std::filesystem::is_directory(run_dir),
             "resume: '{}' is a file, not a run directory", run_dir);
    QK_CHECK(std::filesystem::exists(path),
             "resume: {} has no config.json (not a qknorm run directory?)", run_dir);
    TrainConfig c = TrainConfig::from_json(read_text_file(path, "resume"));
    c.run_dir = run_dir;  // the directory may have moved, or been named relative to another cwd
    return c;
}

}  // namespace qk::nn
