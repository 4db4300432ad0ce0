// The tiny training run the train and faults suites start from: a 1-layer model on a 6 KB text
// that trains 20 steps in a fraction of a second, with checkpoints, evaluation and stats on.
#pragma once

#include "helpers.h"
#include "nn/trainer.h"

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

}  // namespace qk::test
