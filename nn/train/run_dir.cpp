// The run directory on disk: its checkpoints, the leftovers of a kill, metrics.jsonl cut back
// for a resume, and the checks that the files agree with the run's configuration.
#include "nn/train/run_dir.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/distributed.h"
#include "core/safetensors.h"
#include "nn/signals/metrics_file.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"

namespace qk::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The files a run writes into its directory, by name.
bool is_run_file(const std::string& name) {
    static const std::set<std::string> fixed{"config.json", "metrics.jsonl", "plot.svg",
                                             "result.json"};
    return fixed.count(name) || checkpoint_step_of(name, "model") ||
           checkpoint_step_of(name, "state");
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
        const std::optional<int64_t> state_step = checkpoint_step_of(name, "state");
        if (is_leftover_temporary(entry))
            leftovers.push_back(entry.path());
        else if (state_step && entry.is_regular_file() && !entry.is_symlink() &&
                 !fs::exists(checkpoint_prefix(run_dir, *state_step) + ".model.safetensors"))
            leftovers.push_back(entry.path());
    }
    for (const fs::path& p : leftovers) fs::remove(p);
}

}  // namespace

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

// The model a checkpoint was written by (its own metadata) against the model the run's
// config.json builds now: an edited config.json (n_head 2 -> 4) would otherwise load weights of
// the same shapes into another model and train it.
void check_checkpoint_config(const std::string& path,
                             const std::map<std::string, std::string>& metadata,
                             const GPTConfig& now) {
    // Through GPTConfig, so that a field older checkpoints lack reads as its default.
    const auto written = GPTConfig::from_strings(metadata).to_strings();
    for (const auto& [key, value] : now.to_strings())
        QK_CHECK(written.at(key) == value,
                 "resume: {} was written by a model with {} = {}, but the run's config.json says "
                 "{} = {}; config.json was edited, or belongs to another run",
                 path, key, written.at(key), key, value);
}

std::string kept_checkpoint_note(const std::string& run_dir) {
    const std::vector<int64_t> steps = checkpoint_steps(run_dir);
    if (steps.empty()) return "no checkpoint was written before it";
    return fmt::format("the last good checkpoint, step {}, is kept", steps.back());
}

}  // namespace qk::nn
