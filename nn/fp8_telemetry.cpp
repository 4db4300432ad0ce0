// FP8 training state and overflow counts (nn/fp8_telemetry.h).
#include "nn/fp8_telemetry.h"

#include <set>

#include "core/distributed.h"
#include "core/error.h"

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

int64_t take_summed(DelayedScaling* scaling) {
    return static_cast<int64_t>(
        dist::all_reduce_sum(static_cast<double>(scaling->take_saturated())));
}

int64_t take_linear(const std::shared_ptr<Linear>& l, DelayedScaling Fp8LinearScaling::*which) {
    return l && l->fp8 ? take_summed(&(l->fp8.get()->*which)) : 0;
}

}  // namespace

nlohmann::json take_fp8_saturation(GPT& model) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& block : model.h) {
        CausalSelfAttention& attn = *block->attn;
        const std::shared_ptr<Linear> linears[] = {attn.c_attn, attn.c_proj, block->mlp->c_fc,
                                                   block->mlp->c_gate, block->mlp->c_proj};
        nlohmann::json layer;
        for (const auto& [key, which] :
             {std::pair{"x", &Fp8LinearScaling::x}, std::pair{"weight", &Fp8LinearScaling::weight},
              std::pair{"grad", &Fp8LinearScaling::grad}}) {
            int64_t n = 0;
            for (const auto& l : linears) n += take_linear(l, which);
            layer[key] = n;
        }
        if (attn.fp8_q) {
            layer["q"] = take_summed(attn.fp8_q.get());
            layer["k"] = take_summed(attn.fp8_k.get());
            std::vector<int64_t> heads(static_cast<size_t>(model.config().n_head), 0);
            for (size_t h = 0; h < attn.fp8_logits_saturated.size() && h < heads.size(); ++h)
                heads[h] = attn.fp8_logits_saturated[h];
            for (int64_t& n : heads)
                n = static_cast<int64_t>(dist::all_reduce_sum(static_cast<double>(n)));
            attn.fp8_logits_saturated.assign(heads.size(), 0);
            layer["logits"] = heads;
        }
        layers.push_back(layer);
    }
    return layers;
}

}  // namespace qk::nn
