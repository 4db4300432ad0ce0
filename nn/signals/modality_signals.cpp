// The stability signals split by modality (nn/signals/modality_signals.h).
#include "nn/signals/modality_signals.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/distributed.h"
#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace qk::nn {

using json = nlohmann::json;

namespace {

// 0 (text) or 1 (image) for each id.
std::vector<int> modalities_of(const Tensor& ids, const ModalityVocab& vocab) {
    std::vector<int> m;
    for (const int32_t id : ids.to_vector<int32_t>()) m.push_back(vocab.is_image(id) ? 1 : 0);
    return m;
}

// The loss, ‖z‖ and log Z sums over positions, by the target's modality.
void add_output_sums(ModalitySignals& s, const Tensor& logits, const std::vector<int32_t>& targets,
                     const std::vector<int>& target_modality) {
    const int64_t N = static_cast<int64_t>(targets.size());
    const Tensor flat = logits.reshape({N, logits.size(-1)});
    const auto norms = sqrt(sum(flat * flat, {-1})).to_vector<double>();
    const auto log_z = logsumexp(flat, {-1}).to_vector<double>();
    for (int m = 0; m < 2; ++m) {
        std::vector<int32_t> only(targets);  // the other modality's targets ignored
        double count = 0;
        for (size_t i = 0; i < only.size(); ++i) {
            if (target_modality[i] != m) {
                only[i] = -1;
                continue;
            }
            s.logit_norm[m] += norms[i];
            s.log_z[m] += log_z[i];
            count += 1;
        }
        s.targets[m] += count;
        if (count == 0) continue;
        const Tensor t = from_ids(only, {N}).to(logits.device());
        s.loss[m] += cross_entropy(flat, t, -1).item() * count;
    }
}

// Sums of the D-vector norms of t (B, H, T, D) by the modality of their position.
void add_vector_norms(double sums[2], double counts[2], const Tensor& t,
                      const std::vector<int>& modality) {
    const int64_t B = t.size(0), H = t.size(1), T = t.size(2);
    const auto norms = sqrt(sum(t * t, {-1})).to_vector<double>();  // (B, H, T)
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < T; ++i) {
                const int m = modality[static_cast<size_t>(b * T + i)];
                sums[m] += norms[static_cast<size_t>((b * H + h) * T + i)];
                counts[m] += 1;
            }
}

// q or k as the attention kernel multiplies them: rounded to bf16 or fp16 under mixed precision.
Tensor as_the_kernel_reads(const Tensor& t, Precision precision) {
    if (precision != Precision::bf16 && precision != Precision::fp16) return t;
    return t.to(precision == Precision::bf16 ? kBF16 : kF16).to(kF32);
}

// max |s| by (query, key) modality over the causal (and windowed) pairs.
void add_logit_maxima(ModalitySignals::Layer& layer, const AttentionStats& stats,
                      const std::vector<int>& modality) {
    Tensor q = as_the_kernel_reads(stats.q_entering, stats.precision);  // (B, H, T, D)
    Tensor k = as_the_kernel_reads(stats.k_entering, stats.precision);  // (B, Hkv, T, D)
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1);
    if (Hkv != H)  // grouped-query: each key head serves H / Hkv query heads
        k = k.unsqueeze(2).expand({B, Hkv, H / Hkv, T, D}).reshape({B, H, T, D});
    const auto s = matmul(q, k.transpose(-2, -1)).to_vector<double>();  // (B, H, T, T)
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const double scale = std::abs(stats.head_logit_scale[static_cast<size_t>(h)]);
            for (int64_t i = 0; i < T; ++i) {
                const int a = modality[static_cast<size_t>(b * T + i)];
                const int64_t first =
                    stats.window > 0 ? std::max<int64_t>(0, i - stats.window + 1) : 0;
                const double* row = &s[static_cast<size_t>(((b * H + h) * T + i) * T)];
                for (int64_t j = first; j <= i; ++j) {
                    const int c = modality[static_cast<size_t>(b * T + j)];
                    layer.max_logit[a][c] =
                        std::max(layer.max_logit[a][c], std::abs(row[j]) * scale);
                    layer.pairs[a][c] += 1;
                }
            }
        }
}

double max_abs_gain(const std::shared_ptr<Norm>& norm) {
    if (!norm) return NAN;
    const double offset = norm->unit_offset ? 1.0 : 0.0;
    double g = 0;
    for (const double w : norm->weight.to_vector<double>()) g = std::max(g, std::abs(w + offset));
    return g;
}

json pair_of(const double values[2], const double counts[2]) {
    json j;
    j["text"] = counts[0] > 0 ? json(values[0] / counts[0]) : json();
    j["image"] = counts[1] > 0 ? json(values[1] / counts[1]) : json();
    return j;
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(); }

}  // namespace

ModalitySignals modality_signals(const GPT& model, const GPTOutput& out, const Tensor& ids,
                                 const Tensor& targets, const ModalityVocab& vocab) {
    NoGradGuard no_grad;
    ModalitySignals s;
    const std::vector<int> position = modalities_of(ids, vocab),
                           target = modalities_of(targets, vocab);
    add_output_sums(s, out.logits, targets.to_vector<int32_t>(), target);
    for (size_t i = 0; i < out.stats.size(); ++i) {
        const AttentionStats& stats = out.stats[i];
        ModalitySignals::Layer layer;
        add_vector_norms(layer.q_norm, layer.q_vectors, stats.q_before, position);
        add_vector_norms(layer.k_norm, layer.k_vectors, stats.k_before, position);
        add_logit_maxima(layer, stats, position);
        layer.q_gain = max_abs_gain(model.h[i]->attn->q_norm);
        layer.k_gain = max_abs_gain(model.h[i]->attn->k_norm);
        s.layers.push_back(layer);
    }
    return s;
}

void add_output_signals(ModalitySignals& signals, const Tensor& logits, const Tensor& targets,
                        const ModalityVocab& vocab) {
    NoGradGuard no_grad;
    add_output_sums(signals, logits, targets.to_vector<int32_t>(), modalities_of(targets, vocab));
}

void reduce_over_ranks(ModalitySignals& s) {
    if (dist::world_size() == 1) return;
    // Every sum and count in one collective; the maxima one each.
    std::vector<double*> sums;
    for (int m = 0; m < 2; ++m)
        sums.insert(sums.end(), {&s.loss[m], &s.logit_norm[m], &s.log_z[m], &s.targets[m]});
    for (auto& layer : s.layers)
        for (int m = 0; m < 2; ++m) {
            sums.insert(sums.end(), {&layer.q_norm[m], &layer.k_norm[m], &layer.q_vectors[m],
                                     &layer.k_vectors[m], &layer.pairs[m][0], &layer.pairs[m][1]});
            for (double& top : layer.max_logit[m]) top = dist::all_reduce_max(top);
        }
    std::vector<double> values;
    for (const double* v : sums) values.push_back(*v);
    Tensor summed = from_vector(values, {static_cast<int64_t>(values.size())}, kF64);
    dist::all_reduce_sum(summed);
    const std::vector<double> total = summed.to_vector<double>();
    for (size_t i = 0; i < sums.size(); ++i) *sums[i] = total[i];
}

json modality_json(const ModalitySignals& s) {
    json j{{"loss", pair_of(s.loss, s.targets)},
           {"logit_norm", pair_of(s.logit_norm, s.targets)},
           {"log_z", pair_of(s.log_z, s.targets)}};
    static const char* names[2] = {"text", "image"};
    json layers = json::array();
    for (const auto& layer : s.layers) {
        json max_logit;
        for (int a = 0; a < 2; ++a)
            for (int c = 0; c < 2; ++c)
                max_logit[fmt::format("{}>{}", names[a], names[c])] =
                    layer.pairs[a][c] > 0 ? json(layer.max_logit[a][c]) : json();
        layers.push_back({{"q_norm", pair_of(layer.q_norm, layer.q_vectors)},
                          {"k_norm", pair_of(layer.k_norm, layer.k_vectors)},
                          {"max_logit", max_logit},
                          {"q_gain", finite_or_null(layer.q_gain)},
                          {"k_gain", finite_or_null(layer.k_gain)}});
    }
    j["layers"] = layers;
    return j;
}

}  // namespace qk::nn
