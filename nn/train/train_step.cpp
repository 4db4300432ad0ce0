// The gradients of one training step (nn/train/train_step.h).
#include "nn/train/train_step.h"

#include <algorithm>

#include "core/distributed.h"
#include "nn/signals/fp8_telemetry.h"
#include "ops/elementwise.h"

namespace qk::nn {

namespace {

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

// Rank r's rows of micro-batch k of the global batch (B, T): micro-batches of b = B / (N·K)
// rows, micro-batch k of rank r at rows [(k·N + r)·b, (k·N + r + 1)·b). Over all ranks and
// micro-batches they are the global batch, each row once.
Tensor micro_rows(const Tensor& batch, int64_t k, int64_t micro_size) {
    const int64_t index = k * dist::world_size() + dist::rank();
    return batch.narrow(0, index * micro_size, micro_size).contiguous();
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

}  // namespace

StepGradients accumulate_gradients(GPT& model, const TextDataset& data, const TrainConfig& cfg,
                                   Generator& data_gen, RunOptimizer& optimizer,
                                   std::vector<AttentionStats>* stats, double loss_scale,
                                   ModalitySignals* modality, const ModalityVocab& vocab) {
    const bool many = dist::world_size() > 1;
    const int64_t K = cfg.grad_accum, micro_size = cfg.batch_size / (dist::world_size() * K);
    Tensor ids, targets;  // the global batch, of which this rank reads its rows (micro_rows)
    data.batch(true, cfg.batch_size, data_gen, ids, targets, [&](int64_t row) {
        return (row / micro_size) % dist::world_size() == dist::rank();
    });
    double loss_sum = 0;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
        const bool last = k + 1 == K;
        const Tensor host_ids = micro_rows(ids, k, micro_size);
        const Tensor host_targets = micro_rows(targets, k, micro_size);
        const Tensor micro_ids = host_ids.to(model.device());
        const Tensor micro_targets = host_targets.to(model.device());
        // The signals come from the last micro-batch; QK-Clip's per-head max from every one.
        const bool measure = stats && (last || cfg.qk_clip > 0);
        const double factor = loss_scale / static_cast<double>(K);  // 1 unless fp16 or K > 1
        // The factor is the loss's gradient in the backward below: announced to the forward, so
        // that a fused head computes the logits' gradient for it in the loss's pass.
        GPTOutput out = model.forward(micro_ids, micro_targets, measure, factor);
        loss_sum += out.cross_entropy.item();
        finite = finite && std::isfinite(out.loss.item());
        if (measure && last && modality)
            *modality = modality_signals(model, out, host_ids, host_targets, vocab);
        if (measure) merge_stats(*stats, std::move(out.stats));
        // A non-finite loss ends the run after this step. Alone, its backward is skipped; with
        // other ranks it runs anyway, so that every rank makes the same collectives.
        if (!finite && !many) continue;
        optimizer.set_sync(last);
        (factor == 1 ? out.loss : out.loss * factor).backward();
    }
    if (finite || many) optimizer.finish_gradients();
    sync_fp8_amaxes(model, K);
    if (stats) reduce_stats(*stats);
    if (stats && modality) reduce_over_ranks(*modality);
    const double micro_batches = static_cast<double>(K * dist::world_size());
    return {dist::all_reduce_sum(loss_sum) / micro_batches, finite || many};
}

nlohmann::json stats_to_json(const std::vector<AttentionStats>& stats) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& s : stats)
        layers.push_back({{"max_logit", s.max_logit},
                          {"entropy", s.entropy},
                          {"q_norm", s.q_norm},
                          {"k_norm", s.k_norm},
                          {"qk_scale", s.qk_scale},
                          {"head_max_logit", s.head_max_logit}});
    return layers;
}

}  // namespace qk::nn
