// QK-Clip (Kimi K2, 2025): bound the attention logits of a model without QK-norm by rescaling
// its query and key projections after the optimizer step, instead of normalising q and k.
//
// Per layer and head h, s = q·k / sqrt(D) with q = W_q,h x + b_q,h and k = W_k,h x + b_k,h, so s
// is bilinear in (W_q,h, b_q,h) and (W_k,h, b_k,h). Let S_h be the max |s| of the step's own
// forward (over the batch and the unmasked positions, before any soft-cap). When S_h > τ,
// multiplying both the q rows and the k rows of head h by γ = sqrt(τ / S_h) multiplies every
// logit of that head by γ² = τ / S_h: on the same input the max becomes exactly τ. Heads at or
// under τ are not touched. It runs after the update, so the next forward sees the update and the
// clip together: its max is τ up to what the update itself changed.
//
// With grouped-query attention a key head is shared by a group of query heads, and scaling its
// rows would shrink the logits of heads that are under τ. There the whole factor τ / S_h goes on
// the query head's rows alone: the same bound for head h, and no other head touched.
#pragma once

#include <vector>

#include "nn/model/gpt.h"

namespace qk::nn {

// Scales the q and k rows (and biases) of c_attn for every head with stats[layer]
// .head_max_logit[h] > tau by sqrt(tau / S_h). stats: one entry per layer, from the forward that
// produced this step's gradients. Returns the number of heads clipped. Needs qk_norm none.
int64_t qk_clip(GPT& model, const std::vector<AttentionStats>& stats, double tau);

}  // namespace qk::nn
