// The names of a run directory's checkpoint files (nn/model/checkpoint_files.h).
#include "nn/model/checkpoint_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace qk::nn {

namespace fs = std::filesystem;

std::optional<int64_t> checkpoint_step_of(const std::string& file_name, const char* kind) {
    int64_t step = 0;
    const std::string pattern = fmt::format("step-%ld.{}.safetensors", kind);
    // sscanf accepts "step-42" and "step-+042"; only the name the trainer writes is one.
    if (std::sscanf(file_name.c_str(), pattern.c_str(), &step) == 1 &&
        file_name == fmt::format("step-{:06d}.{}.safetensors", step, kind))
        return step;
    return std::nullopt;
}

std::string checkpoint_prefix(const std::string& run_dir, int64_t step) {
    return fmt::format("{}/step-{:06d}", run_dir, step);
}

std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
    std::vector<int64_t> steps;
    if (!fs::exists(run_dir)) return steps;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
        const auto step = checkpoint_step_of(entry.path().filename().string(), "model");
        if (step && fs::exists(checkpoint_prefix(run_dir, *step) + ".state.safetensors"))
            steps.push_back(*step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

std::string latest_model_checkpoint(const std::string& run_dir) {
    const std::vector<int64_t> steps = checkpoint_steps(run_dir);
    return steps.empty() ? "" : checkpoint_prefix(run_dir, steps.back()) + ".model.safetensors";
}

}  // namespace qk::nn
