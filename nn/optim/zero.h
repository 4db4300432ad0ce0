// ZeRO stage 1 (Rajbhandari et al. 2020): AdamW's moments sharded over the data-parallel ranks.
//
// Lay every parameter end to end as one vector of P elements, padded to N·S (N ranks, S = ⌈P/N⌉)
// so that rank r owns the shard [r·S, (r + 1)·S). Per step, after backward:
//   1. reduce-scatter the gradients: rank r receives Σ_ranks g over its shard, divided by N;
//   2. the global gradient norm is √(Σ_ranks ‖g_shard‖²); clipping scales each shard by the same
//      factor on every rank;
//   3. AdamW updates the parameters' elements in the shard, with m and v of S elements only;
//   4. all-gather the parameters: every rank again holds every updated weight.
// The moments cost 2·P/N floats per rank instead of 2·P; the gradients and parameters stay whole.
// Each shard's update is the same arithmetic, element by element, as AdamW on the whole vector, so
// `--zero 1` trains like plain data-parallel training (up to the order of the gradient sums).
//
// Checkpoints hold the whole moments: gather_full() assembles them (on every rank: collective), and
// load_full() takes this rank's shard of a whole AdamW state, so a checkpoint is the one a single
// process writes and resumes on any number of ranks.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "nn/optim/optim.h"

namespace qk::nn {

// Writes param's gradient, flattened, into place (numel elements, on any device), or zeros when
// it has none: how data-parallel buffers gather the gradients they send.
void copy_gradient_into(const Tensor& place, const Tensor& param);

class ShardedAdamW {
  public:
    ShardedAdamW(std::vector<Tensor> params, AdamWOptions options);

    // After backward: this rank's shard of the gradient, summed over the ranks and divided by N.
    void reduce_gradients();
    // The global norm of the averaged gradient; with max_norm > 0 and a larger norm, the shard is
    // scaled to max_norm (as clip_grad_norm does). A non-finite norm is returned, nothing scaled.
    double clip_grad_norm(double max_norm, double loss_scale = 1.0);
    // AdamW on this rank's shard, then every rank gathers the updated parameters.
    void step(double lr);
    void zero_grad();

    // The whole moments as an AdamW over the parameters (for a checkpoint): collective.
    AdamW gather_full() const;
    // Takes this rank's shard of a whole state (every rank passes the same one).
    void load_full(const AdamW& full);
    int64_t steps() const { return shard_opt_.steps(); }
    int64_t moment_bytes() const;  // m and v of this rank's shard
    // The moments of this rank's shard: m then v per piece (the trainer checks them finite).
    std::vector<Tensor> state() const { return shard_opt_.state(); }

  private:
    struct Piece {  // the part of parameter k inside this rank's shard
        size_t param;
        int64_t begin, length;  // in the parameter's flat elements
    };
    static std::vector<Tensor> shard_views(const std::vector<Tensor>& params,
                                           const std::vector<Piece>& pieces);

    std::vector<Tensor> params_;
    int64_t shard_size_ = 0;
    std::vector<Piece> pieces_;
    std::vector<Tensor> views_;  // one leaf per piece: a 1-D view of the parameter's elements
    Tensor grad_flat_, grad_shard_, param_shard_, param_flat_;
    AdamW shard_opt_;
};

}  // namespace qk::nn
