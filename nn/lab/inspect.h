// A model's attention signals over a text (qknorm inspect): the lab's stability measurements,
// per layer and head, on any checkpoint, a trained run's or an imported Hugging Face model.
#pragma once

#include <string>
#include <vector>

#include "nn/model/gpt.h"

namespace qk::nn {

struct HeadSignals {
    double max_logit = 0;                       // max |s| over every window and position
    double entropy = 0;                         // mean over query rows
    double q_norm = 0, k_norm = 0;              // mean ‖q‖, ‖k‖ before the QK-norm
    double q_norm_after = 0, k_norm_after = 0;  // as they enter the dot product
};

struct InspectReport {
    double loss = 0;                              // mean next-token cross-entropy, nats
    int64_t tokens = 0;                           // predictions the loss averages
    int64_t windows = 0;                          // forward passes of up to block_size tokens
    std::vector<std::vector<HeadSignals>> heads;  // [layer][head]; k's are its kv head's
    // Per layer, the range of the QK-norm gains as applied ((1 + w) with unit offsets), or
    // empty without a gain; and g for l2/lp.
    std::vector<std::pair<double, double>> gain_range;
};

// Runs the model over ids (int32 token ids) in consecutive windows of at most `window` tokens
// (each window predicts its own next tokens; the last id of the text is only a target), without
// gradient, and gathers the signals.
InspectReport inspect_model(GPT& model, const std::vector<int32_t>& ids, int64_t window);
std::string inspect_table(const InspectReport& report);  // one line per layer and head
std::string inspect_svg(const InspectReport& report, const std::string& title);

}  // namespace qk::nn
