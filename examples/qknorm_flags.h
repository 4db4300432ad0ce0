// The flags of the qknorm program (examples/qknorm.cpp), kept apart from its commands.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/lab/sweep.h"
#include "nn/model/sample.h"
#include "nn/train/trainer.h"

namespace qk::cli {

// A flag's value or a config file that cannot be used: exit status 2, as CLI11's own errors.
struct UsageError : Error {
    using Error::Error;
};

// Runs `check`, turning its qk::Error into a UsageError: the values came from the command line.
template <class F>
void as_usage(F&& check) {
    try {
        check();
    } catch (const UsageError&) {
        throw;
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
}

// Positional arguments taken verbatim: CLI11 lets a positional collect several values only by
// allowing "extra args", and then reads "[a, b]" as a list of two (a file named "[a]" became
// "a"). So the first value goes to the option (one value, no list syntax) and the rest stay
// unparsed until take_verbatim_positionals appends them, refusing anything that looks like an
// unknown option. cmd no longer falls through to the program's options: give it its own.
CLI::Option* add_verbatim_positionals(CLI::App* cmd, const std::string& name,
                                      std::vector<std::string>& values, const std::string& help);
void take_verbatim_positionals(CLI::App* cmd, std::vector<std::string>& values);

// Fine-tuning defaults for `train --init-from`, where pre-training's (lr 4.5e-3, 9,000 steps,
// 16 windows) would wreck a trained model: AdamW at 5e-5 (full fine-tuning of 0.1–1 B-parameter
// models uses 1e-5 to 1e-4) decaying to 5e-6, 300 steps with 10 % warmup, 8 windows a step. Each
// applies only where its flag was not given (on the command line or in a config file).
inline constexpr double kFineTuneLr = 5e-5, kFineTuneLrMin = 5e-6;
inline constexpr int64_t kFineTuneSteps = 300, kFineTuneBatch = 8;
void apply_fine_tune_defaults(const CLI::App* cmd, nn::TrainConfig& cfg);

// One rule for flags whose setting does nothing in the run they describe (--loss-scale with
// bf16, --image-size without images, --lp-p without lp): given on the command line or in a config
// file, they are refused by name, as --tf32 on cpu and --fp8-attention without fp8 always were, so
// that a user never believes a setting took effect. `cfg` is the run's final configuration. The
// flags that depend on how the program was launched (--bucket-mb, --overlap, --zero,
// --dist-timeout: under mpirun) are not judged by the configuration and stay accepted.
void refuse_inert_flags(const CLI::App* cmd, const nn::TrainConfig& cfg);

// The enum-valued model flags, parsed into GPTConfig after the command line is read.
struct ModelFlags {
    std::string norm = "layernorm", qk_norm = "layernorm", qk_scope = "head";
    std::string attention = "fused";
    std::string precision = "fp32";
    std::string pos_emb = "learned", qk_norm_order = "before_rope";
    std::string mlp = "gelu";
    std::string norm_placement = "pre";
};

// With attention_flags false (the sweep), the variant strings choose the attention instead.
void add_model_flags(CLI::App* cmd, nn::TrainConfig& cfg, ModelFlags& flags, bool attention_flags);
// With single_run false (the sweep), the grid sets the learning rate, seed and run directory.
void add_training_flags(CLI::App* cmd, nn::TrainConfig& cfg, bool single_run);
void add_sweep_flags(CLI::App* cmd, nn::SweepSpec& spec);
void set_sweep_defaults(nn::SweepSpec& spec);
// What `qknorm sample` is given.
struct SampleArgs {
    std::string run, ckpt, model, when_full = "slide";  // model: a Hugging Face directory
    std::string precision;                              // "" = as trained
    std::vector<std::string> prompts;                   // none: a newline
    int64_t num_samples = 1;                            // per prompt, decoded together
    std::vector<std::string> stops;  // stop once the generated text holds one of these
    nn::SampleOptions options;
    uint64_t seed = 0;
};
void add_sample_flags(CLI::App* cmd, SampleArgs& args);
void apply_model_flags(nn::TrainConfig& cfg, const ModelFlags& flags);
// The flags that say what m says: the defaults a command shows when its config is m.
ModelFlags model_flags_of(const nn::GPTConfig& m);

}  // namespace qk::cli
