// The names of a run directory's checkpoint files: "step-000042.model.safetensors" and
// "step-000042.state.safetensors". Kept apart from the rest of the run directory
// (nn/train/run_dir.h) so that readers of checkpoints (the tokenizer of a run directory, the sweep)
// need nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qk::nn {

// The step of a checkpoint file named exactly "step-NNNNNN.<kind>.safetensors" (kind "model" or
// "state"), or none.
std::optional<int64_t> checkpoint_step_of(const std::string& file_name, const char* kind);

// "run_dir/step-000042": a checkpoint's two files add ".model.safetensors" and
// ".state.safetensors".
std::string checkpoint_prefix(const std::string& run_dir, int64_t step);

// Steps that have both files, in order; the model file is written last, so it marks a complete
// checkpoint.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir);

// The newest complete checkpoint of a run ("" if none): the model file path.
std::string latest_model_checkpoint(const std::string& run_dir);

}  // namespace qk::nn
