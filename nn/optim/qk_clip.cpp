#include "nn/optim/qk_clip.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/elementwise.h"

namespace qk::nn {

namespace {

// Multiplies rows [begin, begin + count) of t (c_attn's weight or bias) by factor.
void scale_rows(const Tensor& t, int64_t begin, int64_t count, double factor) {
    if (!t.defined()) return;
    const Tensor rows = t.detach().narrow(0, begin, count);
    copy_into(rows, rows * factor);
}

}  // namespace

int64_t qk_clip(GPT& model, const std::vector<AttentionStats>& stats, double tau) {
    const GPTConfig& config = model.config();
    QK_CHECK(config.qk_norm == QKNorm::none,
             "qk_clip: needs qk_norm none (the logits of a QK-norm model are bounded already), "
             "got qk_norm {}",
             to_string(config.qk_norm));
    QK_CHECK(std::isfinite(tau) && tau > 0, "qk_clip: tau must be a finite number > 0, got {}",
             tau);
    QK_CHECK(stats.size() == model.h.size(),
             "qk_clip: expected the stats of {} layers, got {} (run the step's forward with "
             "stats)",
             model.h.size(), stats.size());
    NoGradGuard no_grad;
    const int64_t D = config.head_dim(), q_width = config.q_width();
    const bool shared_keys = config.kv_heads() < config.n_head;
    int64_t clipped = 0;
    for (size_t layer = 0; layer < stats.size(); ++layer) {
        const std::vector<double>& head_max = stats[layer].head_max_logit;
        QK_CHECK(static_cast<int64_t>(head_max.size()) == config.n_head,
                 "qk_clip: layer {} has the max logits of {} heads, the model {} heads", layer,
                 head_max.size(), config.n_head);
        const Linear& c_attn = *model.h[layer]->attn->c_attn;
        for (int64_t h = 0; h < config.n_head; ++h) {
            const double S = head_max[static_cast<size_t>(h)];
            if (!(S > tau)) continue;  // at or under τ, or NaN (a diverging step stops the run)
            if (shared_keys) {         // the whole factor on the query head's rows
                scale_rows(c_attn.weight, h * D, D, tau / S);
                scale_rows(c_attn.bias, h * D, D, tau / S);
                ++clipped;
                continue;
            }
            const double gamma = std::sqrt(tau / S);
            for (const int64_t begin : {h * D, q_width + h * D}) {  // the head's q rows, k rows
                scale_rows(c_attn.weight, begin, D, gamma);
                scale_rows(c_attn.bias, begin, D, gamma);
            }
            ++clipped;
        }
    }
    return clipped;
}

}  // namespace qk::nn
