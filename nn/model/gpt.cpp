#include "nn/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "core/factory.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/glu.h"
#include "ops/join.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace {

// A container module, so that parameter names read "transformer.h.0.attn...".
class Holder : public Module {
  public:
    template <class M>
    std::shared_ptr<M> add(std::string name, std::shared_ptr<M> m) {
        return register_module(std::move(name), std::move(m));
    }
};

// A block norm (or ln_f) of width n_embd, with the config's kind, ε and gain form.
std::shared_ptr<Norm> block_norm(const GPTConfig& config, DType dtype) {
    return std::make_shared<Norm>(config.norm, config.n_embd, config.bias, dtype, config.norm_eps,
                                  config.norm_unit_offset);
}

}  // namespace

MLP::MLP(const GPTConfig& config, Generator& gen, DType dtype) : kind(config.mlp) {
    const int64_t C = config.n_embd, hidden = config.mlp_width();
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
    auto linear = [&](int64_t in, int64_t out, double std) {
        return std::make_shared<Linear>(in, out, config.bias, std, gen, dtype, config.precision);
    };
    c_fc = register_module("c_fc", linear(C, hidden, 0.02));
    if (kind != MLPKind::gelu) c_gate = register_module("c_gate", linear(C, hidden, 0.02));
    c_proj = register_module("c_proj", linear(hidden, C, proj_std));
}

Tensor MLP::forward(const Tensor& x) const {
    switch (kind) {
        case MLPKind::gelu:
            // One op, which at bf16 / fp16 on cuda writes GELU's output rounded only, for c_proj.
            if (!c_fc->fp8 && !c_proj->fp8 && c_fc->precision == c_proj->precision)
                return linear_gelu_linear(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias,
                                          c_fc->precision);
            // c_fc and GELU one op, rounded in the same pass for c_proj
            return c_proj->forward(c_fc->forward_gelu(x, rounded_copy()));
        case MLPKind::swiglu:
            return gated(x, GluActivation::silu);
        case MLPKind::geglu:
            return gated(x, GluActivation::gelu);
    }
    throw Error("MLP: unknown kind");
}

// c_proj(act(c_gate(x)) ⊙ c_fc(x)): one op without gate and up biases (at bf16 / fp16 on cuda it
// writes the product and its two gradients rounded only); else the fused product, rounded in the
// same pass for c_proj (and its gradients for c_gate's and c_fc's GEMMs).
Tensor MLP::gated(const Tensor& x, GluActivation activation) const {
    const bool one_op = !c_gate->bias.defined() && !c_fc->bias.defined() && !c_gate->fp8 &&
                        !c_fc->fp8 && !c_proj->fp8 && c_gate->precision == c_proj->precision &&
                        c_fc->precision == c_proj->precision;
    if (one_op)
        return glu_linear(x, c_gate->weight, c_fc->weight, c_proj->weight, c_proj->bias, activation,
                          c_proj->precision);
    return c_proj->forward(glu(c_gate->forward(x), c_fc->forward(x), activation, rounded_copy()));
}

// The activation feeds c_proj rounded (a gated one's gradients feed c_fc's rounded too).
Precision MLP::rounded_copy() const { return rounded_copy_for_linear(c_proj->precision); }

Block::Block(const GPTConfig& config, Generator& gen, DType dtype, int64_t layer)
    : dropout(config.dropout) {
    const bool pre = config.norm_placement != NormPlacement::post;
    const bool post = config.norm_placement != NormPlacement::pre;
    if (pre && !config.qkv_norm) ln_1 = register_module("ln_1", block_norm(config, dtype));
    attn =
        register_module("attn", std::make_shared<CausalSelfAttention>(config, gen, dtype, layer));
    if (post) post_ln_1 = register_module("post_ln_1", block_norm(config, dtype));
    if (pre) ln_2 = register_module("ln_2", block_norm(config, dtype));
    mlp = register_module("mlp", std::make_shared<MLP>(config, gen, dtype));
    if (post) post_ln_2 = register_module("post_ln_2", block_norm(config, dtype));
    // The pre-norms feed c_attn and the MLP's first Linears: rounded for them in the same pass.
    for (const auto& norm : {ln_1, ln_2})
        if (norm) norm->rounded_copy = rounded_copy_for_linear(config.precision);
}

Tensor Residual::value() const { return delta.defined() ? x + delta : x; }

Tensor Block::forward(const Tensor& x, AttentionStats* stats, Generator* dropout_gen) {
    return forward(Residual{x, {}}, stats, dropout_gen).value();
}

Residual Block::forward(const Residual& in, AttentionStats* stats, Generator* dropout_gen) {
    auto residual_dropout = [&](const Tensor& t) {
        return dropout > 0 && training() ? qk::dropout(t, dropout, true, *dropout_gen) : t;
    };
    auto norm = [](const std::shared_ptr<Norm>& n, const Tensor& t) {
        return n ? n->forward(t) : t;  // an absent norm is the identity
    };
    // The stream and what the sub-block reads: the pending add made by the norm (or alone).
    auto added_and_normed = [](const std::shared_ptr<Norm>& n, const Residual& r) {
        if (n) return n->forward_added(r.x, r.delta);
        const Tensor x = r.value();
        return SumAndNorm{x, x};
    };
    const auto [x, attn_in] = added_and_normed(ln_1, in);
    const Tensor a = residual_dropout(norm(post_ln_1, attn->forward(attn_in, stats, dropout_gen)));
    const auto [x_mid, mlp_in] = added_and_normed(ln_2, {x, a});
    return {x_mid, residual_dropout(norm(post_ln_2, mlp->forward(mlp_in)))};
}

GPT::GPT(const GPTConfig& config, uint64_t seed, DType dtype)
    : config_(config), dropout_gen_(seed ^ 0x5eed) {
    config.validate();
    QK_CHECK(config.precision == Precision::full || dtype == kF32,
             "GPT: {} precision (--precision {}) trains float32 weights, got dtype {}",
             to_string(config.precision), to_string(config.precision), dtype);
    Generator gen(seed);
    auto transformer = register_module("transformer", std::make_shared<Holder>());
    wte = transformer->add(
        "wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, 0.02, gen, dtype));
    if (config.pos_emb == PosEmb::learned)  // with RoPE, attention rotates q and k instead
        wpe = transformer->add(
            "wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, 0.02, gen, dtype));
    auto blocks = transformer->add("h", std::make_shared<Holder>());
    for (int64_t i = 0; i < config.n_layer; ++i)
        h.push_back(blocks->add(std::to_string(i), std::make_shared<Block>(config, gen, dtype, i)));
    ln_f = transformer->add("ln_f", block_norm(config, dtype));
    ln_f->rounded_copy = rounded_copy_for_linear(config.outside_linears());  // for the head
    if (!config.tie_embeddings)
        lm_head = register_module(
            "lm_head", std::make_shared<Linear>(config.n_embd, config.vocab_size, false, 0.02, gen,
                                                dtype, config.outside_linears()));
}

Tensor Block::forward_cached(const Tensor& x_in, KVCache& cache,
                             const std::vector<int64_t>& sequences) {
    auto norm = [](const std::shared_ptr<Norm>& n, const Tensor& t) {
        return n ? n->forward(t) : t;
    };
    Tensor x = x_in + norm(post_ln_1, attn->forward_cached(norm(ln_1, x_in), cache, sequences));
    return x + norm(post_ln_2, mlp->forward(norm(ln_2, x)));
}

Tensor GPT::embed(const Tensor& ids, int64_t first) const {
    Tensor x = wte->forward(ids);
    // Gemma scales by sqrt(C) rounded to the weights' dtype; multiplying by a double rounds it
    // to that dtype the same way.
    if (config_.embedding_scale != 1.0) x = x * config_.embedding_scale;
    if (wpe) {  // + (T, C), the rows of positions first…first+T−1
        std::vector<int32_t> positions(static_cast<size_t>(ids.size(1)));
        std::iota(positions.begin(), positions.end(), static_cast<int32_t>(first));
        x = x + wpe->forward(from_ids(positions).to(ids.device()));
    }
    return x;
}

Tensor GPT::head(const Tensor& x) const { return logits_of(ln_f->forward(x)); }

Tensor GPT::logits_of(const Tensor& x) const {
    Tensor logits = lm_head                     ? lm_head->forward(x)
                    : tied_head_bf16_.defined() ? linear(x, tied_head_bf16_, {}, Precision::bf16)
                    : config_.precision != Precision::full
                        ? linear(x, wte->weight, {}, config_.outside_linears())
                        : matmul(x, wte->weight.t());
    return config_.logit_softcap > 0 ? softcap(logits, config_.logit_softcap) : logits;
}

Precision GPT::head_precision() const {
    return lm_head ? lm_head->precision : config_.outside_linears();
}

bool GPT::fuses_head_and_loss(const Tensor& ids) const {
    const Precision p = head_precision();
    return ids.device() == Device::cuda && (p == Precision::bf16 || p == Precision::fp16) &&
           autograd::grad_enabled() && config_.logit_softcap == 0 && !tied_head_bf16_.defined() &&
           !(lm_head && lm_head->fp8);
}

GPTOutput GPT::forward(const Tensor& ids, const Tensor& targets, bool with_stats,
                       double loss_gradient) {
    QK_CHECK(ids.dim() == 2 && ids.dtype() == kI32, "GPT: ids must be (B, T) int32, got {} {}",
             ids.dtype(), ids.shape());
    const int64_t B = ids.size(0), T = ids.size(1);
    QK_CHECK(T <= config_.block_size, "GPT: sequence length {} exceeds block_size {}", T,
             config_.block_size);
    GPTOutput out;
    if (with_stats) out.stats.resize(config_.n_layer);

    Tensor x = embed(ids);  // (B, T, C)
    if (config_.dropout > 0 && training()) x = dropout(x, config_.dropout, true, dropout_gen_);
    Residual stream{x, {}};  // each block leaves its last add to the norm after it
    for (size_t i = 0; i < h.size(); ++i)
        stream = h[i]->forward(stream, with_stats ? &out.stats[i] : nullptr, &dropout_gen_);
    const Tensor x_final = ln_f->forward_added(stream.x, stream.delta).normed;
    if (targets.defined())
        QK_CHECK(targets.shape() == ids.shape(), "GPT: targets {} must match ids {}",
                 targets.shape(), ids.shape());
    if (targets.defined() && fuses_head_and_loss(ids)) {
        // The logits' gradient comes out of the loss's forward pass, rounded for the head's GEMMs.
        const int64_t C = config_.n_embd, V = config_.vocab_size;
        const LinearCrossEntropy head_loss = linear_cross_entropy(
            x_final.reshape({B * T, C}), lm_head ? lm_head->weight : wte->weight,
            targets.reshape({B * T}), head_precision(), -1, loss_gradient, config_.z_loss);
        out.logits = head_loss.logits.reshape({B, T, V});
        out.loss = head_loss.loss;
        out.cross_entropy = head_loss.cross_entropy;
        return out;
    }
    const Tensor logits = logits_of(x_final);
    out.logits = logits;
    if (targets.defined()) {
        // reshape, not view: a padded head's logits are rows of a wider buffer (matmul_bf16.cpp).
        Tensor flat = logits.reshape({B * T, config_.vocab_size});
        // The head's GEMMs read the loss's gradient next (unless a cap or the z-loss intervene):
        // rounded for them in the loss's backward pass.
        const bool head_reads_gradient = config_.logit_softcap == 0 && config_.z_loss == 0;
        out.cross_entropy =
            cross_entropy(flat, targets.reshape({B * T}), -1,
                          head_reads_gradient ? rounded_copy_for_linear(config_.outside_linears())
                                              : Precision::full);
        out.loss = out.cross_entropy;
        if (config_.z_loss > 0) {
            Tensor lse = logsumexp(flat, {-1});
            out.loss = out.loss + mean(lse * lse) * config_.z_loss;
        }
    }
    return out;
}

Tensor GPT::forward_cached(const Tensor& ids, KVCache& cache, std::vector<int64_t> sequences,
                           bool last_only) {
    if (sequences.empty())
        for (int64_t s = 0; s < cache.batch(); ++s) sequences.push_back(s);
    const int64_t rows = static_cast<int64_t>(sequences.size());
    QK_CHECK(ids.dim() == 2 && ids.dtype() == kI32 && ids.size(0) == rows && ids.size(1) >= 1,
             "GPT: a cached forward takes ids ({} sequences, T >= 1) int32, got {} {}", rows,
             ids.dtype(), ids.shape());
    QK_CHECK(!training(), "GPT: the KV cache is for inference; call eval() first");
    const int64_t T = ids.size(1);
    for (size_t i = 0; i < sequences.size(); ++i) {
        QK_CHECK(std::count(sequences.begin(), sequences.end(), sequences[i]) == 1,
                 "GPT: sequence {} appears twice in one cached forward", sequences[i]);
        QK_CHECK(T <= cache.room(sequences[i]),
                 "GPT: sequence {} of the cache holds {} of {} positions; {} more do not fit",
                 sequences[i], cache.length(sequences[i]), cache.capacity(), T);
    }
    NoGradGuard no_grad;
    std::vector<Tensor> embedded;  // each sequence's positions start at its own length
    for (int64_t row = 0; row < rows; ++row)
        embedded.push_back(embed(ids.narrow(0, row, 1), cache.length(sequences[row])));
    Tensor x = rows == 1 ? embedded[0] : cat(embedded, 0);
    for (auto& block : h) x = block->forward_cached(x, cache, sequences);
    for (const int64_t s : sequences) cache.advance(s, T);
    return head(last_only ? x.narrow(1, T - 1, 1) : x);
}

bool GPT::is_embedding_table(const Tensor& p) const {
    return &p.impl() == &wte->weight.impl() || (wpe && &p.impl() == &wpe->weight.impl());
}

void GPT::store_weights_bf16() {
    QK_CHECK(config_.precision == Precision::bf16,
             "GPT: bf16-stored weights are for bf16 inference; the model's precision is {} "
             "(build it with precision bf16)",
             to_string(config_.precision));
    for (const auto& [name, p] : named_parameters())
        if (p.dim() == 2 && !is_embedding_table(p)) store_parameter_as(p, kBF16);
    if (config_.tie_embeddings && !tied_head_bf16_.defined())
        tied_head_bf16_ = register_buffer(wte->weight.detach().to(kBF16));
}

std::vector<std::pair<std::string, DelayedScaling*>> GPT::fp8_scalings() const {
    std::vector<std::pair<std::string, DelayedScaling*>> out;
    auto add_linear = [&](const std::string& name, const std::shared_ptr<Linear>& l) {
        if (!l || !l->fp8) return;
        out.emplace_back(name + ".x", &l->fp8->x);
        out.emplace_back(name + ".weight", &l->fp8->weight);
        out.emplace_back(name + ".grad", &l->fp8->grad);
    };
    for (size_t i = 0; i < h.size(); ++i) {
        const std::string block = fmt::format("transformer.h.{}", i);
        const CausalSelfAttention& attn = *h[i]->attn;
        add_linear(block + ".attn.c_attn", attn.c_attn);
        if (attn.fp8_q) out.emplace_back(block + ".attn.q", attn.fp8_q.get());
        if (attn.fp8_k) out.emplace_back(block + ".attn.k", attn.fp8_k.get());
        add_linear(block + ".attn.c_proj", attn.c_proj);
        add_linear(block + ".mlp.c_fc", h[i]->mlp->c_fc);
        add_linear(block + ".mlp.c_gate", h[i]->mlp->c_gate);
        add_linear(block + ".mlp.c_proj", h[i]->mlp->c_proj);
    }
    return out;
}

int64_t GPT::weight_bytes_per_token() const {
    auto bytes_of = [](const Tensor& t) { return t.numel() * int64_t(dtype_size(t.dtype())); };
    // A tied head reads the whole table (or its bf16 copy); a lookup reads one row, not counted.
    int64_t bytes = tied_head_bf16_.defined() ? bytes_of(tied_head_bf16_)
                    : config_.tie_embeddings  ? bytes_of(wte->weight)
                                              : 0;
    for (const auto& [name, p] : named_parameters())
        if (!is_embedding_table(p)) bytes += bytes_of(p);
    return bytes;
}

}  // namespace qk::nn
