// Validation measures that other projects report, computed here so that a figure can be compared
// with theirs like for like (`qknorm train --eval-protocol nanogpt`).
#pragma once

#include <cstdint>

#include "nn/model/gpt.h"
#include "nn/text/data.h"

namespace qk::nn {

// nanoGPT's character-level figure (its estimate_loss: 200 batches of 64 random windows of 256
// characters from the last 10 % of the file, the mean next-character loss over every position of
// every window), made exact: the windows tile the validation split (tokens [256k, 256k + 257):
// every token after the first is a target exactly once, the last partial window dropped), which
// has the same expectation as nanoGPT's draws without their sampling noise. Positions within a
// window see 1 to 256 tokens of context, as in nanoGPT. The model must attend 256 tokens back
// (block_size >= 256; see TrainConfig::eval_protocol). Data-parallel ranks share the windows.
inline constexpr int64_t kNanoGptWindow = 256;
double nanogpt_val_loss(GPT& model, const TextDataset& data);

}  // namespace qk::nn
