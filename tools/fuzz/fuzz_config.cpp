// libFuzzer target: bytes as each kind of configuration text qknorm reads from a user, a run
// directory or a checkpoint: a run's config.json (TrainConfig::from_json), a checkpoint's model
// metadata (GPTConfig::from_strings, given a JSON object of strings), a tokenizer string
// (Tokenizer::deserialize) and a sweep TOML (parse_config_toml, on toml++). A qk::Error is the
// accepted refusal; any other exception, crash, sanitizer report, leak or timeout is a finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "nn/lab/config_file.h"
#include "nn/model/config.h"
#include "nn/text/data.h"
#include "nn/train/trainer.h"

namespace {

template <typename F>
void refused_or_accepted(F&& f) {
    try {
        f();
    } catch (const qk::Error&) {
    }
}

// The fields of a checkpoint's __metadata__ when the text is a JSON object of strings; the
// harness's own JSON errors are not findings, so they end the attempt here.
bool metadata_fields(const std::string& text, std::map<std::string, std::string>& fields) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return false;
    for (const auto& [key, value] : j.items())
        fields[key] = value.is_string() ? value.get<std::string>() : value.dump();
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    refused_or_accepted([&] { (void)qk::nn::TrainConfig::from_json(text).to_json(); });
    std::map<std::string, std::string> fields;
    if (metadata_fields(text, fields))
        refused_or_accepted([&] { (void)qk::nn::GPTConfig::from_strings(fields).to_strings(); });
    refused_or_accepted([&] {
        const qk::nn::Tokenizer tokenizer = qk::nn::Tokenizer::deserialize(text);
        (void)tokenizer.decode(tokenizer.encode(tokenizer.decode({0})));
    });
    refused_or_accepted([&] { (void)qk::nn::parse_config_toml(text, "fuzz.toml"); });
    return 0;
}
