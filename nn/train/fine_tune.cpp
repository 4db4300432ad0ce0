#include "nn/train/fine_tune.h"

#include <nlohmann/json.hpp>

#include "nn/hf/hf.h"
#include "nn/optim/data_parallel.h"

namespace qk::nn {

void import_model_config(TrainConfig& cfg) {
    if (cfg.init_from.empty()) return;
    std::map<std::string, std::string> fields;
    if (dist::is_root()) {
        const GPTConfig imported = read_hf_config(cfg.init_from + "/config.json").config;
        fields = with_runtime_of(imported, cfg.model).to_strings();
    }
    fields = nlohmann::json::parse(broadcast_string(nlohmann::json(fields).dump()))
                 .get<std::map<std::string, std::string>>();
    cfg.model = GPTConfig::from_strings(fields);
    if (cfg.context == 0 && cfg.model.block_size > kDefaultFineTuneContext)
        cfg.context = kDefaultFineTuneContext;
}

void import_model_weights(const TrainConfig& cfg, GPT& model) {
    QK_CHECK(model.device() == Device::cpu,
             "import_model_weights: the model must be on the cpu while it is loaded");
    if (dist::is_root()) load_hf_weights(model, cfg.init_from);
    broadcast_tensors(model.parameters());
}

}  // namespace qk::nn
