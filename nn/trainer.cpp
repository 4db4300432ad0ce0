#include "nn/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/plot.h"
#include "nn/sample.h"

namespace qk::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- configuration as JSON -------------------------------------------------------------------

std::string TrainConfig::to_json() const {
    json j;
    j["model"] = model.to_strings();
    j["data_path"] = data_path;
    j["tokenizer"] = tokenizer;
    j["device"] = device;
    j["batch_size"] = batch_size;
    j["steps"] = steps;
    j["warmup"] = warmup;
    j["lr"] = lr;
    j["lr_min"] = lr_min;
    j["beta1"] = beta1;
    j["beta2"] = beta2;
    j["weight_decay"] = weight_decay;
    j["independent_weight_decay"] = independent_weight_decay;
    j["grad_clip"] = grad_clip;
    j["eval_every"] = eval_every;
    j["eval_batches"] = eval_batches;
    j["stats_every"] = stats_every;
    j["checkpoint_every"] = checkpoint_every;
    j["keep_checkpoints"] = keep_checkpoints;
    j["seed"] = seed;
    j["run_dir"] = run_dir;
    j["sample_tokens"] = sample_tokens;
    return j.dump(2);
}

TrainConfig TrainConfig::from_json(const std::string& text) {
    TrainConfig c;
    try {
        json j = json::parse(text);
        c.model = GPTConfig::from_strings(j.at("model").get<std::map<std::string, std::string>>());
        j.at("data_path").get_to(c.data_path);
        j.at("tokenizer").get_to(c.tokenizer);
        c.device = j.value("device", std::string("cpu"));  // runs saved before devices existed
        j.at("batch_size").get_to(c.batch_size);
        j.at("steps").get_to(c.steps);
        j.at("warmup").get_to(c.warmup);
        j.at("lr").get_to(c.lr);
        j.at("lr_min").get_to(c.lr_min);
        j.at("beta1").get_to(c.beta1);
        j.at("beta2").get_to(c.beta2);
        j.at("weight_decay").get_to(c.weight_decay);
        j.at("independent_weight_decay").get_to(c.independent_weight_decay);
        j.at("grad_clip").get_to(c.grad_clip);
        j.at("eval_every").get_to(c.eval_every);
        j.at("eval_batches").get_to(c.eval_batches);
        j.at("stats_every").get_to(c.stats_every);
        j.at("checkpoint_every").get_to(c.checkpoint_every);
        j.at("keep_checkpoints").get_to(c.keep_checkpoints);
        j.at("seed").get_to(c.seed);
        j.at("run_dir").get_to(c.run_dir);
        j.at("sample_tokens").get_to(c.sample_tokens);
    } catch (const json::exception& e) {
        throw Error(fmt::format("train config: {}", e.what()));
    }
    return c;
}

TrainConfig load_run_config(const std::string& run_dir) {
    const std::string path = run_dir + "/config.json";
    QK_CHECK(fs::exists(path), "resume: {} has no config.json (not a qknorm run directory?)",
             run_dir);
    TrainConfig c = TrainConfig::from_json(read_text_file(path));
    c.run_dir = run_dir;  // the directory may have moved, or been named relative to another cwd
    return c;
}

std::string default_data_path() {
    for (const char* candidate :
         {QK_SOURCE_DIR "/data/tinyshakespeare.txt", "data/tinyshakespeare.txt"})
        if (fs::exists(candidate)) return candidate;
    throw Error("train: the bundled data/tinyshakespeare.txt was not found; pass --data FILE");
}

// ---- checkpoints on disk ---------------------------------------------------------------------

namespace {

std::string checkpoint_prefix(const std::string& run_dir, int64_t step) {
    return fmt::format("{}/step-{:06d}", run_dir, step);
}

// Steps that have both files; the model file is written last, so it marks a complete checkpoint.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
    std::vector<int64_t> steps;
    if (!fs::exists(run_dir)) return steps;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
        const std::string name = entry.path().filename().string();
        int64_t step = 0;
        if (std::sscanf(name.c_str(), "step-%ld.model.safetensors", &step) == 1 &&
            name == fmt::format("step-{:06d}.model.safetensors", step) &&
            fs::exists(checkpoint_prefix(run_dir, step) + ".state.safetensors"))
            steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

void write_checkpoint(const TrainConfig& cfg, const GPT& model, const AdamW& opt,
                      const Tokenizer& tok, const TrainingState& state) {
    const std::string prefix = checkpoint_prefix(cfg.run_dir, state.step);
    save_training_state(prefix + ".state.safetensors", model, opt, state);
    save_model(prefix + ".model.safetensors", model, tok, {{"step", std::to_string(state.step)}});
    std::vector<int64_t> steps = checkpoint_steps(cfg.run_dir);
    for (size_t i = 0;
         i + static_cast<size_t>(std::max<int64_t>(cfg.keep_checkpoints, 1)) < steps.size(); ++i) {
        fs::remove(checkpoint_prefix(cfg.run_dir, steps[i]) + ".model.safetensors");
        fs::remove(checkpoint_prefix(cfg.run_dir, steps[i]) + ".state.safetensors");
    }
}

// Keeps the metrics lines of steps <= last_step (a resumed run rewrites what came after), and
// reads back the last training and validation losses kept, so that resuming a run that had
// already finished reports its losses.
void truncate_metrics(const std::string& path, int64_t last_step, double& last_loss,
                      double& last_val_loss) {
    if (!fs::exists(path)) return;
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || j.value("step", int64_t{0}) > last_step) continue;
        kept += line + "\n";
        if (j.contains("loss") && j["loss"].is_number()) last_loss = j["loss"].get<double>();
        if (j.contains("val_loss") && j["val_loss"].is_number())
            last_val_loss = j["val_loss"].get<double>();
    }
    write_file_atomic(path, kept);
}

// ---- the loop's pieces -----------------------------------------------------------------------

double evaluate(GPT& model, const TextDataset& data, const TrainConfig& cfg) {
    NoGradGuard no_grad;
    model.eval();
    Generator gen(cfg.seed ^ 0xe7a1u);  // the same validation batches at every evaluation
    double total = 0;
    for (int64_t i = 0; i < cfg.eval_batches; ++i) {
        Tensor ids, targets;
        data.batch(false, cfg.batch_size, gen, ids, targets);
        ids = ids.to(model.device()), targets = targets.to(model.device());
        total += model.forward(ids, targets).cross_entropy.item();
    }
    model.train();
    return total / static_cast<double>(cfg.eval_batches);
}

void print_progress(int64_t step, int64_t total, double loss, double val_loss, double tokens_per_s,
                    double eta_seconds) {
    const int width = 24, filled = static_cast<int>(width * step / std::max<int64_t>(total, 1));
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::string val = std::isnan(val_loss) ? "  -   " : fmt::format("{:.4f}", val_loss);
    fmt::print(stderr, "\r[{}] step {}/{}  loss {:.4f}  val {}  {:.0f} tok/s  ETA {}   ", bar, step,
               total, loss, val, tokens_per_s, format_duration(eta_seconds));
    std::fflush(stderr);
}

// A NaN or Inf anywhere in the weights or the optimizer moments: such a checkpoint is never
// written.
bool all_finite(const std::vector<Tensor>& tensors) {
    for (const Tensor& t : tensors) {
        bool ok = true;
        const Tensor c = t.to(Device::cpu).contiguous();
        dispatch_float(c.dtype(), [&](auto tag) {
            const auto* data = c.data<decltype(tag)>();
            for (int64_t i = 0; i < t.numel() && ok; ++i) ok = std::isfinite(data[i]);
        });
        if (!ok) return false;
    }
    return true;
}

json stats_to_json(const std::vector<AttentionStats>& stats) {
    json layers = json::array();
    for (const auto& s : stats)
        layers.push_back({{"max_logit", s.max_logit},
                          {"entropy", s.entropy},
                          {"q_norm", s.q_norm},
                          {"k_norm", s.k_norm},
                          {"qk_scale", s.qk_scale}});
    return layers;
}

}  // namespace

std::string format_duration(double seconds) {
    const int s = static_cast<int>(seconds);
    return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, s / 60 % 60)
                     : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

std::string latest_model_checkpoint(const std::string& run_dir) {
    std::vector<int64_t> steps = checkpoint_steps(run_dir);
    return steps.empty() ? "" : checkpoint_prefix(run_dir, steps.back()) + ".model.safetensors";
}

void write_run_plot(const std::string& run_dir);  // run_plot.cpp

TrainResult train(const TrainConfig& cfg_in, bool resume) {
    TrainConfig cfg = cfg_in;
    fs::create_directories(cfg.run_dir);
    const std::string config_path = cfg.run_dir + "/config.json",
                      metrics_path = cfg.run_dir + "/metrics.jsonl";
    QK_CHECK(resume || !fs::exists(config_path),
             "train: {} already holds a run; pass --resume {} to "
             "continue it, or choose another --run-dir",
             cfg.run_dir, cfg.run_dir);
    if (cfg.data_path.empty()) cfg.data_path = default_data_path();
    QK_CHECK(cfg.tokenizer == "char" || cfg.tokenizer == "byte",
             "train: tokenizer must be 'char' or 'byte', got '{}'", cfg.tokenizer);
    QK_CHECK(cfg.steps > 0 && cfg.batch_size > 0 && cfg.eval_every > 0 && cfg.eval_batches > 0 &&
                 cfg.stats_every > 0 && cfg.checkpoint_every > 0,
             "train: steps, batch_size, eval_every, eval_batches, stats_every and checkpoint_every "
             "must be > 0");

    const std::string text = read_text_file(cfg.data_path);
    const Tokenizer tokenizer =
        cfg.tokenizer == "char" ? Tokenizer::char_level(text) : Tokenizer::byte_level();
    cfg.model.vocab_size = tokenizer.vocab_size();
    const TextDataset data(tokenizer.encode(text), cfg.model.block_size);

    QK_CHECK(cfg.device == "cpu" || cfg.device == "cuda",
             "train: device must be 'cpu' or 'cuda', got '{}'", cfg.device);
    const Device device = cfg.device == "cuda" ? Device::cuda : Device::cpu;
    GPT model(cfg.model, cfg.seed);  // initialised on the cpu: the same weights on every device
    model.to(device);
    AdamWOptions adam{.lr = cfg.lr,
                      .beta1 = cfg.beta1,
                      .beta2 = cfg.beta2,
                      .eps = 1e-8,
                      .weight_decay = cfg.weight_decay,
                      .independent_weight_decay = cfg.independent_weight_decay,
                      .lr_max = cfg.lr};
    AdamW optimizer(model.parameters(), adam);
    Generator data_gen(cfg.seed + 1);
    int64_t start_step = 0;
    double resumed_loss = NAN, resumed_val_loss = NAN;
    if (resume) {
        const std::string latest = latest_model_checkpoint(cfg.run_dir);
        QK_CHECK(!latest.empty(), "resume: {} has no complete checkpoint", cfg.run_dir);
        load_weights_into(model, latest);
        const std::string state_path =
            latest.substr(0, latest.size() - std::string(".model.safetensors").size()) +
            ".state.safetensors";
        TrainingState state = load_training_state(state_path, model, optimizer);
        data_gen.set_state(state.data_seed, state.data_counter);
        model.dropout_generator().set_state(state.dropout_seed, state.dropout_counter);
        start_step = state.step;
        truncate_metrics(metrics_path, start_step, resumed_loss, resumed_val_loss);
    } else {
        write_file_atomic(config_path, cfg.to_json());
        // Step 0: the validation loss at initialisation, the reference of Wortsman et al.'s LR
        // sensitivity (`qknorm sweep`).
        write_file_atomic(
            metrics_path,
            json{{"step", 0}, {"val_loss", evaluate(model, data, cfg)}}.dump() + "\n");
    }
    std::ofstream metrics(metrics_path, std::ios::app);
    const auto start_time = std::chrono::steady_clock::now();

    TrainResult result;
    result.steps_done = start_step;  // a resumed run that was already complete reports its steps
    result.final_loss = resumed_loss;
    double last_val = resumed_val_loss, step_seconds_total = 0;
    const double tokens_per_step = static_cast<double>(cfg.batch_size * cfg.model.block_size);
    for (int64_t step = start_step; step < cfg.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        const double lr = cosine_lr(step, cfg.warmup, cfg.steps, cfg.lr, cfg.lr_min);
        Tensor ids, targets;
        data.batch(true, cfg.batch_size, data_gen, ids, targets);
        ids = ids.to(device), targets = targets.to(device);
        const bool with_stats = step % cfg.stats_every == 0 || step + 1 == cfg.steps;
        GPTOutput out = model.forward(ids, targets, with_stats);
        const double loss = out.cross_entropy.item();
        double grad_norm = NAN;
        if (std::isfinite(out.loss.item())) {
            out.loss.backward();
            grad_norm =
                clip_grad_norm(model.parameters(), cfg.grad_clip, /*throw_on_nonfinite=*/false);
        }
        if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
            result.diverged = true;
            result.message = fmt::format(
                "training diverged at step {}: loss {}, gradient norm {}; the last "
                "good checkpoint is kept",
                step + 1, loss, grad_norm);
            metrics << json{{"step", step + 1}, {"loss", loss}, {"diverged", true}}.dump() << "\n";
            break;
        }
        optimizer.step(lr);
        optimizer.zero_grad();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        step_seconds_total += seconds;

        json line{{"step", step + 1},
                  {"loss", loss},
                  {"lr", lr},
                  {"grad_norm", grad_norm},
                  {"tokens_per_s", tokens_per_step / seconds}};
        if ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps) {
            last_val = evaluate(model, data, cfg);
            line["val_loss"] = last_val;
        }
        if (with_stats) line["layers"] = stats_to_json(out.stats);
        metrics << line.dump() << "\n" << std::flush;
        result.final_loss = loss;
        result.steps_done = step + 1;
        if ((step + 1) % cfg.checkpoint_every == 0 || step + 1 == cfg.steps) {
            // The loss was finite before this step's update, but the update itself can overflow
            // (a huge lr · weight decay): check what would be saved.
            if (!all_finite(model.parameters()) || !all_finite(optimizer.state())) {
                result.diverged = true;
                result.message = fmt::format(
                    "training diverged at step {}: the update made a weight or "
                    "an optimizer moment NaN or Inf; the last good checkpoint "
                    "is kept",
                    step + 1);
                break;
            }
            TrainingState state{step + 1,
                                data_gen.seed(),
                                data_gen.counter(),
                                model.dropout_generator().seed(),
                                model.dropout_generator().counter(),
                                {{"train_config", cfg.to_json()}}};
            write_checkpoint(cfg, model, optimizer, tokenizer, state);
        }
        if (cfg.progress) {
            const double mean_step =
                step_seconds_total / static_cast<double>(step + 1 - start_step);
            print_progress(step + 1, cfg.steps, loss, last_val, tokens_per_step / mean_step,
                           mean_step * static_cast<double>(cfg.steps - step - 1));
        }
        if (cfg.stop_after > 0 && step + 1 >= cfg.stop_after) return result;  // as if killed
    }
    if (cfg.progress) fmt::print(stderr, "\n");
    result.final_val_loss = last_val;
    write_run_plot(cfg.run_dir);
    // The marker of a finished run (a sweep skips runs that have one).
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    write_file_atomic(cfg.run_dir + "/result.json", json{{"steps_done", result.steps_done},
                                                         {"final_loss", result.final_loss},
                                                         {"final_val_loss", result.final_val_loss},
                                                         {"diverged", result.diverged},
                                                         {"message", result.message},
                                                         {"seconds", seconds}}
                                                        .dump(2));
    if (!result.diverged && cfg.sample_tokens > 0) {
        Generator gen(cfg.seed);
        SampleOptions options{.max_new_tokens = cfg.sample_tokens, .temperature = 0.8, .top_k = 0};
        // Id 0 is the smallest byte of the text: the newline, for any ordinary text file.
        result.sample = tokenizer.decode(generate(model, {0}, options, gen));
    }
    return result;
}

}  // namespace qk::nn
