// The stability signals split by modality (docs/modalities.md#signals-by-modality), for runs on a
// mixed text + image stream (nn/text/modality.h). Internal to the trainer: it speaks
// nlohmann::json.
//
// A position's modality is its token's: image for the codes, text for everything else (the
// markers included). Attention signals split by the query's and the key's modality; output
// signals by the modality of the target (what the position predicts):
//   loss[m]        mean cross-entropy over the positions whose target is of modality m
//   logit_norm[m]  mean ‖z‖₂ of those positions' output logits z (V of them)
//   log_z[m]       mean log Z = logsumexp(z): what z-loss pulls toward 0
//   per layer:
//   q_norm[m], k_norm[m]   mean ‖q‖₂, ‖k‖₂ per head vector before the QK-norm, over the
//                          positions of modality m
//   max_logit[a][b]        max |s| over the unmasked pairs whose query is of modality a and key
//                          of modality b, s = scale · q·k as the dot product sees them, before
//                          any soft-cap (the pairs' split of the layer's max_logit)
//   q_gain, k_gain         max |g| of the QK-norm gains (layernorm and rmsnorm variants)
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "nn/model/gpt.h"
#include "nn/text/modality.h"

namespace qk::nn {

struct ModalitySignals {
    static constexpr int kText = 0, kImage = 1;
    // Sums and counts until finish(), so that ranks and micro-batches add up.
    double loss[2] = {0, 0}, logit_norm[2] = {0, 0}, log_z[2] = {0, 0};
    double targets[2] = {0, 0};
    struct Layer {
        double q_norm[2] = {0, 0}, k_norm[2] = {0, 0};
        double q_vectors[2] = {0, 0}, k_vectors[2] = {0, 0};
        double max_logit[2][2] = {{0, 0}, {0, 0}};
        double pairs[2][2] = {{0, 0}, {0, 0}};
        double q_gain = NAN, k_gain = NAN;
    };
    std::vector<Layer> layers;
};

// The signals of one forward: out must hold the logits and the per-layer stats
// (model.forward(ids, targets, true)); ids and targets (B, T) int32 on the cpu.
ModalitySignals modality_signals(const GPT& model, const GPTOutput& out, const Tensor& ids,
                                 const Tensor& targets, const ModalityVocab& vocab);

// Only the output signals (loss, ‖z‖, log Z) of logits (B, T, V) for targets (B, T) on the cpu:
// what an evaluation adds up.
void add_output_signals(ModalitySignals& signals, const Tensor& logits, const Tensor& targets,
                        const ModalityVocab& vocab);

// Sums and counts summed over the ranks, maxima maxed: every rank then holds the global batch's.
void reduce_over_ranks(ModalitySignals& signals);

// The metrics.jsonl object: means from the sums (null where a modality had no position),
// "text" and "image" keys, pairs as "text>image" (query > key).
nlohmann::json modality_json(const ModalitySignals& signals);

}  // namespace qk::nn
