// The plot of a run: losses, learning rate and gradient norm (fp16's loss scale, fp8's saturation
// counts), the stability signals per layer (max attention logit, attention entropy, mean ‖q‖ and
// ‖k‖) and, for a mixed text + image run, the signals by modality; read back from metrics.jsonl,
// under a title that says what the run is.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "nn/signals/metrics_file.h"
#include "nn/signals/plot.h"
#include "nn/train/trainer.h"

namespace qk::nn {

namespace {

// The JSON library writes NaN and Inf as null (a diverging run's attention logits, say): read
// anything that is not a number back as NaN, which the plot skips.
double number(const nlohmann::json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

// One step's fp8_saturated (per layer: x, weight, grad, and q, k, logits per head with
// --fp8-attention) as one point per kind, summed over the layers.
void add_saturation_counts(const nlohmann::json& layers, double step,
                           std::vector<plot::Series>& series) {
    const char* kinds[] = {"x", "weight", "grad", "q", "k", "logits"};
    const char* labels[] = {"x (E4M3)", "W (E4M3)", "dY (E5M2)",
                            "q (E4M3)", "k (E4M3)", "logits (E4M3, scale 1)"};
    for (size_t i = 0; i < std::size(kinds); ++i) {
        double total = 0;
        bool present = false;
        for (const auto& layer : layers) {
            if (!layer.is_object() || !layer.contains(kinds[i])) continue;
            present = true;
            const auto& v = layer[kinds[i]];
            if (v.is_number()) total += v.get<double>();
            if (v.is_array())
                for (const auto& head : v) total += head.is_number() ? head.get<double>() : 0;
        }
        if (!present) continue;
        auto it = std::find_if(series.begin(), series.end(),
                               [&](const plot::Series& s) { return s.label == labels[i]; });
        if (it == series.end()) it = series.insert(series.end(), {labels[i], {}, {}});
        it->x.push_back(step);
        it->y.push_back(total);
    }
}

// A point of the series `label` in group, the series added on its first point.
void add_point(std::vector<plot::Series>& group, const std::string& label, double x, double y) {
    auto it = std::find_if(group.begin(), group.end(),
                           [&](const plot::Series& s) { return s.label == label; });
    if (it == group.end()) it = group.insert(group.end(), {label, {}, {}});
    it->x.push_back(x);
    it->y.push_back(y);
}

// A mixed text + image run's signals by modality (docs/modalities.md#signals-by-modality).
struct ModalityPanels {
    std::vector<plot::Series> loss, log_z, norms, max_logit, gains;

    void add(const nlohmann::json& m, double step) {
        for (const char* modality : {"text", "image"}) {
            if (m.contains("loss")) add_point(loss, modality, step, number(m["loss"], modality));
            if (m.contains("log_z")) add_point(log_z, modality, step, number(m["log_z"], modality));
        }
        if (!m.contains("layers") || !m["layers"].is_array()) return;
        const auto& layers = m["layers"];
        // Norms: the mean over layers; the largest logit of each pair kind over layers.
        for (const char* modality : {"text", "image"})
            for (const char* which : {"q_norm", "k_norm"}) {
                double total = 0;
                for (const auto& layer : layers)
                    total += layer.contains(which) ? number(layer[which], modality) : NAN;
                add_point(norms, fmt::format("‖{}‖ {}", which[0], modality), step,
                          total / static_cast<double>(std::max<size_t>(1, layers.size())));
            }
        for (const char* pair : {"text>text", "text>image", "image>text", "image>image"}) {
            double top = NAN;
            for (const auto& layer : layers)
                if (layer.contains("max_logit"))
                    top = std::fmax(top, number(layer["max_logit"], pair));
            add_point(max_logit, pair, step, top);
        }
        for (size_t i = 0; i < layers.size(); ++i)
            for (const char* which : {"q_gain", "k_gain"})
                if (layers[i].contains(which) && layers[i][which].is_number())
                    add_point(gains, fmt::format("layer {} {}", i, which[0]), step,
                              number(layers[i], which));
    }

    void append_to(std::vector<plot::Panel>& panels) const {
        if (loss.empty()) return;
        panels.push_back({"Training loss by the target's modality", "step", "cross-entropy", false,
                          false, loss});
        panels.push_back({"Max |attention logit| by query > key modality (over layers)", "step",
                          "max |s|", false, true, max_logit});
        panels.push_back({"Mean ‖q‖, ‖k‖ before normalisation, by modality", "step", "norm", false,
                          false, norms});
        panels.push_back({"log Z of the output logits, by the target's modality", "step",
                          "mean logsumexp(z)", false, false, log_z});
        if (!gains.empty())
            panels.push_back({"QK-norm gains max |g|", "step", "max |g|", false, false, gains});
    }
};

}  // namespace

void write_run_plot(const TrainConfig& cfg) {
    using nlohmann::json;
    const std::string& run_dir = cfg.run_dir;
    // Validation comes every eval_every steps: its points are marked, its line only joins them.
    plot::Series train{"train", {}, {}}, val{"val", {}, {}, true}, grad{"grad norm", {}, {}};
    plot::Series lr{"lr", {}, {}};
    // --precision fp16: the loss scale, and the steps skipped for overflowing gradients.
    plot::Series scale{"loss scale", {}, {}}, skipped{"skipped step", {}, {}, true};
    // --precision fp8: per step, the values that saturated, summed over the layers, per tensor
    // kind.
    std::vector<plot::Series> saturated;
    std::vector<plot::Series> max_logit, entropy, q_norm, k_norm;
    ModalityPanels modality;
    for (const MetricsRecord& record : read_metrics(run_dir).records) {
        const json& j = record.record;
        const double step = number(j, "step");
        if (j.contains("val_loss")) {  // step 0 holds only the loss at initialisation
            val.x.push_back(step);
            val.y.push_back(number(j, "val_loss"));
        }
        if (!j.contains("loss") || !j["loss"].is_number()) continue;
        train.x.push_back(step);
        train.y.push_back(j["loss"].get<double>());
        if (j.contains("lr")) {
            lr.x.push_back(step);
            lr.y.push_back(number(j, "lr"));
        }
        if (j.contains("grad_norm")) {
            grad.x.push_back(step);
            grad.y.push_back(number(j, "grad_norm"));
        }
        if (j.contains("loss_scale")) {
            scale.x.push_back(step);
            scale.y.push_back(number(j, "loss_scale"));
            if (j.contains("skipped") && j["skipped"] == true) {  // any other value: not skipped
                skipped.x.push_back(step);
                skipped.y.push_back(number(j, "loss_scale"));
            }
        }
        if (j.contains("fp8_saturated") && j["fp8_saturated"].is_array())
            add_saturation_counts(j["fp8_saturated"], step, saturated);
        if (j.contains("modality") && j["modality"].is_object()) modality.add(j["modality"], step);
        if (!j.contains("layers") || !j["layers"].is_array()) continue;
        const auto& layers = j["layers"];
        for (size_t i = 0; i < layers.size(); ++i) {
            for (auto* group : {&max_logit, &entropy, &q_norm, &k_norm})
                if (group->size() <= i) group->push_back({fmt::format("layer {}", i), {}, {}});
            auto add = [&](std::vector<plot::Series>& g, const char* key) {
                g[i].x.push_back(step);
                g[i].y.push_back(layers[i].is_object() ? number(layers[i], key) : NAN);
            };
            add(max_logit, "max_logit");
            add(entropy, "entropy");
            add(q_norm, "q_norm");
            add(k_norm, "k_norm");
        }
    }
    // The loss axis fits the run after its first 5 % of steps: the loss at initialisation
    // (step 0's validation, ~4.2 nats for characters) is drawn at the top edge, not to scale.
    const double last_step = train.x.empty() ? 0 : train.x.back();
    std::string loss_title = "Loss (nats/token)";
    if (!val.y.empty() && std::isfinite(val.y.back()))
        loss_title += fmt::format(", final val {:.4f} at step {:g}", val.y.back(), val.x.back());
    plot::Panel loss{loss_title, "step", "cross-entropy", false, false, {train, val}};
    if (last_step >= 20) {
        loss.y_range_from_x = 0.05 * last_step;
        loss.y_label = "cross-entropy (the first 5 % of steps clipped)";
    }
    std::vector<plot::Panel> panels{
        loss,
        {"Learning rate", "step", "lr", false, false, {lr}},
        {"Gradient norm (before clipping)", "step", "‖g‖", false, true, {grad}},
        {"Max |attention logit|", "step", "max |s|", false, true, max_logit},
        {"Attention entropy", "step", "mean −Σ A log A", false, false, entropy},
        {"Mean ‖q‖ before normalisation", "step", "‖q‖", false, false, q_norm},
        {"Mean ‖k‖ before normalisation", "step", "‖k‖", false, false, k_norm},
    };
    if (!saturated.empty())  // fp8: the loss scale stays 1; the skipped steps go in the title
        panels.insert(
            panels.begin() + 3,
            {fmt::format("FP8 values at the format's max, {} step(s) skipped", skipped.x.size()),
             "step", "values per step", false, false, saturated});
    else if (!scale.x.empty())
        panels.insert(panels.begin() + 3,
                      {fmt::format("Loss scale (fp16), {} step(s) skipped", skipped.x.size()),
                       "step",
                       "scale",
                       false,
                       true,
                       {scale, skipped}});
    modality.append_to(panels);
    std::string dir = run_dir;  // "runs/x/" names the run x too
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const std::string name = std::filesystem::path(dir).filename().string();
    write_file_atomic(run_dir + "/plot.svg",
                      plot::render_svg(panels, 2, fmt::format("{}: {}", name, describe_run(cfg))));
}

}  // namespace qk::nn
