// Softmax and log-softmax over the last dim, with the attention options fused in.
#pragma once

#include "core/tensor.h"

namespace qk {

struct SoftmaxOptions {
    // Causal mask on the last two dims (..., Tq, Tk): row i sees keys j <= i + (Tk - Tq);
    // masked entries come out as exactly 0 (softmax) or -inf (log_softmax).
    bool causal = false;
    // When > 0, logits are soft-capped first: s <- cap * tanh(s / cap) (Gemma 2 uses 50).
    double softcap = 0;
};

Tensor softmax(const Tensor& x, const SoftmaxOptions& options = {});
Tensor log_softmax(const Tensor& x, const SoftmaxOptions& options = {});

}  // namespace qk
