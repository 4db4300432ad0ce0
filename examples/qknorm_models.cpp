#include "examples/qknorm_models.h"

#include <filesystem>

#include "nn/checkpoint.h"
#include "nn/hf.h"
#include "nn/trainer.h"

namespace qk::cli {

namespace fs = std::filesystem;

CLI::App* add_export_command(CLI::App& app, ExportArgs& args) {
    CLI::App* cmd = app.add_subcommand(
        "export", "write a trained model as a Hugging Face model directory (transformers loads it)");
    cmd->add_option("--hf", args.hf_dir,
                    "the directory to write: config.json and model.safetensors (float32)")
        ->required();
    cmd->add_option("--run-dir,--run", args.run_dir, "run directory, its latest checkpoint is used");
    cmd->add_option("--ckpt", args.ckpt, "a model checkpoint file, instead of --run-dir");
    return cmd;
}

int run_export(const ExportArgs& args) {
    QK_CHECK(args.run_dir.empty() != args.ckpt.empty(),
             "export: give the model as --run-dir DIR or --ckpt FILE (one of them)");
    const std::string path =
        args.ckpt.empty() ? nn::latest_model_checkpoint(args.run_dir) : args.ckpt;
    QK_CHECK(!path.empty(), "export: {} holds no checkpoint", args.run_dir);
    const nn::LoadedModel loaded = nn::load_model(path);
    const nn::HFFamily family = nn::hf_family_for(loaded.model->config());
    nn::save_hf_model(*loaded.model, args.hf_dir);
    fmt::print("{} -> {} ({}: config.json, model.safetensors)\n", path, args.hf_dir,
               nn::architecture_name(family));
    return 0;
}

}  // namespace qk::cli
