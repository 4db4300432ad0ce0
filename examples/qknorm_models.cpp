#include "examples/qknorm_models.h"

#include "core/file_io.h"
#include "core/safetensors.h"
#include "nn/hf/hf.h"
#include "nn/lab/inspect.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"

namespace qk::cli {

CLI::App* add_export_command(CLI::App& app, ExportArgs& args) {
    CLI::App* cmd = app.add_subcommand(
        "export",
        "write a trained model as a Hugging Face model directory (transformers loads it)");
    cmd->add_option("--hf", args.hf_dir,
                    "the directory to write: config.json, model.safetensors (float32) and the "
                    "tokenizer the model trained with (tokenizer.json, or tokenizer.model with "
                    "tokenizer_config.json)")
        ->required();
    cmd->add_option("--run-dir,--run", args.run_dir,
                    "run directory, its latest checkpoint is used");
    cmd->add_option("--ckpt", args.ckpt, "a model checkpoint file, instead of --run-dir");
    cmd->add_flag("--force", args.force,
                  "--hf may hold a model already: its config.json, model.safetensors, index and "
                  "shards are replaced (other files stay; a run directory is always refused)");
    return cmd;
}

int run_export(const ExportArgs& args) {
    QK_CHECK(args.run_dir.empty() != args.ckpt.empty(),
             "export: give the model as --run-dir DIR or --ckpt FILE (one of them)");
    const std::string path =
        args.ckpt.empty() ? nn::latest_model_checkpoint(args.run_dir) : args.ckpt;
    QK_CHECK(!path.empty(), "export: {} holds no checkpoint", args.run_dir);
    const nn::LoadedModel loaded = nn::load_model(path);
    const nn::HFFamily family = nn::save_hf_model(*loaded.model, args.hf_dir, args.force);
    std::string why;
    const std::vector<std::string> tokenizer_files =
        nn::save_hf_tokenizer(loaded.tokenizer, family, args.hf_dir, &why);
    fmt::print("{} -> {} ({}: config.json, model.safetensors{}{})\n", path, args.hf_dir,
               nn::architecture_name(family), tokenizer_files.empty() ? "" : ", ",
               fmt::join(tokenizer_files, ", "));
    if (tokenizer_files.empty())
        fmt::print(stderr, "qknorm export: no tokenizer written: {}\n", why);
    return 0;
}

CLI::App* add_inspect_command(CLI::App& app, InspectArgs& args) {
    CLI::App* cmd = app.add_subcommand(
        "inspect",
        "run a model over a text: its loss and, per layer and head, the attention "
        "signals (max logit, entropy, |q| and |k| before and after the QK-norm)");
    cmd->add_option("--model", args.model_dir, "a Hugging Face model directory (config.json, ...)");
    cmd->add_option("--ckpt", args.ckpt, "a qknorm model checkpoint file, instead of --model");
    cmd->add_option("--run-dir,--run", args.run_dir, "a run directory: its latest checkpoint");
    cmd->add_option("--text", args.text,
                    "the text file to run over (default: the bundled Tiny Shakespeare)");
    cmd->add_option("--window", args.window,
                    "tokens per forward pass; 0 = the model's block size (at most 1024)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));  // -5 was the default, silently
    cmd->add_option("--max-tokens", args.max_tokens, "read at most this many tokens of the text")
        ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
    cmd->add_option("--out", args.out,
                    "the SVG of the signals per head (written in the current directory unless "
                    "a path says otherwise)")
        ->capture_default_str();
    return cmd;
}

nn::LoadedModel load_hf_directory(const std::string& dir, const char* command,
                                  std::optional<Precision> precision) {
    nn::LoadedModel loaded;
    loaded.model = nn::load_hf_model(dir, kF32, precision);
    const std::string own = nn::tokenizer_file_in(dir);
    if (!own.empty()) loaded.tokenizer = nn::Tokenizer::from_file(own);
    QK_CHECK(loaded.model->config().vocab_size >= loaded.tokenizer.vocab_size(),
             "{}: {} has {} token ids, fewer than the {} of its tokenizer{}", command, dir,
             loaded.model->config().vocab_size, loaded.tokenizer.vocab_size(),
             own.empty() ? " (bytes: the directory has none of its own)" : "");
    return loaded;
}

int run_inspect(const InspectArgs& args) {
    const int sources = !args.model_dir.empty() + !args.ckpt.empty() + !args.run_dir.empty();
    QK_CHECK(sources == 1,
             "inspect: give the model as --model DIR, --ckpt FILE or --run-dir RUN (one of them)");
    const std::string text_path = args.text.empty() ? nn::default_data_path() : args.text;
    const std::string text = read_regular_file(text_path, "inspect --text", 1 << 30);
    std::unique_ptr<nn::GPT> model;
    std::vector<int32_t> ids;
    const std::string ckpt =
        args.run_dir.empty() ? args.ckpt : nn::latest_model_checkpoint(args.run_dir);
    QK_CHECK(args.run_dir.empty() || !ckpt.empty(), "inspect: {} holds no checkpoint",
             args.run_dir);
    if (!ckpt.empty()) {
        nn::LoadedModel loaded = nn::load_model(ckpt);
        ids = loaded.tokenizer.encode(text);
        model = std::move(loaded.model);
    } else {
        nn::LoadedModel loaded = load_hf_directory(args.model_dir, "inspect");
        ids = loaded.tokenizer.encode(text);
        model = std::move(loaded.model);
    }
    if (static_cast<int64_t>(ids.size()) > args.max_tokens) ids.resize(args.max_tokens);
    const int64_t window =
        args.window > 0 ? args.window : std::min<int64_t>(model->config().block_size, 1024);
    const nn::InspectReport report = nn::inspect_model(*model, ids, window);
    fmt::print("{}", nn::inspect_table(report));
    write_file_atomic(
        args.out,
        nn::inspect_svg(report,
                        fmt::format("qknorm inspect: {} on {}",
                                    args.model_dir.empty() ? ckpt : args.model_dir, text_path)));
    fmt::print("plot: {}\n", args.out);
    return 0;
}

}  // namespace qk::cli
