// `qknorm sweep`: the grid runner behind the stability experiments.
//
// Each run lives in out_dir/runs/<variant>__lr<lr>__s<seed>/ and is an ordinary training run
// (config.json, metrics.jsonl, checkpoints, result.json), plus sweep.json naming its grid cell.
// A run with result.json is finished and skipped; one with a checkpoint but no result.json is
// resumed; anything else is started afresh. Several runs train at once as separate processes
// (`qknorm train --from-json`), so one crashing run cannot take the sweep down.
//
// LR sensitivity (Wortsman et al. 2023, §3.1): with L0 the loss at initialisation and L(lr) the
// final validation loss,
//     sensitivity = mean over the LR grid of [ min(L(lr), L0) − L* ],   L* = min over lr of L(lr)
// A diverged run counts as L0: it learned nothing worth keeping. Seeds are averaged per LR before
// the minimum is taken. L* is the variant's own best loss, so the number measures how much of
// the grid lands far from the variant's optimum, not how good the optimum is.
#include "nn/lab/sweep.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/safetensors.h"
#include "nn/signals/metrics_file.h"
#include "nn/signals/plot.h"
#include "nn/text/data.h"
#include "nn/train/run_control.h"

extern char** environ;

namespace qk::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- variants --------------------------------------------------------------------------------

const std::vector<std::string>& variant_presets() {
    static const std::vector<std::string> presets{
        "baseline", "qk_layernorm", "qk_rmsnorm", "l2", "lp", "softcap", "qk_norm_cap", "qkv_norm"};
    return presets;
}

const std::vector<std::string>& variant_keys() {
    static const std::vector<std::string> keys{
        "p",   "g0",  "cap",   "scope", "L",     "H", "C",     "precision", "fp8attn",
        "opt", "pos", "order", "clip",  "gclip", "z", "place", "img",       "ient"};
    return keys;
}

Variant parse_variant(const std::string& spec) {
    Variant v{spec, "", {}};
    size_t at = spec.find(':');
    v.preset = spec.substr(0, at);
    const auto& presets = variant_presets();
    QK_CHECK(std::find(presets.begin(), presets.end(), v.preset) != presets.end(),
             "sweep: unknown variant '{}' in '{}'; expected one of {}", v.preset, spec,
             fmt::join(presets, ", "));
    static const std::set<std::string> keys(variant_keys().begin(), variant_keys().end());
    while (at != std::string::npos) {
        const size_t next = spec.find(':', at + 1);
        const std::string item = spec.substr(at + 1, next - at - 1);
        const size_t eq = item.find('=');
        QK_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size() &&
                     keys.count(item.substr(0, eq)),
                 "sweep: bad override '{}' in variant '{}'; expected key=value with key one of {}",
                 item, spec, fmt::join(keys, ", "));
        v.overrides.emplace_back(item.substr(0, eq), item.substr(eq + 1));
        at = next;
    }
    return v;
}

namespace {

double parse_number(const std::string& text, const std::string& what) {
    size_t used = 0;
    double value = NAN;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
    }
    QK_CHECK(used == text.size() && std::isfinite(value), "sweep: {} must be a number, got '{}'",
             what, text);
    return value;
}

// Layers, heads, width: L=2.9 is refused, not truncated to 2.
int64_t parse_whole_number(const std::string& text, const std::string& what) {
    const double value = parse_number(text, what);
    QK_CHECK(value == std::floor(value) && value >= 1 && value <= 1e9,
             "sweep: {} must be a whole number >= 1, got '{}'", what, text);
    return static_cast<int64_t>(value);
}

}  // namespace

void apply_variant(const Variant& variant, TrainConfig& cfg) {
    GPTConfig& m = cfg.model;
    const std::string& p = variant.preset;
    m.qk_norm = p == "qk_layernorm" || p == "qk_norm_cap" || p == "qkv_norm" ? QKNorm::layernorm
                : p == "qk_rmsnorm"                                          ? QKNorm::rmsnorm
                : p == "l2"                                                  ? QKNorm::l2
                : p == "lp"                                                  ? QKNorm::lp
                                                                             : QKNorm::none;
    m.attn_softcap = p == "softcap" || p == "qk_norm_cap" ? 50.0 : 0.0;
    m.qkv_norm = p == "qkv_norm";
    for (const auto& [key, value] : variant.overrides) {
        const std::string what = fmt::format("'{}' in variant '{}'", key, variant.spec);
        if (key == "p") m.lp_p = parse_number(value, what);
        if (key == "g0") m.qk_scale_init = value;
        if (key == "cap") m.attn_softcap = parse_number(value, what);
        if (key == "scope") m.qk_norm_scope = parse_norm_scope(value);
        if (key == "L") m.n_layer = parse_whole_number(value, what);
        if (key == "H") m.n_head = parse_whole_number(value, what);
        if (key == "C") m.n_embd = parse_whole_number(value, what);
        if (key == "precision") m.precision = parse_precision(value);  // fp32|bf16|fp16|fp8
        if (key == "fp8attn") {
            QK_CHECK(value == "0" || value == "1", "sweep: {} must be 0 or 1", what);
            m.fp8_attention = value == "1";
        }
        if (key == "opt") cfg.optimizer = value;             // adamw | muon
        if (key == "pos") m.pos_emb = parse_pos_emb(value);  // learned | rope
        if (key == "order") m.qk_norm_order = parse_qk_norm_order(value);
        if (key == "clip") cfg.qk_clip = parse_number(value, what);  // QK-Clip's tau
        if (key == "gclip") cfg.grad_clip = parse_number(value, what);
        if (key == "img") cfg.modalities.image_fraction = parse_number(value, what);
        if (key == "ient") cfg.modalities.image_entropy = parse_number(value, what);
        if (key == "z") m.z_loss = parse_number(value, what);                // z-loss weight
        if (key == "place") m.norm_placement = parse_norm_placement(value);  // pre | post | both
    }
    cfg.modalities.validate();
    m.validate();
    QK_CHECK(cfg.optimizer == "adamw" || cfg.optimizer == "muon",
             "sweep: opt in variant '{}' must be adamw or muon, got '{}'", variant.spec,
             cfg.optimizer);
}

std::string run_dir_name(const std::string& variant, double lr, uint64_t seed) {
    std::string name;
    for (char c : variant)
        name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c
                : c == '='                                                          ? '-'
                                                                                    : '_';
    // The shortest text that reads back as the same double: 1e-3 and 1.0000001e-3 differ.
    return fmt::format("{}__lr{}__s{}", name, lr, seed);
}

// ---- reading a run back ----------------------------------------------------------------------

namespace {

double number_or_nan(const json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

}  // namespace

RunSummary summarize_run(const std::string& run_dir) {
    RunSummary s;
    s.run_dir = run_dir;
    if (fs::exists(run_dir + "/sweep.json")) {
        const json cell = json::parse(read_text_file(run_dir + "/sweep.json"));
        s.variant = cell.at("variant").get<std::string>();
        s.lr = cell.at("lr").get<double>();
        s.seed = cell.at("seed").get<uint64_t>();
    }
    if (fs::exists(run_dir + "/result.json")) {
        const json r = json::parse(read_text_file(run_dir + "/result.json"));
        s.finished = true;
        s.diverged = r.value("diverged", false);
        s.steps_done = r.value("steps_done", int64_t{0});
        s.final_val_loss = s.diverged ? NAN : number_or_nan(r, "final_val_loss");
        s.seconds = number_or_nan(r, "seconds");
    }
    for (const MetricsRecord& record : read_metrics(run_dir).records) {
        const json& j = record.record;
        if (j.value("step", -1) == 0) s.init_val_loss = number_or_nan(j, "val_loss");
        if (!j.contains("layers") || !j["layers"].is_array()) continue;
        const json& layers = j["layers"];
        s.max_logit.resize(std::max(s.max_logit.size(), layers.size()), 0.0);
        s.final_entropy.resize(s.max_logit.size(), NAN);
        for (size_t i = 0; i < layers.size(); ++i) {
            // A diverging run's logits may be NaN (written as null): they count as unbounded.
            const double logit = number_or_nan(layers[i], "max_logit");
            s.max_logit[i] = std::isfinite(logit) ? std::max(s.max_logit[i], logit) : INFINITY;
            s.final_entropy[i] = number_or_nan(layers[i], "entropy");
        }
    }
    return s;
}

std::vector<VariantSummary> summarize_variants(const std::vector<RunSummary>& runs) {
    std::vector<VariantSummary> out;
    std::vector<std::string> order;  // variants in the order they first appear
    for (const RunSummary& r : runs)
        if (std::find(order.begin(), order.end(), r.variant) == order.end())
            order.push_back(r.variant);
    for (const std::string& variant : order) {
        VariantSummary v{variant};
        // Per LR: the seed mean of min(L, L0), with a diverged or unfinished run counting as L0.
        std::map<double, std::pair<double, int>> capped;  // lr -> (sum, count)
        std::map<double, bool> any_diverged;              // lr -> some seed diverged
        for (const RunSummary& r : runs) {
            if (r.variant != variant || !r.finished) continue;
            ++v.runs;
            v.diverged += r.diverged;
            any_diverged[r.lr] = any_diverged[r.lr] || r.diverged;
            const double l0 = r.init_val_loss;
            const double loss =
                std::isfinite(r.final_val_loss) ? std::min(r.final_val_loss, l0) : l0;
            capped[r.lr].first += loss;
            capped[r.lr].second += 1;
        }
        if (capped.empty()) {
            out.push_back(v);
            continue;
        }
        v.best_loss = INFINITY;
        for (const auto& [lr, sum_count] : capped) {
            const double mean = sum_count.first / sum_count.second;
            if (mean < v.best_loss) v.best_loss = mean, v.best_lr = lr;
        }
        double total = 0;
        for (const auto& [lr, sum_count] : capped) total += sum_count.first / sum_count.second;
        v.lr_sensitivity = total / static_cast<double>(capped.size()) - v.best_loss;
        // The edge of stability: every seed stable at this LR and at every smaller one.
        for (const auto& [lr, diverged] : any_diverged) {
            if (diverged) break;
            v.max_stable_lr = lr;
        }
        out.push_back(v);
    }
    return out;
}

// ---- running the grid ------------------------------------------------------------------------

namespace {

struct Cell {
    std::string variant, run_dir;
    double lr;
    uint64_t seed;
};

enum class Start { fresh, resume, done };

// A run directory this sweep finds already started must have been started with the settings
// it would use now (sweep_run.json): another sweep's results are never reported as this one's.
void check_same_settings(const Cell& cell, const std::string& settings) {
    const std::string path = cell.run_dir + "/sweep_run.json";
    QK_CHECK(fs::exists(path),
             "sweep: {} holds a run but no sweep_run.json: it was not started by a sweep; "
             "choose another --out",
             cell.run_dir);
    const json saved = json::parse(read_text_file(path, "sweep"), nullptr, false);
    const json now = json::parse(settings);
    for (const auto& [key, value] : now.items())
        QK_CHECK(saved.is_object() && saved.contains(key) && saved[key] == value,
                 "sweep: {} was trained with {} = {}, this sweep asks for {}; resume only with the "
                 "same settings, or choose another --out",
                 cell.run_dir, key,
                 saved.is_object() && saved.contains(key) ? saved[key].dump() : "(nothing)",
                 value.dump());
}

Start prepare_run(const Cell& cell, const std::string& settings) {
    const bool finished = fs::exists(cell.run_dir + "/result.json");
    const bool checkpointed = !latest_model_checkpoint(cell.run_dir).empty();
    if (finished || checkpointed) check_same_settings(cell, settings);
    if (finished) return Start::done;
    if (checkpointed) return Start::resume;
    fs::remove_all(cell.run_dir);  // started but never checkpointed: nothing worth keeping
    fs::create_directories(fs::path(cell.run_dir).parent_path());
    return Start::fresh;
}

TrainConfig cell_config(const SweepSpec& spec, const Cell& cell) {
    TrainConfig cfg = spec.base;
    apply_variant(parse_variant(cell.variant), cfg);
    cfg.lr = cell.lr;
    cfg.lr_min = cell.lr * spec.lr_min_ratio;
    cfg.seed = cell.seed;
    cfg.run_dir = cell.run_dir;
    cfg.progress = false;
    return cfg;
}

// A child `qknorm train` process; its output goes to the run's log.txt.
pid_t spawn_train(const std::string& exe, const std::vector<std::string>& args,
                  const std::string& log_path) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<std::string> argv_strings{exe};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    QK_CHECK(rc == 0, "sweep: could not start {}: {}", exe, std::strerror(rc));
    return pid;
}

void report_finished(const SweepSpec& spec, const Cell& cell, size_t done, size_t total,
                     double elapsed, size_t trained) {
    if (!spec.progress) return;
    const RunSummary s = summarize_run(cell.run_dir);
    const std::string outcome = s.diverged   ? std::string("diverged")
                                : s.finished ? fmt::format("val {:.4f}", s.final_val_loss)
                                             : std::string("failed (see log.txt)");
    // elapsed / trained is wall time per run with the jobs already running side by side.
    const double eta =
        trained ? elapsed / static_cast<double>(trained) * static_cast<double>(total - done) : 0;
    fmt::print("[{}/{}] {} lr {} seed {}: {} ({:.0f} s)  elapsed {}  ETA {}\n", done, total,
               cell.variant, cell.lr, cell.seed, outcome, s.seconds, format_duration(elapsed),
               format_duration(eta));
    std::fflush(stdout);
}

// The last step a run's metrics.jsonl records (0 before its first), from its last 4 kB.
int64_t last_step(const std::string& run_dir) {
    std::ifstream in(run_dir + "/metrics.jsonl", std::ios::binary | std::ios::ate);
    if (!in) return 0;
    const std::streamoff size = in.tellg();
    in.seekg(std::max<std::streamoff>(0, size - 4096));
    std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = tail.rfind("{\"step\":");
    return at == std::string::npos ? 0 : std::atoll(tail.c_str() + at + 8);
}

// One line on a terminal's stderr, redrawn: where each running run is.
void show_running(const SweepSpec& spec, const std::map<pid_t, const Cell*>& running) {
    if (!spec.progress || ::isatty(2) != 1) return;
    std::string line;
    for (const auto& [pid, cell] : running)
        line +=
            fmt::format("{}{} lr {} seed {}: step {}/{}", line.empty() ? "" : "; ", cell->variant,
                        cell->lr, cell->seed, last_step(cell->run_dir), spec.base.steps);
    fmt::print(stderr, "\r  {:<100.100}", line);
}

// After a stop signal: how many runs of `cells` finished, where each other one stands.
std::string stop_report(const std::vector<Cell>& cells) {
    std::string stopped;
    size_t finished = 0, not_started = 0;
    for (const Cell& cell : cells) {
        if (summarize_run(cell.run_dir).finished) {
            ++finished;
            continue;
        }
        const int64_t step = last_step(cell.run_dir);
        if (step == 0 && !fs::exists(cell.run_dir + "/log.txt")) {
            ++not_started;
            continue;
        }
        stopped += fmt::format("\n  {} lr {} seed {}: stopped at step {} ({})", cell.variant,
                               cell.lr, cell.seed, step, cell.run_dir);
    }
    return fmt::format("{} of {} runs finished, {} not started{}", finished, cells.size(),
                       not_started, stopped);
}

// Trains the cells not finished yet, `spec.jobs` at a time; returns the stop signal (0: all ran).
int train_cells(const SweepSpec& spec, const std::vector<Cell>& cells) {
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    size_t done = 0, trained = 0;
    std::map<pid_t, const Cell*> running;
    const StopSignals signals;  // Ctrl-C: no new run; the running ones stop with a checkpoint
    bool forwarded = false;
    auto reap_one = [&] {
        int status = 0;
        pid_t pid = 0;
        while ((pid = waitpid(-1, &status, WNOHANG)) == 0) {  // a look every 0.2 s meanwhile
            if (signals.requested() && !forwarded) {
                // A terminal's Ctrl-C reached the runs too; a kill of this process alone did
                // not. The same signal twice at once is one request to them.
                for (const auto& [child, cell] : running) ::kill(child, signals.signal_number());
                forwarded = true;
            }
            show_running(spec, running);
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        QK_CHECK(pid > 0, "sweep: waitpid failed: {}", std::strerror(errno));
        if (spec.progress && ::isatty(2) == 1) fmt::print(stderr, "\r{:102}\r", "");
        const Cell* cell = running.at(pid);
        running.erase(pid);
        report_finished(spec, *cell, ++done, cells.size(), elapsed(), ++trained);
    };
    for (const Cell& cell : cells) {
        if (signals.requested()) break;
        TrainConfig cfg = cell_config(spec, cell);
        const Start start = prepare_run(cell, cfg.to_json());
        if (start == Start::done) {
            ++done;
            continue;
        }
        fs::create_directories(cell.run_dir);
        write_file_atomic(
            cell.run_dir + "/sweep.json",
            json{{"variant", cell.variant}, {"lr", cell.lr}, {"seed", cell.seed}}.dump());
        const std::string json_path = cell.run_dir + "/sweep_run.json";
        write_file_atomic(json_path, cfg.to_json());
        if (spec.qknorm_exe.empty()) {  // in process, one run at a time
            if (spec.train_fn)
                spec.train_fn(cfg, start == Start::resume);
            else
                train(cfg, start == Start::resume);
            report_finished(spec, cell, ++done, cells.size(), elapsed(), ++trained);
            continue;
        }
        const std::vector<std::string> args =
            start == Start::resume
                ? std::vector<std::string>{"train", "--resume", cell.run_dir, "--quiet"}
                : std::vector<std::string>{"train", "--from-json", json_path, "--quiet"};
        while (static_cast<int>(running.size()) >= std::max(spec.jobs, 1)) reap_one();
        if (signals.requested()) break;
        running[spawn_train(spec.qknorm_exe, args, cell.run_dir + "/log.txt")] = &cell;
    }
    while (!running.empty()) reap_one();
    return signals.signal_number();
}

// The grid's cells, in the order they train: variants, then learning rates, then seeds.
std::vector<Cell> grid_cells(const SweepSpec& spec) {
    std::vector<Cell> cells;
    for (const std::string& variant : spec.variants)
        for (double lr : spec.lrs)
            for (uint64_t seed : spec.seeds)
                cells.push_back(
                    {variant, spec.out_dir + "/runs/" + run_dir_name(variant, lr, seed), lr, seed});
    return cells;
}

}  // namespace

void write_sweep_outputs(const SweepSpec& spec, const SweepResult& result);  // sweep_report.cpp

void check_sweep(const SweepSpec& spec) {
    QK_CHECK(!spec.variants.empty() && !spec.lrs.empty() && !spec.seeds.empty(),
             "sweep: the grid is empty ({} variants, {} learning rates, {} seeds)",
             spec.variants.size(), spec.lrs.size(), spec.seeds.size());
    QK_CHECK(spec.jobs >= 1 && spec.jobs <= 256, "sweep: --jobs must be in [1, 256], got {}",
             spec.jobs);
    QK_CHECK(std::isfinite(spec.lr_min_ratio) && spec.lr_min_ratio >= 0 && spec.lr_min_ratio <= 1,
             "sweep: --lr-min-ratio must be in [0, 1], got {}", spec.lr_min_ratio);
    QK_CHECK(!fs::exists(spec.out_dir) || fs::is_directory(spec.out_dir),
             "sweep: --out '{}' is a file, not a directory", spec.out_dir);
    QK_CHECK(spec.jobs == 1 || !spec.qknorm_exe.empty(),
             "sweep: running {} jobs at once needs the qknorm program (qknorm_exe)", spec.jobs);
    for (double lr : spec.lrs)
        QK_CHECK(lr > 0 && std::isfinite(lr), "sweep: learning rates must be > 0, got {}", lr);
    // Two cells in one run directory would train twice into it and report one result for both.
    std::set<std::string> run_dirs;
    for (const Cell& cell : grid_cells(spec))
        QK_CHECK(run_dirs.insert(cell.run_dir).second,
                 "sweep: the grid holds variant '{}', lr {}, seed {} twice (run directory {}); "
                 "list each variant, learning rate and seed once",
                 cell.variant, cell.lr, cell.seed, cell.run_dir);
    QK_CHECK(spec.plot_lr == 0 ||
                 std::find(spec.lrs.begin(), spec.lrs.end(), spec.plot_lr) != spec.lrs.end(),
             "sweep: plot_lr {:g} is not in the grid's learning rates ({})", spec.plot_lr,
             fmt::join(spec.lrs, ", "));
    bool param_found = spec.plot_param.empty();
    for (const std::string& variant : spec.variants)
        for (const auto& [key, value] : parse_variant(variant).overrides)
            param_found = param_found || key == spec.plot_param;
    QK_CHECK(param_found, "sweep: plot_param '{}' is not overridden by any variant ({})",
             spec.plot_param, fmt::join(spec.variants, ", "));
    // Every run's whole configuration is valid before any of them starts.
    for (const Cell& cell : grid_cells(spec)) cell_config(spec, cell).validate();
}

SweepResult run_sweep(const SweepSpec& spec) {
    check_sweep(spec);
    const std::vector<Cell> cells = grid_cells(spec);
    fs::create_directories(spec.out_dir + "/runs");
    const RunDirLock lock(spec.out_dir, "sweep: --out");  // one sweep at a time in a folder
    SweepResult result;
    result.stop_signal = train_cells(spec, cells);
    if (result.stop_signal) {
        result.stop_report = stop_report(cells);
        return result;
    }

    for (const Cell& cell : cells) result.runs.push_back(summarize_run(cell.run_dir));
    result.variants = summarize_variants(result.runs);
    write_sweep_outputs(spec, result);
    return result;
}

}  // namespace qk::nn
