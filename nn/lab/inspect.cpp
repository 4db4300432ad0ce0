#include "nn/lab/inspect.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "nn/signals/plot.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace {

// The gains of a layer's QK-norm as applied to q and k: min and max over both.
std::pair<double, double> gain_range(const CausalSelfAttention& attn) {
    double lo = INFINITY, hi = -INFINITY;
    for (const auto& norm : {attn.q_norm, attn.k_norm}) {
        if (!norm) continue;
        for (double w : norm->weight.to_vector<double>()) {
            const double gain = norm->unit_offset ? 1.0 + w : w;
            lo = std::min(lo, gain), hi = std::max(hi, gain);
        }
    }
    if (attn.qk_scale.defined())
        for (double g : attn.qk_scale.to_vector<double>())
            lo = std::min(lo, g), hi = std::max(hi, g);
    return {lo, hi};
}

// Adds one window's stats into the running per-head signals (means weighted by rows).
void accumulate(std::vector<HeadSignals>& heads, const AttentionStats& s, double weight,
                int64_t group) {
    for (size_t h = 0; h < heads.size(); ++h) {
        HeadSignals& out = heads[h];
        const size_t kv = h / static_cast<size_t>(group);
        // A NaN is kept (std::max would drop it, and a broken head would read max |logit| 0).
        const double m = s.head_max_logit[h];
        if (!std::isnan(out.max_logit))
            out.max_logit = std::isnan(m) ? m : std::max(out.max_logit, m);
        out.entropy += weight * s.head_entropy[h];
        out.q_norm += weight * s.head_q_norm[h];
        out.q_norm_after += weight * s.head_q_norm_after[h];
        out.k_norm += weight * s.head_k_norm[kv];
        out.k_norm_after += weight * s.head_k_norm_after[kv];
    }
}

// Refuses a report that holds a non-finite number, naming the loss and the first heads: a NaN
// weight made inspect print "loss nan" and exit 0.
void check_finite(const InspectReport& r) {
    std::vector<std::string> bad;
    if (!std::isfinite(r.loss)) bad.push_back(fmt::format("the mean loss is {}", r.loss));
    for (size_t layer = 0; layer < r.heads.size() && bad.size() < 4; ++layer)
        for (size_t h = 0; h < r.heads[layer].size() && bad.size() < 4; ++h) {
            const HeadSignals& s = r.heads[layer][h];
            const std::pair<const char*, double> signals[] = {{"max |logit|", s.max_logit},
                                                              {"entropy", s.entropy},
                                                              {"|q|", s.q_norm},
                                                              {"|k|", s.k_norm},
                                                              {"|q| after", s.q_norm_after},
                                                              {"|k| after", s.k_norm_after}};
            for (const auto& [name, value] : signals)
                if (!std::isfinite(value)) {
                    bad.push_back(fmt::format("layer {} head {}: {} is {}", layer, h, name, value));
                    break;
                }
        }
    QK_CHECK(bad.empty(),
             "inspect: the model gives numbers that are not finite over this text "
             "(a weight that is not finite?): {}",
             fmt::join(bad, "; "));
}

}  // namespace

InspectReport inspect_model(GPT& model, const std::vector<int32_t>& ids, int64_t window) {
    const GPTConfig& c = model.config();
    QK_CHECK(window >= 1 && window <= c.block_size,
             "inspect: the window must be in [1, block_size = {}], got {}", c.block_size, window);
    QK_CHECK(ids.size() >= 2, "inspect: the text gives {} token(s); at least 2 are needed",
             ids.size());
    NoGradGuard no_grad;
    model.eval();
    InspectReport report;
    report.heads.assign(c.n_layer, std::vector<HeadSignals>(c.n_head));
    const Device device = model.wte->weight.device();
    double loss_sum = 0;
    const int64_t predictions = static_cast<int64_t>(ids.size()) - 1;
    for (int64_t begin = 0; begin < predictions; begin += window) {
        const int64_t T = std::min(window, predictions - begin);
        const std::vector<int32_t> x(ids.begin() + begin, ids.begin() + begin + T);
        const std::vector<int32_t> y(ids.begin() + begin + 1, ids.begin() + begin + T + 1);
        const GPTOutput out =
            model.forward(from_ids(x, {1, T}).to(device), from_ids(y, {1, T}).to(device), true);
        loss_sum += out.cross_entropy.item() * static_cast<double>(T);
        // Per-head means are weighted by the window's rows, so short last windows count less.
        const double weight = static_cast<double>(T) / static_cast<double>(predictions);
        for (int64_t layer = 0; layer < c.n_layer; ++layer)
            accumulate(report.heads[layer], out.stats[layer], weight, c.n_head / c.kv_heads());
        ++report.windows;
    }
    report.tokens = predictions;
    report.loss = loss_sum / static_cast<double>(predictions);
    for (const auto& block : model.h) report.gain_range.push_back(gain_range(*block->attn));
    check_finite(report);
    return report;
}

std::string inspect_table(const InspectReport& r) {
    std::string out = fmt::format(
        "mean next-token loss {:.4f} nats over {} tokens ({} window(s))\n"
        "layer head  max|logit|  entropy   |q| before  |k| before  |q| after  |k| after  "
        "gains\n",
        r.loss, r.tokens, r.windows);
    for (size_t layer = 0; layer < r.heads.size(); ++layer)
        for (size_t h = 0; h < r.heads[layer].size(); ++h) {
            const HeadSignals& s = r.heads[layer][h];
            const auto [lo, hi] = r.gain_range[layer];
            const std::string gains =
                std::isfinite(lo) && h == 0 ? fmt::format("[{:.3g}, {:.3g}]", lo, hi) : "";
            out += fmt::format(
                "{:5} {:4}  {:10.4g}  {:7.4f}  {:10.4g}  {:10.4g}  {:9.4g}  {:9.4g}  "
                "{}\n",
                layer, h, s.max_logit, s.entropy, s.q_norm, s.k_norm, s.q_norm_after,
                s.k_norm_after, gains);
        }
    return out;
}

std::string inspect_svg(const InspectReport& r, const std::string& title) {
    using Field = double HeadSignals::*;
    const std::pair<const char*, Field> signals[] = {
        {"max |attention logit|", &HeadSignals::max_logit},
        {"attention entropy (nats)", &HeadSignals::entropy},
        {"|q| before the QK-norm", &HeadSignals::q_norm},
        {"|k| before the QK-norm", &HeadSignals::k_norm},
        {"|q| into the dot product", &HeadSignals::q_norm_after},
        {"|k| into the dot product", &HeadSignals::k_norm_after}};
    std::vector<plot::Panel> panels;
    for (const auto& [name, field] : signals) {
        plot::Panel panel;
        panel.title = name, panel.x_label = "head", panel.y_label = name;
        for (size_t layer = 0; layer < r.heads.size(); ++layer) {
            plot::Series series{fmt::format("layer {}", layer), {}, {}, true};
            for (size_t h = 0; h < r.heads[layer].size(); ++h) {
                series.x.push_back(static_cast<double>(h));
                series.y.push_back(r.heads[layer][h].*field);
            }
            panel.series.push_back(std::move(series));
        }
        panels.push_back(std::move(panel));
    }
    return plot::render_svg(panels, 2,
                            fmt::format("{}\nmean next-token loss {:.4f} nats over {} tokens",
                                        title, r.loss, r.tokens));
}

}  // namespace qk::nn
