// The GPT: embeddings, L blocks, final norm, LM head (nanoGPT names and layouts).
#pragma once

#include <memory>
#include <vector>

#include "nn/model/attention.h"
#include "ops/glu.h"

namespace qk::nn {

class MLP : public Module {
  public:
    MLP(const GPTConfig& config, Generator& gen, DType dtype = kF32);
    // c_proj(gelu_tanh(c_fc(x))), or gated: c_proj(act(c_gate(x)) * c_fc(x)), act = silu | gelu
    Tensor forward(const Tensor& x) const;

    MLPKind kind;
    std::shared_ptr<Linear> c_fc, c_gate, c_proj;  // c_gate: gated kinds only

  private:
    // The half type the Linear layers around the gated product multiply in (bf16, fp16), for
    // glu's rounded copies, or full (float32, fp8: the Linear rounds its own operands).
    Precision rounded_copy() const;
    Tensor gated(const Tensor& x, GluActivation activation) const;
};

// The residual stream between blocks as x + delta, the add not made yet: the next block's first
// norm (or ln_f) makes it in its own kernel pass (Norm::forward_added). delta undefined: x.
struct Residual {
    Tensor x, delta;
    Tensor value() const;  // x + delta, made
};

class Block : public Module {
  public:
    Block(const GPTConfig& config, Generator& gen, DType dtype = kF32, int64_t layer = 0);
    // By config.norm_placement:
    //   pre   x = x + attn(ln_1(x));               x = x + mlp(ln_2(x))   (GPT-2, Qwen3)
    //   post  x = x + post_ln_1(attn(x));          x = x + post_ln_2(mlp(x))   (OLMo 2)
    //   both  x = x + post_ln_1(attn(ln_1(x)));    x = x + post_ln_2(mlp(ln_2(x)))   (Gemma 3)
    // With qkv_norm, ln_1 is dropped.
    Tensor forward(const Tensor& x, AttentionStats* stats, Generator* dropout_gen);
    // The same on a stream whose last add is pending, leaving its own last add pending: under
    // pre, both adds of a block are made by the norm after them (ln_2, the next block's ln_1).
    Residual forward(const Residual& x, AttentionStats* stats, Generator* dropout_gen);
    // The same through the attention's KV cache (eval, no dropout): row i of x continues
    // sequence sequences[i] of the cache.
    Tensor forward_cached(const Tensor& x, KVCache& cache, const std::vector<int64_t>& sequences);

    std::shared_ptr<Norm> ln_1, ln_2;            // before; null under post (ln_1: or qkv_norm)
    std::shared_ptr<Norm> post_ln_1, post_ln_2;  // after; null under pre
    std::shared_ptr<CausalSelfAttention> attn;
    std::shared_ptr<MLP> mlp;
    double dropout;
};

struct GPTOutput {
    Tensor logits;                      // (B, T, V)
    Tensor loss;                        // scalar: cross-entropy (+ z-loss), when targets were given
    Tensor cross_entropy;               // the cross-entropy alone (what "loss" means in reports)
    std::vector<AttentionStats> stats;  // per layer, when asked for
};

class GPT : public Module {
  public:
    GPT(const GPTConfig& config, uint64_t seed, DType dtype = kF32);

    // ids, targets: (B, T) int32 with T <= block_size; targets may be undefined. loss_gradient:
    // the gradient the caller's backward will give out.loss (1 for loss.backward(); a loss scale
    // over the micro-batches in training), for which a mixed-precision head on cuda computes the
    // logits' gradient in the loss's forward pass (ops/loss.h's linear_cross_entropy: any other
    // value is still exact, at one more pass). There out.logits is detached.
    GPTOutput forward(const Tensor& ids, const Tensor& targets = {}, bool with_stats = false,
                      double loss_gradient = 1.0);

    // The next T positions of some sequences of `cache`: row i of ids (rows, T) int32 continues
    // sequence sequences[i] (empty: every sequence, in order), their k and v added to the cache.
    // Returns the logits of every position (rows, T, V), or with last_only of each row's last
    // one (rows, 1, V), which is all decoding needs (the LM head is a prefill's largest GEMM).
    // Eval mode, no gradient; the logits equal forward()'s over the whole sequence so far
    // (tests/test_generate.cpp).
    Tensor forward_cached(const Tensor& ids, KVCache& cache, std::vector<int64_t> sequences = {},
                          bool last_only = true);

    // The residual stream's start, (B, T, C): token embeddings (times embedding_scale), plus
    // the learned positions first… when there are; before any dropout.
    Tensor embed(const Tensor& ids, int64_t first = 0) const;

    // For inference at Precision::bf16: every Linear weight is stored as bfloat16 once, instead
    // of being rounded at each GEMM, and a tied LM head gets a bfloat16 copy (the embedding
    // table stays float32: a lookup reads one row, exactly). The GEMMs read the same rounded
    // values as before, so the logits are bit-identical, and a decode step reads half the bytes.
    // The model cannot train afterwards: its bf16 matrices take no gradient, so it runs under
    // NoGradGuard (as generate does).
    void store_weights_bf16();
    // The bytes of parameters one forward step reads: every weight, the tied head once more when
    // it has its own bf16 copy, but of the embedding tables only the rows it looks up (none
    // counted). What a decode step's memory-bandwidth bound is made of (bench/bench_generate).
    int64_t weight_bytes_per_token() const;

    // The FP8 scaling states (precision fp8; ops/fp8.h) by name, in layer order: every block
    // Linear's "<its name>.x", ".weight" and ".grad", and with fp8_attention each layer's
    // "transformer.h.<i>.attn.q" and ".k". Empty at other precisions. What a checkpoint saves and
    // the overflow telemetry reads.
    std::vector<std::pair<std::string, DelayedScaling*>> fp8_scalings() const;

    const GPTConfig& config() const { return config_; }
    Generator& dropout_generator() { return dropout_gen_; }

    std::shared_ptr<Embedding> wte, wpe;  // wpe: learned positions only (null with RoPE)
    std::vector<std::shared_ptr<Block>> h;
    std::shared_ptr<Norm> ln_f;
    std::shared_ptr<Linear> lm_head;  // null when tie_embeddings

  private:
    Tensor head(const Tensor& x) const;              // ln_f, the LM head and the logit soft-cap
    Tensor logits_of(const Tensor& x_normed) const;  // the LM head and the cap after ln_f
    Precision head_precision() const;                // of the LM head's GEMMs
    // Whether forward runs the head and the loss as one op (linear_cross_entropy) for targets.
    bool fuses_head_and_loss(const Tensor& ids) const;
    bool is_embedding_table(const Tensor& p) const;  // wte's or wpe's weight

    GPTConfig config_;
    Generator dropout_gen_;
    Tensor tied_head_bf16_;  // after store_weights_bf16, for a tied head
};

}  // namespace qk::nn
