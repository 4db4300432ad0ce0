// What `qknorm sweep` writes once the grid is trained: the results table (CSV and JSONL), the LR
// sensitivity of each variant, and three plots in the style of Wortsman et al. 2023:
//   lr_sweep.svg   final validation loss against learning rate, one curve per variant (log x);
//   max_logit.svg  the largest attention logit of any layer against step, at one (high) LR (log y);
//   entropy.svg    the lowest attention entropy of any layer against step, at that LR;
//   param_sweep.svg (with plot_param) final loss against a variant override such as lp's p.
// The curves of the last two come from the first seed's metrics.jsonl.
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "nn/lab/sweep.h"
#include "nn/signals/metrics_file.h"
#include "nn/signals/plot.h"

namespace qk::nn {

namespace {

using json = nlohmann::json;

std::string csv_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "nan"; }

// JSON has no NaN or Inf: they are written as null, the convention of metrics.jsonl.
json json_number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json json_numbers(const std::vector<double>& values) {
    json a = json::array();
    for (double v : values) a.push_back(json_number(v));
    return a;
}

std::string results_csv(const std::vector<RunSummary>& runs) {
    size_t layers = 0;
    for (const RunSummary& r : runs) layers = std::max(layers, r.max_logit.size());
    std::string csv =
        "variant,lr,seed,finished,diverged,steps,init_val_loss,final_val_loss,seconds";
    for (size_t i = 0; i < layers; ++i) csv += fmt::format(",max_logit_l{}", i);
    for (size_t i = 0; i < layers; ++i) csv += fmt::format(",final_entropy_l{}", i);
    csv += "\n";
    for (const RunSummary& r : runs) {
        csv += fmt::format("{},{:g},{},{},{},{},{},{},{:.1f}", r.variant, r.lr, r.seed,
                           r.finished ? 1 : 0, r.diverged ? 1 : 0, r.steps_done,
                           csv_number(r.init_val_loss), csv_number(r.final_val_loss), r.seconds);
        for (size_t i = 0; i < layers; ++i)
            csv += fmt::format(",{}", csv_number(i < r.max_logit.size() ? r.max_logit[i] : NAN));
        for (size_t i = 0; i < layers; ++i)
            csv += fmt::format(",{}",
                               csv_number(i < r.final_entropy.size() ? r.final_entropy[i] : NAN));
        csv += "\n";
    }
    return csv;
}

std::string results_jsonl(const std::vector<RunSummary>& runs) {
    std::string out;
    for (const RunSummary& r : runs)
        out += json{{"variant", r.variant},
                    {"lr", r.lr},
                    {"seed", r.seed},
                    {"finished", r.finished},
                    {"diverged", r.diverged},
                    {"steps", r.steps_done},
                    {"init_val_loss", json_number(r.init_val_loss)},
                    {"final_val_loss", json_number(r.final_val_loss)},
                    {"seconds", r.seconds},
                    {"max_logit", json_numbers(r.max_logit)},
                    {"final_entropy", json_numbers(r.final_entropy)},
                    {"run_dir", r.run_dir}}
                   .dump() +
               "\n";
    return out;
}

std::string sensitivity_csv(const std::vector<VariantSummary>& variants) {
    std::string csv = "variant,best_loss,best_lr,lr_sensitivity,runs,diverged,max_stable_lr\n";
    for (const VariantSummary& v : variants)
        csv += fmt::format("{},{},{},{},{},{},{}\n", v.variant, csv_number(v.best_loss),
                           csv_number(v.best_lr), csv_number(v.lr_sensitivity), v.runs, v.diverged,
                           csv_number(v.max_stable_lr));
    return csv;
}

// Final loss against LR: per LR the seed mean of min(L, L0), as the sensitivity uses.
plot::Panel loss_against_lr(const std::vector<RunSummary>& runs,
                            const std::vector<VariantSummary>& variants) {
    plot::Panel panel{"Final validation loss against learning rate (diverged = loss at init)",
                      "peak learning rate",
                      "val loss (nats/token)",
                      true,
                      false,
                      {}};
    for (const VariantSummary& v : variants) {
        std::map<double, std::pair<double, int>> by_lr;
        for (const RunSummary& r : runs) {
            if (r.variant != v.variant || !r.finished) continue;
            const double l0 = r.init_val_loss;
            by_lr[r.lr].first +=
                std::isfinite(r.final_val_loss) ? std::min(r.final_val_loss, l0) : l0;
            by_lr[r.lr].second += 1;
        }
        plot::Series s{v.variant, {}, {}};
        for (const auto& [lr, sum_count] : by_lr) {
            s.x.push_back(lr);
            s.y.push_back(sum_count.first / sum_count.second);
        }
        panel.series.push_back(std::move(s));
    }
    return panel;
}

// Per stats step of one run: the largest max |s| over layers, and the lowest entropy.
void read_signal_curves(const std::string& run_dir, plot::Series& logit, plot::Series& entropy) {
    for (const MetricsRecord& record : read_metrics(run_dir).records) {
        const json& j = record.record;
        if (!j.contains("layers")) continue;
        double max_logit = 0, min_entropy = INFINITY;
        for (const json& layer : j["layers"]) {
            const json& l = layer.value("max_logit", json());
            const json& e = layer.value("entropy", json());
            max_logit = std::max(max_logit, l.is_number() ? l.get<double>() : INFINITY);
            min_entropy = std::min(min_entropy, e.is_number() ? e.get<double>() : NAN);
        }
        const double step = j.value("step", 0.0);
        logit.x.push_back(step), logit.y.push_back(max_logit);
        entropy.x.push_back(step), entropy.y.push_back(min_entropy);
    }
}

double number_or_nan(const std::string& text) {
    try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        return used == text.size() ? v : NAN;
    } catch (const std::exception&) {
        return NAN;
    }
}

// Final loss against one override of the variants (e.g. lp's p): one curve per variant with that
// override taken out (e.g. `lp:g0=1`), one panel per LR, seeds averaged as in loss_against_lr.
std::vector<plot::Panel> loss_against_param(const std::vector<RunSummary>& runs,
                                            const std::string& key,
                                            const std::vector<double>& lrs) {
    std::vector<plot::Panel> panels;
    for (double lr : lrs) {
        plot::Panel panel{fmt::format("Final validation loss against {}, lr {:g}", key, lr),
                          key,
                          "val loss (nats/token)",
                          false,
                          false,
                          {}};
        std::map<std::string, std::map<double, std::pair<double, int>>> curves;
        for (const RunSummary& r : runs) {
            if (r.lr != lr || !r.finished) continue;
            const Variant v = parse_variant(r.variant);
            std::string rest = v.preset;
            double x = NAN;
            for (const auto& [k, value] : v.overrides)
                if (k == key)
                    x = number_or_nan(value);  // a non-number (g0=henry) has no place on an axis
                else
                    rest += ":" + k + "=" + value;
            if (std::isnan(x)) continue;
            const double l0 = r.init_val_loss;
            auto& point = curves[rest][x];
            point.first += std::isfinite(r.final_val_loss) ? std::min(r.final_val_loss, l0) : l0;
            point.second += 1;
        }
        for (const auto& [label, points] : curves) {
            plot::Series s{label, {}, {}};
            for (const auto& [x, sum_count] : points) {
                s.x.push_back(x);
                s.y.push_back(sum_count.first / sum_count.second);
            }
            panel.series.push_back(std::move(s));
        }
        panels.push_back(std::move(panel));
    }
    return panels;
}

double chosen_plot_lr(const SweepSpec& spec) {
    if (spec.plot_lr > 0) return spec.plot_lr;
    return *std::max_element(spec.lrs.begin(), spec.lrs.end());
}

}  // namespace

void write_sweep_outputs(const SweepSpec& spec, const SweepResult& result) {
    const std::string& out = spec.out_dir;
    write_file_atomic(out + "/results.csv", results_csv(result.runs));
    write_file_atomic(out + "/results.jsonl", results_jsonl(result.runs));
    write_file_atomic(out + "/sensitivity.csv", sensitivity_csv(result.variants));
    write_file_atomic(out + "/lr_sweep.svg",
                      plot::render_svg({loss_against_lr(result.runs, result.variants)}, 1));

    const double lr = chosen_plot_lr(spec);
    plot::Panel logits{fmt::format("Max |attention logit| over layers, lr {:g}", lr),
                       "step",
                       "max |s|",
                       false,
                       true,
                       {}};
    plot::Panel entropy{fmt::format("Lowest attention entropy over layers, lr {:g}", lr),
                        "step",
                        "−Σ A log A (nats)",
                        false,
                        false,
                        {}};
    for (const std::string& variant : spec.variants) {
        plot::Series l{variant, {}, {}}, e{variant, {}, {}};
        read_signal_curves(out + "/runs/" + run_dir_name(variant, lr, spec.seeds.front()), l, e);
        logits.series.push_back(std::move(l));
        entropy.series.push_back(std::move(e));
    }
    write_file_atomic(out + "/max_logit.svg", plot::render_svg({logits}, 1));
    if (!spec.plot_param.empty())
        write_file_atomic(
            out + "/param_sweep.svg",
            plot::render_svg(loss_against_param(result.runs, spec.plot_param, spec.lrs),
                             std::min<int>(static_cast<int>(spec.lrs.size()), 2)));
    write_file_atomic(out + "/entropy.svg", plot::render_svg({entropy}, 1));
}

}  // namespace qk::nn
