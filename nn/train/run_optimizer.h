// The optimizer of a training run: AdamW, or Muon for the blocks' matrices with AdamW for the
// rest, on one rank or many (docs/model.md#optimisers, docs/distributed.md).
//
// On one rank the parameters' gradients are used as backward left them. On several, a
// GradientSync (nn/optim/data_parallel.h) averages them over the ranks first, so that every rank
// takes the same step; with zero = 1 a ShardedAdamW (nn/optim/zero.h) keeps only this rank's shard
// of AdamW's moments. The trainer drives every combination the same way, per step:
//     set_sync(last micro-batch) ... backward ... finish_gradients(); clip(); step(lr); zero_grad()
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/optim/data_parallel.h"
#include "nn/optim/muon.h"
#include "nn/optim/optim.h"
#include "nn/optim/zero.h"
#include "nn/train/checkpoint.h"

namespace qk::nn {

// Which parameters Muon updates: the 2-D weights inside the transformer blocks
// (`transformer.h.*`: c_attn, the attention's c_proj, c_fc and the MLP's c_proj), c_attn as its
// three blocks q, k and v. Everything else (embeddings, the LM head, gains, biases, g) is AdamW's.
struct ParameterSplit {
    std::vector<MuonMatrix> muon;
    std::vector<std::pair<std::string, Tensor>> adamw;
};
// c_attn's rows: q_width of q, then kv_width each of k and v (0, 0: three equal blocks).
struct AttnRows {
    int64_t q_width = 0, kv_width = 0;
};
ParameterSplit split_for_muon(const std::vector<std::pair<std::string, Tensor>>& named_params,
                              AttnRows attn_rows = {});

struct RunOptimizerOptions {
    AdamWOptions adamw;
    bool muon = false;   // Muon for split_for_muon's matrices, AdamW for the rest
    AttnRows attn_rows;  // c_attn's q, k, v blocks (grouped-query models: k and v narrower)
    MuonOptions muon_options;
    int zero = 0;  // 1: AdamW's moments sharded over the ranks (AdamW alone)
    int64_t bucket_bytes = int64_t{25} << 20;
    bool overlap = true;
};

class RunOptimizer {
  public:
    RunOptimizer(const std::vector<std::pair<std::string, Tensor>>& named_params,
                 const RunOptimizerOptions& options);
    void set_sync(bool on);  // whether this backward is the step's last (it starts the average)
    void finish_gradients();
    // The global norm before clipping (as clip_grad_norm), of gradients that were computed for
    // loss_scale × the loss and come out divided by it.
    double clip(double max_norm, double loss_scale = 1.0);
    void step(double lr);
    void zero_grad();
    // True when every weight and every optimizer buffer, on every rank, is finite (collective).
    bool all_finite() const;
    // The whole state by name, as a checkpoint holds it (collective with zero = 1: it gathers the
    // shards), and its inverse (every rank passes the same state).
    OptimizerState state() const;
    void load(const OptimizerState& state);
    int64_t state_bytes() const;  // this rank's optimizer buffers

  private:
    std::vector<Tensor> params_;            // every parameter: synced, clipped, checked
    std::vector<std::string> adamw_names_;  // the parameters AdamW updates
    std::vector<Tensor> adamw_params_;
    AdamWOptions adamw_options_;
    std::unique_ptr<AdamW> adamw_;           // zero = 0
    std::unique_ptr<ShardedAdamW> sharded_;  // zero = 1
    std::unique_ptr<Muon> muon_;             // with muon
    std::unique_ptr<GradientSync> sync_;     // zero = 0, several ranks
};

}  // namespace qk::nn
