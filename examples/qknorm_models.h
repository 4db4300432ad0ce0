// `qknorm export --hf` (a trained model written as a Hugging Face model directory, nn/hf/hf.h) and
// `qknorm inspect` (a model's attention signals over a text, nn/lab/inspect.h).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "nn/train/checkpoint.h"

namespace qk::cli {

struct ExportArgs {
    std::string run_dir, ckpt, hf_dir;
    bool force = false;  // replace the model files of a non-empty --hf directory
};

CLI::App* add_export_command(CLI::App& app, ExportArgs& args);
int run_export(const ExportArgs& args);

struct InspectArgs {
    std::string model_dir, ckpt, run_dir, text, out = "inspect.svg";
    int64_t window = 0, max_tokens = 4096;
};

CLI::App* add_inspect_command(CLI::App& app, InspectArgs& args);

// A Hugging Face directory as `inspect` and `sample` read it: the model (computing in `precision`
// when given), with the directory's own tokenizer, or the text as bytes when it has none; a
// tokenizer with more ids than the model's embedding is refused, naming `command`.
nn::LoadedModel load_hf_directory(const std::string& dir, const char* command,
                                  std::optional<Precision> precision = {});
int run_inspect(const InspectArgs& args);

}  // namespace qk::cli
