// FP8 training state and overflow counts (nn/signals/fp8_telemetry.h).
#include "nn/signals/fp8_telemetry.h"

#include <algorithm>
#include <set>

#include "core/distributed.h"
#include "core/error.h"
#include "core/factory.h"

namespace qk::nn {

std::string fp8_state_json(const GPT& model) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, scaling] : model.fp8_scalings())
        j[name] = nlohmann::json::parse(scaling->state_json());
    return j.dump();
}

void load_fp8_state(GPT& model, const std::string& text, const std::string& origin) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    QK_CHECK(j.is_object(), "{}: the FP8 scaling state is not a JSON object", origin);
    std::set<std::string> known;
    for (const auto& [name, scaling] : model.fp8_scalings()) {
        QK_CHECK(j.contains(name), "{}: the FP8 scaling state has no entry for {}", origin, name);
        scaling->load_state_json(j[name].dump(), fmt::format("{} ({})", origin, name));
        known.insert(name);
    }
    for (const auto& [name, value] : j.items())
        QK_CHECK(known.count(name),
                 "{}: the FP8 scaling state names {}, which the model does not "
                 "scale in FP8",
                 origin, name);
}

namespace {

// The counts of one layer, in the order take_fp8_saturation reports them: x, weight, grad (each
// summed over the layer's Linears), then with FP8 attention q, k and the logits of each head.
void take_layer_counts(const Block& block, int64_t heads, std::vector<double>& counts) {
    CausalSelfAttention& attn = *block.attn;
    const std::shared_ptr<Linear> linears[] = {attn.c_attn, attn.c_proj, block.mlp->c_fc,
                                               block.mlp->c_gate, block.mlp->c_proj};
    for (DelayedScaling Fp8LinearScaling::*which :
         {&Fp8LinearScaling::x, &Fp8LinearScaling::weight, &Fp8LinearScaling::grad}) {
        int64_t n = 0;
        for (const auto& l : linears)
            if (l && l->fp8) n += (l->fp8.get()->*which).take_saturated();
        counts.push_back(static_cast<double>(n));
    }
    if (!attn.fp8_q) return;
    counts.push_back(static_cast<double>(attn.fp8_q->take_saturated()));
    counts.push_back(static_cast<double>(attn.fp8_k->take_saturated()));
    attn.fp8_logits_saturated.resize(static_cast<size_t>(heads), 0);
    for (int64_t& n : attn.fp8_logits_saturated) {
        counts.push_back(static_cast<double>(n));
        n = 0;
    }
}

}  // namespace

void sync_fp8_amaxes(GPT& model, int64_t micro_batches) {
    if (dist::world_size() == 1) return;
    const auto scalings = model.fp8_scalings();
    if (scalings.empty()) return;  // not an fp8 model: the same on every rank
    const auto slots = static_cast<size_t>(micro_batches);
    // Slot k of scaling i holds the rank's k-th amax of the step; -1 where it recorded fewer (a
    // cast of Inf/NaN records nothing): amaxes are >= 0, so the max over the ranks ignores it.
    std::vector<double> amaxes(scalings.size() * slots, -1.0);
    for (size_t i = 0; i < scalings.size(); ++i) {
        std::vector<float> recent = scalings[i].second->take_recent();
        const size_t keep = std::min(recent.size(), slots);  // the newest, if ever more
        std::copy(recent.end() - static_cast<std::ptrdiff_t>(keep), recent.end(),
                  amaxes.begin() + static_cast<std::ptrdiff_t>(i * slots));
    }
    Tensor maxima = from_vector(amaxes, {static_cast<int64_t>(amaxes.size())}, kF64);
    dist::all_reduce_max(maxima);
    const std::vector<double> reduced = maxima.to_vector<double>();
    for (size_t i = 0; i < scalings.size(); ++i) {
        for (size_t k = 0; k < slots; ++k)
            if (const double amax = reduced[i * slots + k]; amax >= 0)
                scalings[i].second->record(amax);
        scalings[i].second->forget_recent();
    }
}

nlohmann::json take_fp8_saturation(GPT& model) {
    std::vector<double> counts;
    for (const auto& block : model.h) take_layer_counts(*block, model.config().n_head, counts);
    // One collective for the whole step: the sums over the ranks.
    Tensor summed = from_vector(counts, {static_cast<int64_t>(counts.size())}, kF64);
    if (dist::world_size() > 1) dist::all_reduce_sum(summed);
    const std::vector<double> total = summed.to_vector<double>();
    nlohmann::json layers = nlohmann::json::array();
    size_t at = 0;
    auto next = [&] { return static_cast<int64_t>(total.at(at++)); };
    for (const auto& block : model.h) {
        nlohmann::json layer;
        for (const char* key : {"x", "weight", "grad"}) layer[key] = next();
        if (block->attn->fp8_q) {
            layer["q"] = next();
            layer["k"] = next();
            std::vector<int64_t> heads(static_cast<size_t>(model.config().n_head));
            for (int64_t& n : heads) n = next();
            layer["logits"] = heads;
        }
        layers.push_back(layer);
    }
    return layers;
}

}  // namespace qk::nn
