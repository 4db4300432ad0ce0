#include "nn/trainer.h"

#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "autograd/grad_mode.h"
#include "core/distributed.h"
#include "core/factory.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/data_parallel.h"
#include "nn/metrics_file.h"
#include "nn/plot.h"
#include "nn/qk_clip.h"
#include "nn/run_control.h"
#include "nn/run_optimizer.h"
#include "nn/sample.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace qk::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The installed copy first: an installed library must not need its source tree.
std::string default_data_path() {
    for (const char* candidate :
         {QK_DATA_DIR "/tinyshakespeare.txt", QK_SOURCE_DIR "/data/tinyshakespeare.txt",
          "data/tinyshakespeare.txt"})
        if (fs::exists(candidate)) return candidate;
    throw Error("train: the bundled data/tinyshakespeare.txt was not found; pass --data FILE");
}

// ---- checkpoints on disk ---------------------------------------------------------------------

namespace {

std::string checkpoint_prefix(const std::string& run_dir, int64_t step) {
    return fmt::format("{}/step-{:06d}", run_dir, step);
}

// The step of a checkpoint file named exactly "step-NNNNNN.<kind>.safetensors", or none.
std::optional<int64_t> step_of(const std::string& name, const char* kind) {
    int64_t step = 0;
    const std::string pattern = fmt::format("step-%ld.{}.safetensors", kind);
    if (std::sscanf(name.c_str(), pattern.c_str(), &step) == 1 &&
        name == fmt::format("step-{:06d}.{}.safetensors", step, kind))
        return step;
    return std::nullopt;
}

// Steps that have both files; the model file is written last, so it marks a complete checkpoint.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
    std::vector<int64_t> steps;
    if (!fs::exists(run_dir)) return steps;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
        const std::optional<int64_t> step = step_of(entry.path().filename().string(), "model");
        if (step && fs::exists(checkpoint_prefix(run_dir, *step) + ".state.safetensors"))
            steps.push_back(*step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

// Collective (with --zero 1 the moments are gathered first); rank 0 writes.
void write_checkpoint(const TrainConfig& cfg, const GPT& model, const RunOptimizer& optimizer,
                      const Tokenizer& tok, const TrainingState& state) {
    const OptimizerState opt = optimizer.state();
    if (!dist::is_root()) return;
    const std::string prefix = checkpoint_prefix(cfg.run_dir, state.step);
    save_training_state(prefix + ".state.safetensors", opt, state);
    save_model(prefix + ".model.safetensors", model, tok, {{"step", std::to_string(state.step)}});
    std::vector<int64_t> steps = checkpoint_steps(cfg.run_dir);
    for (size_t i = 0;
         i + static_cast<size_t>(std::max<int64_t>(cfg.keep_checkpoints, 1)) < steps.size(); ++i) {
        fs::remove(checkpoint_prefix(cfg.run_dir, steps[i]) + ".model.safetensors");
        fs::remove(checkpoint_prefix(cfg.run_dir, steps[i]) + ".state.safetensors");
    }
}

// What a resumed run reads back from metrics.jsonl: the last training and validation losses
// (so that resuming a finished run reports them) and the lowest training loss (the reference of
// the divergence check, so that a resumed run takes the decisions an unbroken one would).
struct MetricsSoFar {
    double last_loss = NAN, last_val_loss = NAN, min_loss = INFINITY;
};

// Keeps the metrics lines of steps <= last_step (a resumed run rewrites what came after). A line
// that is not a JSON object with a whole step (the half-written last line of a killed run, or an
// edit) is dropped with a warning: the metrics are a log, and the checkpoint is what resumes.
MetricsSoFar truncate_metrics(const std::string& run_dir, int64_t last_step) {
    MetricsSoFar so_far;
    const MetricsFile file = read_metrics(run_dir);
    const std::string path = run_dir + "/metrics.jsonl";
    for (const int64_t number : file.malformed_lines)
        fmt::print(stderr, "resume: dropping line {} of {}: not a metrics record\n", number, path);
    std::string kept;
    for (const MetricsRecord& r : file.records) {
        const json& j = r.record;
        if (j["step"].get<int64_t>() > last_step) continue;
        kept += r.text + "\n";
        if (j.contains("loss") && j["loss"].is_number()) {
            so_far.last_loss = j["loss"].get<double>();
            so_far.min_loss = std::min(so_far.min_loss, so_far.last_loss);
        }
        if (j.contains("val_loss") && j["val_loss"].is_number())
            so_far.last_val_loss = j["val_loss"].get<double>();
    }
    write_file_atomic(path, kept);
    return so_far;
}

// The files a run writes into its directory, by name.
bool is_run_file(const std::string& name) {
    static const std::set<std::string> fixed{"config.json", "metrics.jsonl", "plot.svg",
                                             "result.json"};
    return fixed.count(name) || step_of(name, "model") || step_of(name, "state");
}

// A temporary file this program wrote (temporary_path: one of the run's files + ".tmp." + the
// id of a process) whose process no longer runs: the leftover of a kill. Anything else, a user's
// "notes.tmp.txt" or a folder, is never one.
bool is_leftover_temporary(const fs::directory_entry& entry) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.rfind(".tmp.");
    if (tmp == std::string::npos || !entry.is_regular_file() || entry.is_symlink()) return false;
    const std::string target = name.substr(0, tmp), pid_text = name.substr(tmp + 5);
    if (!is_run_file(target) || pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text[0] == '0')
        return false;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    return pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// A kill leaves a checkpoint's temporary file and, between the two files of a checkpoint, a
// state file without its model (the model is written last). Neither is ever read: remove them
// when a run starts or resumes. Nothing else in the directory is touched.
void remove_leftovers(const std::string& run_dir) {
    std::vector<fs::path> leftovers;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
        const std::string name = entry.path().filename().string();
        const std::optional<int64_t> state_step = step_of(name, "state");
        if (is_leftover_temporary(entry))
            leftovers.push_back(entry.path());
        else if (state_step && entry.is_regular_file() && !entry.is_symlink() &&
                 !fs::exists(checkpoint_prefix(run_dir, *state_step) + ".model.safetensors"))
            leftovers.push_back(entry.path());
    }
    for (const fs::path& p : leftovers) fs::remove(p);
}

// Makes run_dir ready and says how the run starts: resume from its latest checkpoint, or from
// scratch. A directory whose run stopped before its first checkpoint has nothing to resume: it
// is started again in place, with a notice, whether --resume was given or not.
bool prepare_run_dir(const TrainConfig& cfg, bool resume) {
    remove_leftovers(cfg.run_dir);
    const bool has_run = fs::exists(cfg.run_dir + "/config.json");
    const bool has_checkpoint = !latest_model_checkpoint(cfg.run_dir).empty();
    QK_CHECK(resume || !has_run || !has_checkpoint,
             "train: {} already holds a run; pass --resume {} to continue it, or choose another "
             "--run-dir",
             cfg.run_dir, cfg.run_dir);
    if (has_run && !has_checkpoint)
        fmt::print(stderr,
                   "train: {} holds a run that stopped before its first checkpoint: starting it "
                   "again from step 0{}\n",
                   cfg.run_dir, resume ? " with its saved configuration" : "");
    return resume && has_checkpoint;
}

// Why this step's loss stops the run ("" if it does not): non-finite, or a spike above
// diverge_factor × the lowest loss so far.
std::string divergence(double loss, double grad_norm, double min_loss, double factor) {
    if (!std::isfinite(loss) || !std::isfinite(grad_norm))
        return fmt::format("loss {}, gradient norm {}", loss, grad_norm);
    if (factor > 0 && loss > factor * min_loss)
        return fmt::format(
            "loss {:.4g} is above {:g} x the lowest loss so far, {:.4g} "
            "(--diverge-factor)",
            loss, factor, min_loss);
    return "";
}

// ---- the loop's pieces -----------------------------------------------------------------------

double evaluate(GPT& model, const TextDataset& data, const TrainConfig& cfg) {
    NoGradGuard no_grad;
    model.eval();
    Generator gen(cfg.seed ^ 0xe7a1u);  // the same validation batches at every evaluation
    double total = 0;
    for (int64_t i = 0; i < cfg.eval_batches; ++i) {
        Tensor ids, targets;
        data.batch(false, cfg.batch_size, gen, ids, targets);  // every rank draws every batch,
        if (i % dist::world_size() != dist::rank()) continue;  // and evaluates its share
        ids = ids.to(model.device()), targets = targets.to(model.device());
        total += model.forward(ids, targets).cross_entropy.item();
    }
    model.train();
    return dist::all_reduce_sum(total) / static_cast<double>(cfg.eval_batches);
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

// The stability signals of the whole global batch: the max over ranks of max |s|, the mean over
// ranks of the means (each rank saw as many rows).
void reduce_stats(std::vector<AttentionStats>& stats) {
    if (dist::world_size() == 1) return;
    const double inverse_ranks = 1.0 / dist::world_size();
    for (AttentionStats& s : stats) {
        s.max_logit = dist::all_reduce_max(s.max_logit);
        s.entropy = dist::all_reduce_sum(s.entropy) * inverse_ranks;
        s.q_norm = dist::all_reduce_sum(s.q_norm) * inverse_ranks;
        s.k_norm = dist::all_reduce_sum(s.k_norm) * inverse_ranks;
        for (double& head : s.head_max_logit) head = dist::all_reduce_max(head);
    }
}

// What every rank must agree on before the first step: the saved config and the knobs that
// change the collectives each rank makes.
std::string replica_settings(const TrainConfig& cfg) {
    json j = json::parse(cfg.to_json());
    j["bucket_mb"] = cfg.bucket_mb;
    j["overlap"] = cfg.overlap;
    j["dist_timeout"] = cfg.dist_timeout;
    j["zero"] = cfg.zero;
    j["ranks"] = dist::world_size();
    return j.dump();
}

// Rank r's rows of micro-batch k of the global batch (B, T): micro-batches of b = B / (N·K)
// rows, micro-batch k of rank r at rows [(k·N + r)·b, (k·N + r + 1)·b). Over all ranks and
// micro-batches they are the global batch, each row once.
Tensor micro_rows(const Tensor& batch, int64_t k, int64_t micro_size) {
    const int64_t index = k * dist::world_size() + dist::rank();
    return batch.narrow(0, index * micro_size, micro_size).contiguous();
}

// Tests of data-parallel faults: QK_FAULT_INJECT="kill:R:S" (or "stop:R:S") makes rank R
// SIGKILL (or SIGSTOP) itself at the start of step S, as a crashed (or frozen) process would.
void inject_fault(int64_t step) {
    static const char* spec = std::getenv("QK_FAULT_INJECT");
    if (!spec) return;
    char what[8] = {};
    long fault_rank = -1, fault_step = -1;
    if (std::sscanf(spec, "%4[a-z]:%ld:%ld", what, &fault_rank, &fault_step) != 3) return;
    if (fault_rank != dist::rank() || fault_step != step) return;
    std::raise(std::string(what) == "stop" ? SIGSTOP : SIGKILL);
}

// A micro-batch's stats joined to those of the earlier ones (none yet: so_far is empty): the
// per-head max |s| (what QK-Clip reads) over all of them; the other signals are the latest's.
void merge_stats(std::vector<AttentionStats>& so_far, std::vector<AttentionStats> micro) {
    if (!so_far.empty())
        for (size_t layer = 0; layer < micro.size(); ++layer)
            for (size_t h = 0; h < micro[layer].head_max_logit.size(); ++h)
                micro[layer].head_max_logit[h] =
                    std::max(micro[layer].head_max_logit[h], so_far[layer].head_max_logit[h]);
    so_far = std::move(micro);
}

// The optimizer a config asks for: AdamW, or Muon for the blocks' matrices and AdamW for the
// rest, on this process's ranks.
RunOptimizerOptions run_optimizer_options(const TrainConfig& cfg) {
    RunOptimizerOptions options;
    options.adamw = {.lr = cfg.lr,
                     .beta1 = cfg.beta1,
                     .beta2 = cfg.beta2,
                     .eps = 1e-8,
                     .weight_decay = cfg.weight_decay,
                     .independent_weight_decay = cfg.independent_weight_decay,
                     .lr_max = cfg.lr};
    options.muon = cfg.optimizer == "muon";
    options.muon_options = {.momentum = cfg.muon_momentum, .weight_decay = cfg.weight_decay};
    options.zero = static_cast<int>(cfg.zero);
    options.bucket_bytes = static_cast<int64_t>(cfg.bucket_mb * (1 << 20));
    options.overlap = cfg.overlap;
    return options;
}

// One step's gradients, in .grad of every parameter.
struct StepGradients {
    double loss = NAN;  // the cross-entropy of the global batch: the mean over all its sequences
    bool backward_done = false;
};

// Draws the global batch and runs this rank's K micro-batches of it, each backward scaled by 1/K
// so that the gradients add up to the gradient of the rank's mean loss. With several ranks, the
// last micro-batch's backward also starts averaging them over the ranks, and finish_gradients()
// completes it: every rank then holds the gradient of the global batch's mean loss (or, with
// --zero 1, its shard of it).
StepGradients accumulate_gradients(GPT& model, const TextDataset& data, const TrainConfig& cfg,
                                   Generator& data_gen, RunOptimizer& optimizer,
                                   std::vector<AttentionStats>* stats) {
    const bool many = dist::world_size() > 1;
    Tensor ids, targets;
    data.batch(true, cfg.batch_size, data_gen, ids, targets);
    const int64_t K = cfg.grad_accum, micro_size = cfg.batch_size / (dist::world_size() * K);
    double loss_sum = 0;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
        const bool last = k + 1 == K;
        const Tensor micro_ids = micro_rows(ids, k, micro_size).to(model.device());
        const Tensor micro_targets = micro_rows(targets, k, micro_size).to(model.device());
        // The signals come from the last micro-batch; QK-Clip's per-head max from every one.
        const bool measure = stats && (last || cfg.qk_clip > 0);
        GPTOutput out = model.forward(micro_ids, micro_targets, measure);
        loss_sum += out.cross_entropy.item();
        finite = finite && std::isfinite(out.loss.item());
        if (measure) merge_stats(*stats, std::move(out.stats));
        // A non-finite loss ends the run after this step. Alone, its backward is skipped; with
        // other ranks it runs anyway, so that every rank makes the same collectives.
        if (!finite && !many) continue;
        optimizer.set_sync(last);
        (K == 1 ? out.loss : out.loss * (1.0 / static_cast<double>(K))).backward();
    }
    if (finite || many) optimizer.finish_gradients();
    if (stats) reduce_stats(*stats);
    const double micro_batches = static_cast<double>(K * dist::world_size());
    return {dist::all_reduce_sum(loss_sum) / micro_batches, finite || many};
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

// At a checkpoint step `done`, after its update: the training state to save goes to `pending`,
// to be written once the next step's loss vouches for the weights; the last step has no next
// loss, and its validation loss, measured on those weights, vouches for them instead: it is
// written now. Returns why the run diverged ("" if it did not): the update made a weight or a
// moment non-finite, or the final validation loss is a spike.
std::string checkpoint_after_update(const TrainConfig& cfg, int64_t done, double last_val,
                                    double min_loss, GPT& model, const RunOptimizer& optimizer,
                                    const Tokenizer& tokenizer, const Generator& data_gen,
                                    std::optional<TrainingState>& pending) {
    // The loss was finite before this step's update, but the update itself can overflow (a huge
    // lr · weight decay): check what would be saved.
    if (!optimizer.all_finite())
        return fmt::format(
            "training diverged at step {}: the update made a weight or an optimizer moment NaN or "
            "Inf; the last good checkpoint is kept",
            done);
    pending = TrainingState{done,
                            data_gen.seed(),
                            data_gen.counter(),
                            model.dropout_generator().seed(),
                            model.dropout_generator().counter(),
                            {{"train_config", cfg.to_json()}}};
    if (done != cfg.steps) return "";
    if (const std::string why = divergence(last_val, 0.0, min_loss, cfg.diverge_factor);
        !why.empty())
        return fmt::format(
            "training diverged at step {}: validation {} on the final weights; the last good "
            "checkpoint is kept",
            done, why);
    write_checkpoint(cfg, model, optimizer, tokenizer, *pending);
    pending.reset();
    return "";
}

// The model a checkpoint was written by (its own metadata) against the model the run's
// config.json builds now: an edited config.json (n_head 2 -> 4) would otherwise load weights of
// the same shapes into another model and train it.
void check_checkpoint_config(const std::string& path, const GPTConfig& now) {
    // Through GPTConfig, so that a field older checkpoints lack reads as its default.
    const auto written = GPTConfig::from_strings(load_safetensors(path).metadata).to_strings();
    for (const auto& [key, value] : now.to_strings())
        QK_CHECK(written.at(key) == value,
                 "resume: {} was written by a model with {} = {}, but the run's config.json says "
                 "{} = {}; config.json was edited, or belongs to another run",
                 path, key, written.at(key), key, value);
}

// Ctrl-C or SIGTERM asked the run to stop, on any rank: every rank gets the same answer, so that
// all of them write the checkpoint's collectives and stop together.
bool stop_asked(const StopSignals& signals) {
    const double asked = signals.requested() ? 1.0 : 0.0;
    return (dist::world_size() > 1 ? dist::all_reduce_max(asked) : asked) > 0;
}

// The checkpoint of a run stopped by a signal after step `done`, whatever --checkpoint-every
// says, and the message that tells how to go on.
std::string checkpoint_on_stop(const TrainConfig& cfg, int64_t done, GPT& model,
                               const RunOptimizer& optimizer, const Tokenizer& tokenizer,
                               const Generator& data_gen) {
    if (!optimizer.all_finite())
        return fmt::format(
            "stopped at step {}: the last update made a weight NaN or Inf, so no checkpoint of "
            "it was written",
            done);
    write_checkpoint(cfg, model, optimizer, tokenizer,
                     TrainingState{done,
                                   data_gen.seed(),
                                   data_gen.counter(),
                                   model.dropout_generator().seed(),
                                   model.dropout_generator().counter(),
                                   {{"train_config", cfg.to_json()}}});
    return fmt::format(
        "stopped at step {} of {}: checkpoint {} written; continue with: qknorm train --resume {}",
        done, cfg.steps, checkpoint_prefix(cfg.run_dir, done) + ".model.safetensors", cfg.run_dir);
}

// Where the loop starts: the step, and what metrics.jsonl says of the steps before it.
struct RunStart {
    int64_t step = 0;
    MetricsSoFar so_far;
};

// A new run: the validation loss at initialisation (step 0, the reference of Wortsman et al.'s
// LR sensitivity in `qknorm sweep`), config.json and the first line of metrics.jsonl.
RunStart start_run(const TrainConfig& cfg, GPT& model, const TextDataset& data) {
    const double val_loss = evaluate(model, data, cfg);
    if (dist::is_root()) {
        write_file_atomic(cfg.run_dir + "/config.json", cfg.to_json());
        write_file_atomic(cfg.run_dir + "/metrics.jsonl",
                          json{{"step", 0}, {"val_loss", val_loss}}.dump() + "\n");
    }
    return {};
}

// A resumed run: the weights, optimizer state and generators of the run's latest checkpoint, and
// metrics.jsonl cut back to it. Rank 0 reads the checkpoint and hands it to the others: they
// need no copy of the run directory, and the checkpoint does not depend on how many ranks wrote
// or read it.
RunStart resume_run(const TrainConfig& cfg, GPT& model, RunOptimizer& optimizer,
                    Generator& data_gen) {
    json resumed;
    MetricsSoFar so_far;
    OptimizerState whole = optimizer.state();  // the whole state, also with --zero 1
    if (dist::is_root()) {
        const std::vector<int64_t> steps = checkpoint_steps(cfg.run_dir);
        QK_CHECK(!steps.empty(), "resume: {} has no complete checkpoint", cfg.run_dir);
        const std::string prefix = checkpoint_prefix(cfg.run_dir, steps.back());
        check_checkpoint_config(prefix + ".model.safetensors", model.config());
        load_weights_into(model, prefix + ".model.safetensors");
        const std::string state_path = prefix + ".state.safetensors";
        TrainingState state = load_training_state(state_path, whole);
        QK_CHECK(state.step == steps.back(), "resume: {} says step {}, but its name says step {}",
                 state_path, state.step, steps.back());
        so_far = truncate_metrics(cfg.run_dir, state.step);
        resumed = {{"step", state.step},
                   {"data", {state.data_seed, state.data_counter}},
                   {"dropout", {state.dropout_seed, state.dropout_counter}}};
    }
    resumed = json::parse(broadcast_string(resumed.dump()));
    broadcast_tensors(model.parameters());
    for (const auto& [name, t] : whole.tensors) dist::broadcast(t);
    const int64_t start_step = resumed["step"].get<int64_t>();
    whole.steps = start_step;
    optimizer.load(whole);
    data_gen.set_state(resumed["data"][0].get<uint64_t>(), resumed["data"][1].get<uint64_t>());
    model.dropout_generator().set_state(resumed["dropout"][0].get<uint64_t>(),
                                        resumed["dropout"][1].get<uint64_t>());
    Tensor losses =
        from_vector({so_far.last_loss, so_far.last_val_loss, so_far.min_loss}, {3}, DType::f64);
    dist::broadcast(losses);  // the divergence check's reference, the same on every rank
    return {start_step, {losses.at({0}), losses.at({1}), losses.at({2})}};
}

// The end of a run, on rank 0: plot.svg, result.json (the marker of a finished run, which a
// sweep skips) and, unless it diverged, the sample of cfg.sample_tokens characters.
void finish_run(const TrainConfig& cfg, GPT& model, const Tokenizer& tokenizer, double seconds,
                TrainResult& result) {
    write_run_plot(cfg);
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

TrainResult train(const TrainConfig& cfg_in, bool resume) {
    TrainConfig cfg = cfg_in;
    cfg.validate();
    dist::set_timeout(cfg.dist_timeout);
    const int64_t ranks = dist::world_size();
    const bool root = dist::is_root();  // the one rank that writes the run directory
    QK_CHECK(cfg.batch_size % (ranks * cfg.grad_accum) == 0,
             "train: --batch-size {} does not split over {} rank(s) x --grad-accum {}: it must be "
             "a multiple of {} (each rank's micro-batch has batch-size / (ranks * grad-accum) "
             "sequences)",
             cfg.batch_size, ranks, cfg.grad_accum, ranks * cfg.grad_accum);
    if (cfg.data_path.empty()) cfg.data_path = default_data_path();
    const std::string text = read_text_file(cfg.data_path, "train: --data");
    std::optional<RunDirLock> lock;  // held to the end: one process per run directory
    if (root) {
        QK_CHECK(!fs::exists(cfg.run_dir) || fs::is_directory(cfg.run_dir),
                 "train: --run-dir '{}' is a file, not a directory", cfg.run_dir);
        fs::create_directories(cfg.run_dir);
        lock.emplace(cfg.run_dir, "train: --run-dir");
        resume = prepare_run_dir(cfg, resume);
    }
    resume = broadcast_string(resume ? "resume" : "start") == "resume";

    const Tokenizer tokenizer =
        cfg.tokenizer == "char" ? Tokenizer::char_level(text) : Tokenizer::byte_level();
    cfg.model.vocab_size = tokenizer.vocab_size();
    const TextDataset data(tokenizer.encode(text), cfg.model.block_size);

    const Device device = cfg.device == "cuda" ? Device::cuda : Device::cpu;
    if (device == Device::cuda) set_tf32(cfg.tf32);
    GPT model(cfg.model, cfg.seed);  // initialised on the cpu: the same weights on every device
    model.to(device);
    check_replicas_agree(replica_settings(cfg), model.parameters());
    RunOptimizer optimizer(model.named_parameters(), run_optimizer_options(cfg));
    if (root && (ranks > 1 || cfg.zero))
        fmt::print("optimizer state: {:.1f} MB on each of {} rank(s){}\n",
                   static_cast<double>(optimizer.state_bytes()) / (1 << 20), ranks,
                   cfg.zero ? " (ZeRO-1: AdamW's moments sharded)" : "");
    Generator data_gen(cfg.seed + 1);
    const RunStart begun =
        resume ? resume_run(cfg, model, optimizer, data_gen) : start_run(cfg, model, data);
    const int64_t start_step = begun.step;
    const MetricsSoFar& so_far = begun.so_far;
    std::ofstream metrics;
    if (root) metrics.open(cfg.run_dir + "/metrics.jsonl", std::ios::app);
    const auto start_time = std::chrono::steady_clock::now();

    TrainResult result;
    result.steps_done = start_step;  // a resumed run that was already complete reports its steps
    result.final_loss = so_far.last_loss;
    double last_val = so_far.last_val_loss, min_loss = so_far.min_loss, step_seconds_total = 0;
    const double tokens_per_step = static_cast<double>(cfg.batch_size * cfg.model.block_size);
    // A checkpoint is written only once the next step's loss, measured on its weights, passes
    // the divergence check: a run that blows up never leaves its blown-up weights as "last good".
    std::optional<TrainingState> pending;
    const StopSignals signals;  // Ctrl-C: stop after the step in progress, with a checkpoint
    for (int64_t step = start_step; step < cfg.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        const double lr = cosine_lr(step, cfg.warmup, cfg.steps, cfg.lr, cfg.lr_min);
        inject_fault(step);
        const bool with_stats = step % cfg.stats_interval() == 0 || step + 1 == cfg.steps;
        std::vector<AttentionStats> stats;  // every step with QK-Clip: it reads S_h from them
        const bool measure = with_stats || cfg.qk_clip > 0;
        const StepGradients grads =
            accumulate_gradients(model, data, cfg, data_gen, optimizer, measure ? &stats : nullptr);
        const double loss = grads.loss;
        double grad_norm = NAN;
        if (grads.backward_done) grad_norm = optimizer.clip(cfg.grad_clip);
        if (const std::string why = divergence(loss, grad_norm, min_loss, cfg.diverge_factor);
            !why.empty()) {
            result.diverged = true;
            result.message =
                fmt::format("training diverged at step {}: {}; the last good checkpoint is kept",
                            step + 1, why);
            // JSON has no NaN or Inf: such a loss is written as null.
            if (root)
                metrics << json{{"step", step + 1},
                                {"loss", std::isfinite(loss) ? json(loss) : json()},
                                {"diverged", true},
                                {"reason", why}}
                               .dump()
                        << "\n";
            break;
        }
        min_loss = std::min(min_loss, loss);
        // This step's loss was measured on the weights of the pending checkpoint and passed:
        // only now is that checkpoint known to be good (the weights are still unchanged).
        if (pending) write_checkpoint(cfg, model, optimizer, tokenizer, *pending);
        pending.reset();
        optimizer.step(lr);
        optimizer.zero_grad();
        const int64_t heads_clipped = cfg.qk_clip > 0 ? qk_clip(model, stats, cfg.qk_clip) : 0;
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
        if (with_stats) line["layers"] = stats_to_json(stats);
        if (cfg.qk_clip > 0) line["heads_clipped"] = heads_clipped;
        if (root) metrics << line.dump() << "\n" << std::flush;
        result.final_loss = loss;
        result.steps_done = step + 1;
        if ((step + 1) % cfg.checkpoint_every == 0 || step + 1 == cfg.steps) {
            result.message = checkpoint_after_update(cfg, step + 1, last_val, min_loss, model,
                                                     optimizer, tokenizer, data_gen, pending);
            if (!result.message.empty()) {
                result.diverged = true;
                break;
            }
        }
        if (cfg.progress && root) {
            const double mean_step =
                step_seconds_total / static_cast<double>(step + 1 - start_step);
            print_progress(step + 1, cfg.steps, loss, last_val, tokens_per_step / mean_step,
                           mean_step * static_cast<double>(cfg.steps - step - 1));
        }
        if (cfg.stop_after > 0 && step + 1 >= cfg.stop_after) return result;  // as if killed
        if (stop_asked(signals)) {
            result.stop_signal = signals.signal_number() ? signals.signal_number() : SIGTERM;
            result.message =
                checkpoint_on_stop(cfg, step + 1, model, optimizer, tokenizer, data_gen);
            break;
        }
    }
    if (cfg.progress && root) fmt::print(stderr, "\n");
    if (result.stop_signal) {  // not finished: no result.json, no sample; the plot so far
        result.final_val_loss = last_val;
        if (root) write_run_plot(cfg);
        return result;
    }
    result.final_val_loss = last_val;
    if (!root) return result;  // the other ranks write nothing
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    finish_run(cfg, model, tokenizer, seconds, result);
    return result;
}

}  // namespace qk::nn
