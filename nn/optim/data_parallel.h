// Data-parallel training: N replicas of one model, each on its own share of the global batch,
// kept identical by averaging their gradients before every optimizer step (docs/distributed.md).
//
// GradientSync averages in buckets of about bucket_bytes: parameters are grouped in the reverse of
// their order, the order in which backward completes their gradients (the last layer's first).
// Each parameter carries a grad-ready hook (Tensor::on_grad_ready); when every gradient of a bucket
// is complete, the bucket is copied into one flat buffer and its sum over the ranks starts, non-
// blocking, while backward goes on with the earlier layers. finish() starts what is left, waits
// for every bucket and writes sum / N back into each .grad. Without overlap every bucket starts in
// finish(), after backward (the baseline of bench_dist).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/distributed.h"
#include "core/tensor.h"

namespace qk::nn {

class GradientSync {
  public:
    GradientSync(std::vector<Tensor> params, int64_t bucket_bytes, bool overlap = true);
    ~GradientSync();  // removes its hooks from the parameters
    GradientSync(const GradientSync&) = delete;
    GradientSync& operator=(const GradientSync&) = delete;

    // Off: backward only accumulates into .grad (the first micro-batches of --grad-accum); the
    // hooks start buckets only while it is on.
    void set_enabled(bool on) { enabled_ = on; }
    // After the backward pass (with sync enabled): every .grad becomes the mean over the ranks.
    void finish();

    int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
    int64_t bytes_per_step() const { return bytes_; }        // gradient bytes each rank sends in
    double last_wait_seconds() const { return last_wait_; }  // finish()'s wait, the exposed part

  private:
    struct Bucket {
        std::vector<size_t> members;  // indices into params_
        Tensor flat;  // the members' gradients end to end (host memory, or device with NCCL)
        int64_t ready = 0;
        bool started = false;
        dist::PendingSum sum;
    };
    void on_ready(size_t bucket);
    Device bucket_device() const;
    void start(Bucket& bucket);

    std::vector<Tensor> params_;
    std::vector<Bucket> buckets_;
    size_t next_ = 0;  // the next bucket to start
    bool overlap_, enabled_ = true;
    int64_t bytes_ = 0;
    double last_wait_ = 0;
};

// Stops every rank with a qk::Error when the ranks were not started alike: `settings` (a JSON
// object: the training config and the data-parallel knobs) must be equal on every rank, field by
// field, and so must the parameters (compared by a hash of their bytes). The message names the
// first differing field and its values on rank 0 and on the first rank that differs.
void check_replicas_agree(const std::string& settings, const std::vector<Tensor>& params);

// Root's values on every rank: the tensors in place (same shapes everywhere), the string returned.
void broadcast_tensors(const std::vector<Tensor>& tensors, int root = 0);
std::string broadcast_string(const std::string& value, int root = 0);

}  // namespace qk::nn
