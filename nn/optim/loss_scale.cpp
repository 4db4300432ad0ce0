// Dynamic loss scaling (nn/optim/loss_scale.h).
#include "nn/optim/loss_scale.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qk::nn {

namespace {

void check_options(const LossScaleOptions& o) {
    QK_CHECK(std::isfinite(o.init) && o.init > 0,
             "loss scale: the initial scale must be a finite number > 0, got {}", o.init);
    QK_CHECK(o.growth_interval >= 1, "loss scale: the growth interval must be >= 1 step, got {}",
             o.growth_interval);
    QK_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1,
             "loss scale: the growth factor must be a finite number > 1, got {}", o.growth_factor);
    QK_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
             "loss scale: the backoff factor must be in (0, 1), got {}", o.backoff_factor);
}

}  // namespace

LossScaler::LossScaler(const LossScaleOptions& options) : options_(options), scale_(options.init) {
    check_options(options_);
}

bool LossScaler::update(bool overflow) {
    if (!options_.adjust) {
        skipped_ += overflow;
        return !overflow;
    }
    if (overflow) {
        // Never down to 0 (or a subnormal): the loss times the scale must stay a usable number.
        scale_ = std::max(scale_ * options_.backoff_factor,
                          static_cast<double>(std::numeric_limits<float>::min()));
        clean_ = 0;
        ++skipped_;
        return false;
    }
    if (++clean_ >= options_.growth_interval) {
        // Never up to Inf: a scale that cannot grow stays where it is.
        const double grown = scale_ * options_.growth_factor;
        if (grown <= static_cast<double>(std::numeric_limits<float>::max())) scale_ = grown;
        clean_ = 0;
    }
    return true;
}

std::string LossScaler::state_json() const {
    return nlohmann::json{{"scale", scale_}, {"clean_steps", clean_}, {"skipped_steps", skipped_}}
        .dump();
}

void LossScaler::load_state_json(const std::string& text, const std::string& origin) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool ok = j.is_object() && j.contains("scale") && j["scale"].is_number() &&
                    j.contains("clean_steps") && j["clean_steps"].is_number_unsigned() &&
                    j.contains("skipped_steps") && j["skipped_steps"].is_number_unsigned();
    QK_CHECK(ok, "{}: the loss scaler's state is not {{scale, clean_steps, skipped_steps}}: {}",
             origin, text.substr(0, 200));
    const double scale = j["scale"].get<double>();
    QK_CHECK(std::isfinite(scale) && scale > 0, "{}: the saved loss scale {} is not finite and > 0",
             origin, scale);
    const auto clean = j["clean_steps"].get<uint64_t>(),
               skipped = j["skipped_steps"].get<uint64_t>();
    QK_CHECK(clean < (uint64_t{1} << 62) && skipped < (uint64_t{1} << 62),
             "{}: the saved loss-scaler counts ({} clean, {} skipped) are out of range", origin,
             clean, skipped);
    scale_ = scale;
    // A resume may shorten the growth interval: the scale then grows at the next clean step.
    clean_ = std::min(static_cast<int64_t>(clean), options_.growth_interval - 1);
    skipped_ = static_cast<int64_t>(skipped);
}

}  // namespace qk::nn
