// The tiny training run the train and faults suites start from: a 1-layer model on a 6 KB text
// that trains 20 steps in a fraction of a second, with checkpoints, evaluation and stats on.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helpers.h"
#include "nn/train/trainer.h"

namespace qk::test {

inline nn::TrainConfig tiny_run(const TempDir& dir, const std::string& name) {
    nn::TrainConfig c;
    c.model.block_size = 16, c.model.n_layer = 1, c.model.n_head = 2, c.model.n_embd = 16;
    c.model.qk_norm = nn::QKNorm::layernorm;
    c.data_path = write_corpus(dir);
    c.batch_size = 4, c.steps = 20, c.warmup = 4, c.lr = 1e-2, c.lr_min = 1e-3;
    c.eval_every = 5, c.eval_batches = 2, c.stats_every = 2;
    c.checkpoint_every = 5, c.keep_checkpoints = 2;
    c.run_dir = dir / name;
    c.sample_tokens = 20;
    c.progress = false;
    return c;
}

// The lines of run_dir/metrics.jsonl that hold a training step (a "loss").
inline std::vector<nlohmann::json> step_metrics(const std::string& run_dir) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
        nlohmann::json j = nlohmann::json::parse(line);
        if (j.contains("loss")) lines.push_back(std::move(j));
    }
    return lines;
}

// max over the steps of |loss a − loss b|: how far a run strays from its twin (same length).
inline double max_loss_gap(const std::vector<nlohmann::json>& a,
                           const std::vector<nlohmann::json>& b) {
    double gap = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        gap = std::max(gap, std::abs(a[i]["loss"].get<double>() - b[i]["loss"].get<double>()));
    return gap;
}

// cfg trained in run_dir, killed after kill_after steps, then resumed to its end: the step lines
// of its metrics.jsonl, for comparing with an unbroken run's.
inline std::vector<nlohmann::json> killed_and_resumed(nn::TrainConfig cfg,
                                                      const std::string& run_dir,
                                                      int64_t kill_after) {
    cfg.run_dir = run_dir;
    CHECK(nn::train(cfg, false, {.kill_after = kill_after}).steps_done == kill_after);
    CHECK(nn::train(cfg, /*resume=*/true).steps_done == cfg.steps);
    return step_metrics(run_dir);
}

}  // namespace qk::test
