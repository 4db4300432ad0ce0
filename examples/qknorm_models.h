// `qknorm export --hf`: a trained model written as a Hugging Face model directory (nn/hf.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace qk::cli {

struct ExportArgs {
    std::string run_dir, ckpt, hf_dir;
};

CLI::App* add_export_command(CLI::App& app, ExportArgs& args);
int run_export(const ExportArgs& args);

}  // namespace qk::cli
