// The flags of `qknorm train`, `qknorm sweep` and `qknorm sample`, and their defaults.
//
// Every value is checked where it enters: CLI11 refuses a word where a number belongs and
// `whole_number` refuses "-1" for a seed or 1e30 for a step count (CLI11 alone would wrap or
// saturate them); the meaning of each value (finite, in range, consistent with the others) is
// checked by TrainConfig::validate, which the command runs before it starts.
#include "examples/qknorm_flags.h"

#include <charconv>
#include <limits>
#include <type_traits>

namespace qk::cli {

using namespace qk::nn;

namespace {

// Accepts the text of a whole number that fits T, and nothing else: no sign on an unsigned
// value, no fraction, no exponent, no overflow.
template <class T>
CLI::Validator whole_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            T value{};
            const char* end = text.data() + text.size();
            const auto [ptr, ec] = std::from_chars(text.data(), end, value);
            if (ec == std::errc() && ptr == end) return {};
            return fmt::format("'{}' is not a whole number in [{}, {}]", text,
                               std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
        },
        "", "whole number");
}

template <class T>
struct element_of {
    using type = T;
};
template <class T>
struct element_of<std::vector<T>> {
    using type = T;
};

// add_option with the default shown in --help, and whole_number for integer flags (and for each
// element of a list of integers).
template <class T>
CLI::Option* add_value(CLI::App* cmd, const std::string& name, T& value, const std::string& help) {
    CLI::Option* option = cmd->add_option(name, value, help)->capture_default_str();
    using E = typename element_of<T>::type;
    if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>)
        option->check(whole_number<E>());
    return option;
}

void add_attention_flags(CLI::App* cmd, GPTConfig& m, ModelFlags& flags) {
    add_value(cmd, "--qk-norm", flags.qk_norm,
              "normalisation of q and k: none (baseline), layernorm, rmsnorm, l2 (Henry et al., "
              "learnable scale g), lp (q/|q|_p, learnable g)")
        ->check(CLI::IsMember({"none", "layernorm", "rmsnorm", "l2", "lp"}));
    add_value(cmd, "--qk-norm-scope", flags.qk_scope,
              "layernorm/rmsnorm statistics per head over D (head) or over all C channels (full)")
        ->check(CLI::IsMember({"head", "full"}));
    add_value(cmd, "--attn-softcap", m.attn_softcap,
              "soft-cap c of the attention logits, c*tanh(s/c); 0 = off");
    add_value(cmd, "--qkv-norm", m.qkv_norm, "normalise v too and drop ln_1 (Rybakov et al.)");
}

void add_regularisation_flags(CLI::App* cmd, GPTConfig& m) {
    add_value(cmd, "--logit-softcap", m.logit_softcap, "soft-cap of the output logits; 0 = off");
    add_value(cmd, "--z-loss", m.z_loss, "weight of the z-loss mean(logsumexp(logits)^2); 0 = off");
}

}  // namespace

void add_model_flags(CLI::App* cmd, TrainConfig& cfg, ModelFlags& flags, bool attention_flags) {
    GPTConfig& m = cfg.model;
    add_value(cmd, "--n-layer", m.n_layer, "transformer blocks (L)");
    add_value(cmd, "--n-head", m.n_head, "attention heads per block (H)");
    add_value(cmd, "--n-embd", m.n_embd, "model width C (head dim D = C / H)");
    add_value(
        cmd, "--n-kv-head", m.n_kv_head,
        "key/value heads, dividing n-head: fewer is grouped-query attention (1: multi-query); "
        "0 = n-head");
    add_value(cmd, "--head-size", m.head_size, "each head's width D; 0 = n-embd / n-head");
    add_value(cmd, "--block-size", m.block_size, "context length T");
    add_value(cmd, "--dropout", m.dropout, "dropout probability (attention, residual, embedding)");
    add_value(cmd, "--bias", m.bias, "biases in every Linear and norm (true|false)");
    add_value(cmd, "--tie-embeddings", m.tie_embeddings, "share wte with the LM head (true|false)");
    add_value(cmd, "--norm", flags.norm, "block norms ln_1, ln_2, ln_f")
        ->check(CLI::IsMember({"layernorm", "rmsnorm"}));
    add_value(cmd, "--norm-placement", flags.norm_placement,
              "block norms before each sub-block (pre: GPT-2, Qwen3), after it (post: OLMo 2, "
              "x + norm(f(x))), or both (Gemma 3)")
        ->check(CLI::IsMember({"pre", "post", "both"}));
    add_value(cmd, "--norm-eps", m.norm_eps, "epsilon of every norm (block and QK-norm)");
    add_value(cmd, "--norm-unit-offset", m.norm_unit_offset,
              "norm gains stored as w and applied as (1 + w), w starting at 0 (Gemma)");
    add_value(cmd, "--embedding-scale", m.embedding_scale,
              "token embeddings times this (Gemma: sqrt(n-embd))");
    add_value(cmd, "--attention", flags.attention,
              "fused: one kernel, no T x T memory (FlashAttention-2); naive: matmul, softmax, "
              "matmul (the reference). Same math; attention dropout always runs naive")
        ->check(CLI::IsMember({"fused", "naive"}));
    add_value(cmd, "--precision", flags.precision,
              "GEMM arithmetic: fp32, or bf16 / fp16 mixed precision (bf16 or float16 inputs, "
              "float32 sums; weights, optimizer state and checkpoints stay float32; fp16 trains "
              "with dynamic loss scaling), or fp8: simulated FP8 Linear layers (E4M3 forward, "
              "E5M2 gradients, delayed per-tensor scaling), bf16 elsewhere")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
    cmd->add_flag(
        "--fp8-attention", m.fp8_attention,
        "with --precision fp8: attention's q and k in E4M3 too (delayed scaling), and its "
        "logits rounded to E4M3 at scale 1 before the softmax (|s| > 448 saturates)");
    add_value(cmd, "--pos-emb", flags.pos_emb,
              "positions: learned (a wpe table added to the embeddings) or rope (q and k rotated "
              "per head, no wpe)")
        ->check(CLI::IsMember({"learned", "rope"}));
    add_value(cmd, "--rope-theta", m.rope_theta, "RoPE base theta (pair i turns theta^(-2i/D))");
    add_value(cmd, "--rope-local-theta", m.rope_local_theta,
              "RoPE base of the sliding-window layers; 0 = rope-theta");
    add_value(cmd, "--sliding-window", m.sliding_window,
              "keys a query of a sliding layer sees (itself and the W - 1 before it); 0 = off");
    add_value(cmd, "--layer-types", m.layer_types,
              "one of full|sliding per layer, comma-separated; empty: every layer sliding when "
              "sliding-window > 0");
    add_value(cmd, "--query-pre-attn-scalar", m.query_pre_attn_scalar,
              "attention logits q.k / sqrt(this) (Gemma); 0 = head dim");
    add_value(cmd, "--mlp", flags.mlp,
              "the MLP: gelu (GPT-2), or gated, c_proj(act(c_gate x) * c_fc x): swiglu (SiLU; "
              "Llama, Qwen3, OLMo 2) or geglu (tanh-GELU; Gemma)")
        ->check(CLI::IsMember({"gelu", "swiglu", "geglu"}));
    add_value(cmd, "--mlp-hidden", m.mlp_hidden, "the MLP's inner width; 0 = 4 x n-embd");
    add_value(cmd, "--qk-norm-order", flags.qk_norm_order,
              "with rope: before_rope normalises q and k, then rotates (OLMo 2, Qwen3); "
              "after_rope the other way (qk-norm-scope head only)")
        ->check(CLI::IsMember({"before_rope", "after_rope"}));
    add_regularisation_flags(cmd, m);
    if (attention_flags) add_attention_flags(cmd, m, flags);
    add_value(cmd, "--lp-p", m.lp_p, "p of the lp variant (>= 1)");
    add_value(cmd, "--qk-scale-init", m.qk_scale_init,
              "initial g for l2/lp: henry (log2(T^2-T)), sqrt_d, or a number");
    add_value(cmd, "--qk-scale-per-head", m.qk_scale_per_head,
              "one g per head instead of one per layer");
}

void add_training_flags(CLI::App* cmd, TrainConfig& cfg, bool single_run) {
    cmd->add_option("--data", cfg.data_path,
                    "a text file to train on (default: bundled Tiny Shakespeare), or a directory "
                    "of token shards (qknorm prepare, llm.c's scripts, nanoGPT's train.bin / "
                    "val.bin) with --tokenizer naming their tokenizer")
        ->check(
            [](const std::string& path) {
                return path.empty()
                           ? std::string(
                                 "an empty path; give a text file or a directory, or leave "
                                 "--data out for the bundled Tiny Shakespeare")
                           : std::string();
            },
            "FILE");
    add_value(cmd, "--tokenizer", cfg.tokenizer,
              "char (sorted unique characters), byte (256), or a tokenizer file: tokenizer.json "
              "(byte-level BPE), tokenizer.model (SentencePiece), a directory holding one, a "
              "checkpoint (with --init-from: the model's own, else byte)");
    ModalityMix& mix = cfg.modalities;
    add_value(cmd, "--image-fraction", mix.image_fraction,
              "mix synthetic images into the text: this share of the tokens in [BOI] codes [EOI] "
              "spans (docs/modalities.md); 0 = text only")
        ->check(CLI::Range(0.0, 0.9));
    add_value(cmd, "--image-entropy", mix.image_entropy,
              "the images' entropy in bits per code: from near-constant images (~log2(K)/N^2) to "
              "noise (log2 K)");
    add_value(cmd, "--image-size", mix.image_size, "an image is N x N codes");
    add_value(cmd, "--image-codes", mix.image_codes, "K: the images' sub-vocabulary");
    add_value(cmd, "--modality-signals", cfg.modality_signals,
              "the signals split by modality in metrics.jsonl (true|false; on with any image); "
              "with --image-fraction 0, the text-only control on the same vocabulary");
    if (single_run)
        cmd->add_option("--init-from", cfg.init_from,
                        "fine-tune a Hugging Face model directory (config.json + safetensors of "
                        "GPT-2, Qwen3, OLMo 2 or Gemma 3): its architecture and weights replace "
                        "the model flags (--precision, --attention, --dropout, --z-loss still "
                        "apply); unless given, fine-tuning's defaults replace pre-training's: "
                        "--lr 5e-05 --lr-min 5e-06 --steps 300 --warmup steps/10 --batch-size 8")
            ->check(CLI::ExistingDirectory);
    add_value(cmd, "--context", cfg.context,
              "training window length; 0 = block-size (with --init-from: the model's, at most "
              "1024)");
    add_value(cmd, "--device", cfg.device,
              "cpu, or cuda: the CUDA backend (a GPU, or in an emulation build the CUDA "
              "kernels run on the cpu: correct but slow, for tests)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    add_value(cmd, "--tf32", cfg.tf32,
              "with --device cuda: float32 GEMMs on TF32 tensor cores (inputs rounded to 10 "
              "mantissa bits, float32 sums); --precision bf16 GEMMs are unaffected");
    add_value(cmd, "--batch-size", cfg.batch_size,
              "sequences per step (B), over all ranks and micro-batches");
    add_value(cmd, "--grad-accum", cfg.grad_accum,
              "micro-batches per step (K): each rank runs K passes of B / (ranks * K) sequences "
              "and sums their gradients before the update");
    add_value(cmd, "--bucket-mb", cfg.bucket_mb,
              "under mpirun: gradients are averaged over the ranks in buckets of this many MB");
    add_value(cmd, "--overlap", cfg.overlap,
              "under mpirun: average each bucket while backward still runs (false: after it)");
    add_value(cmd, "--zero", cfg.zero,
              "1: ZeRO-1, AdamW's moments sharded over the ranks (each rank keeps 1/N of them)");
    add_value(cmd, "--dist-timeout", cfg.dist_timeout,
              "under mpirun: seconds to wait for the other ranks before ending the job");
    add_value(cmd, "--steps", cfg.steps, "optimisation steps");
    add_value(cmd, "--warmup", cfg.warmup, "linear warmup steps before the decay");
    if (single_run) add_value(cmd, "--lr", cfg.lr, "peak learning rate");
    if (single_run) add_value(cmd, "--lr-min", cfg.lr_min, "learning rate at the end of the decay");
    add_value(cmd, "--lr-schedule", cfg.lr_schedule,
              "after warmup: cosine (decay to lr-min), or wsd (warmup-stable-decay: lr held, "
              "then a linear decay to lr-min over the last --cooldown of the run)")
        ->check(CLI::IsMember({"cosine", "wsd"}));
    add_value(cmd, "--cooldown", cfg.cooldown,
              "--lr-schedule wsd: the fraction of the schedule spent decaying, in (0, 1]");
    add_value(cmd, "--beta1", cfg.beta1, "AdamW beta1");
    add_value(cmd, "--beta2", cfg.beta2, "AdamW beta2");
    add_value(cmd, "--weight-decay", cfg.weight_decay, "AdamW weight decay (2-D weights only)");
    add_value(cmd, "--independent-wd", cfg.independent_weight_decay,
              "decay by (lr/lr_max)*wd per step, independent of the peak lr (Wortsman et al.)");
    add_value(cmd, "--optimizer", cfg.optimizer,
              "adamw, or muon: Muon (orthogonalised momentum) for the blocks' 2-D weights and "
              "AdamW for embeddings, gains and biases; same lr schedule")
        ->check(CLI::IsMember({"adamw", "muon"}));
    add_value(cmd, "--muon-momentum", cfg.muon_momentum, "Muon's momentum (Nesterov)");
    add_value(cmd, "--qk-clip", cfg.qk_clip,
              "QK-Clip threshold tau (Kimi K2): after each step, scale the q and k rows of every "
              "head whose max |logit| passed tau by sqrt(tau/max); --qk-norm none only; 0 = off");
    add_value(cmd, "--diverge-factor", cfg.diverge_factor,
              "stop as diverged when the loss exceeds this multiple of the run's lowest loss (or "
              "is NaN/Inf); 0 = on NaN/Inf only");
    add_value(cmd, "--grad-clip", cfg.grad_clip, "global gradient-norm clip; 0 = off");
    add_value(cmd, "--loss-scale", cfg.loss_scale,
              "--precision fp16: the initial loss scale, in [2^-24, 2^64] (halved, and the step "
              "skipped, when a gradient overflows)");
    add_value(cmd, "--loss-scale-interval", cfg.loss_scale_interval,
              "--precision fp16: double the loss scale after this many clean steps in a row");
    add_value(cmd, "--eval-every", cfg.eval_every,
              "validate every N steps and at the end (0: about 20 times a run, steps / 20)");
    add_value(cmd, "--eval-batches", cfg.eval_batches,
              "validation batches (the same ones each time)");
    cmd->add_option("--eval-protocol", cfg.eval_protocol,
                    "nanogpt: also report nanoGPT's validation figure (every 256-token window of "
                    "the validation split; needs --block-size >= 256) beside the project's")
        ->check(CLI::IsMember({"qknorm", "nanogpt"}))
        ->capture_default_str();
    add_value(cmd, "--stats-every", cfg.stats_every,
              "record the attention stability signals every N steps; 0 = auto: every steps/50 "
              "(50 points or more for any run), at most every 25");
    add_value(cmd, "--checkpoint-every", cfg.checkpoint_every, "write a checkpoint every N steps");
    add_value(cmd, "--keep-checkpoints", cfg.keep_checkpoints,
              "how many recent checkpoints to keep");
    if (single_run)
        add_value(cmd, "--seed", cfg.seed, "seed of the weights, the batches and dropout");
    if (single_run)
        cmd->add_option(
            "--run-dir", cfg.run_dir,
            "where the checkpoints, metrics.jsonl and plot.svg go (default: runs/<date-time>)");
    if (single_run)
        add_value(cmd, "--sample-tokens", cfg.sample_tokens,
                  "characters to generate at the end; 0 = none");
}

void apply_model_flags(TrainConfig& cfg, const ModelFlags& flags) {
    cfg.model.norm = parse_norm_kind(flags.norm);
    cfg.model.qk_norm = parse_qk_norm(flags.qk_norm);
    cfg.model.qk_norm_scope = parse_norm_scope(flags.qk_scope);
    cfg.model.fused_attention = flags.attention == "fused";
    cfg.model.precision = parse_precision(flags.precision);
    cfg.model.pos_emb = parse_pos_emb(flags.pos_emb);
    cfg.model.qk_norm_order = parse_qk_norm_order(flags.qk_norm_order);
    cfg.model.mlp = parse_mlp_kind(flags.mlp);
    cfg.model.norm_placement = parse_norm_placement(flags.norm_placement);
}

ModelFlags model_flags_of(const GPTConfig& m) {
    return {.norm = to_string(m.norm),
            .qk_norm = to_string(m.qk_norm),
            .qk_scope = to_string(m.qk_norm_scope),
            .attention = m.fused_attention ? "fused" : "naive",
            .precision = to_string(m.precision),
            .pos_emb = to_string(m.pos_emb),
            .qk_norm_order = to_string(m.qk_norm_order),
            .mlp = to_string(m.mlp),
            .norm_placement = to_string(m.norm_placement)};
}

// Experiment 1 of the stability lab (docs/results.md#experiment-1-logit-growth-and-lr-sensitivity)
// is the default grid: a 2-layer model that trains in about a minute, the QK-norm family, learning
// rates 1e-3 ... 3e-1.
void set_sweep_defaults(SweepSpec& spec) {
    TrainConfig& b = spec.base;
    b.model.n_layer = 2, b.model.n_head = 4, b.model.n_embd = 128, b.model.block_size = 64;
    b.model.bias = false;
    b.batch_size = 32, b.steps = 600, b.warmup = 30;  // 5 % warmup, then cosine
    b.weight_decay = 1e-4, b.independent_weight_decay = true;
    b.eval_every = 100, b.stats_every = 10, b.checkpoint_every = 200, b.keep_checkpoints = 1;
    b.sample_tokens = 0;
    spec.variants = {"baseline", "qk_layernorm", "qk_rmsnorm", "l2",
                     "softcap",  "qk_norm_cap",  "qkv_norm"};
    spec.lrs = {1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
    spec.seeds = {1};
    spec.out_dir = "sweeps/default";
}

void add_sweep_flags(CLI::App* cmd, SweepSpec& spec) {
    cmd->add_option(
           "--variants", spec.variants,
           fmt::format("comma-separated variants, each a preset with optional :key=value "
                       "overrides; presets: {}; keys: {} (e.g. lp:p=3:g0=1; "
                       "docs/stability-lab.md says what each sets)",
                       fmt::join(nn::variant_presets(), ", "), fmt::join(nn::variant_keys(), ", ")))
        ->delimiter(',')
        ->capture_default_str();
    add_value(cmd, "--lrs", spec.lrs, "comma-separated peak learning rates")->delimiter(',');
    add_value(cmd, "--seeds", spec.seeds, "comma-separated seeds")->delimiter(',');
    add_value(cmd, "--lr-min-ratio", spec.lr_min_ratio,
              "each run's cosine decays to lr * this ratio");
    add_value(cmd, "--jobs", spec.jobs, "runs trained at the same time, one process each");
    cmd->add_option("--out", spec.out_dir,
                    "sweep directory: runs/, results.csv, sensitivity.csv and the plots; a "
                    "second call skips finished runs and resumes interrupted ones")
        ->capture_default_str();
    cmd->add_option("--plot-param", spec.plot_param,
                    "also plot the final loss against this variant override (e.g. p), one curve "
                    "per remaining variant string, one panel per LR (param_sweep.svg)");
    add_value(cmd, "--plot-lr", spec.plot_lr,
              "learning rate of the logit and entropy plots; 0 = the largest");
}

void add_sample_flags(CLI::App* cmd, SampleArgs& args) {
    cmd->add_option(
        "--run-dir,--run", args.run,
        "run directory, its latest checkpoint is used (default: the newest under runs/)");
    cmd->add_option("--ckpt", args.ckpt, "a model checkpoint file, instead of --run-dir");
    cmd->add_option("--model", args.model,
                    "a Hugging Face model directory (config.json and safetensors of GPT-2, Qwen3, "
                    "OLMo 2 or Gemma 3, read with its tokenizer.json or tokenizer.model; bytes "
                    "without one), instead of --run-dir");
    // Free text, verbatim: without allow_extra_args(false) CLI11 reads "[a, b]" as a list of two.
    cmd->add_option("--prompt", args.prompts,
                    "text to continue (default: a newline); repeat it to decode several prompts "
                    "together")
        ->allow_extra_args(false);
    add_value(cmd, "--num-samples", args.num_samples,
              "samples per prompt, decoded together; sample i draws with --seed + i")
        ->check(CLI::Range(int64_t{1}, int64_t{1024}));
    cmd->add_option("--precision", args.precision,
                    "fp32, bf16 (bf16-stored weights: half the bytes per token) or fp16; "
                    "default: as trained")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    SampleOptions& o = args.options;
    add_value(cmd, "--tokens", o.max_new_tokens,
              fmt::format("tokens to generate, at most {}", kMaxSampleTokens));
    add_value(cmd, "--temperature", o.temperature, "softmax temperature; 0 = greedy");
    add_value(cmd, "--top-k", o.top_k, "sample among the k most likely; 0 = all");
    add_value(cmd, "--top-p", o.top_p,
              "nucleus sampling: among the most likely ids holding this much probability; 1 = off");
    add_value(cmd, "--min-p", o.min_p,
              "drop ids less likely than this times the most likely one; 0 = off");
    add_value(cmd, "--repetition-penalty", o.repetition_penalty,
              "divide (multiply) the positive (negative) logits of ids already in the text; 1 = "
              "off");
    cmd->add_option("--stop", args.stops,
                    "stop once the generated text contains this string (repeatable)")
        ->allow_extra_args(false)
        ->check(
            [](const std::string& s) {
                return s.empty() ? std::string("an empty stop string would stop at once")
                                 : std::string();
            },
            "TEXT");
    add_value(cmd, "--when-full", args.when_full,
              "at the context limit: slide (keep the last half of the text and go on) or stop")
        ->check(CLI::IsMember({"slide", "stop"}));
    add_value(cmd, "--seed", args.seed, "sampling seed");
}

void apply_fine_tune_defaults(const CLI::App* cmd, nn::TrainConfig& cfg) {
    auto unset = [&](const char* flag) {
        const CLI::Option* option = cmd->get_option_no_throw(flag);
        return option && option->count() == 0;
    };
    if (unset("--lr")) cfg.lr = kFineTuneLr;
    if (unset("--lr-min")) cfg.lr_min = std::min(kFineTuneLrMin, cfg.lr);
    if (unset("--steps")) cfg.steps = kFineTuneSteps;
    if (unset("--warmup")) cfg.warmup = cfg.steps / 10;
    if (unset("--batch-size")) cfg.batch_size = kFineTuneBatch;
    // The pre-training default holds the peak for 70 % of the run; a fine-tune decays from it.
    if (unset("--lr-schedule")) cfg.lr_schedule = "cosine";
}

void refuse_inert_flags(const CLI::App* cmd, const nn::TrainConfig& cfg) {
    const nn::GPTConfig& m = cfg.model;
    const bool lp_family = m.qk_norm == nn::QKNorm::l2 || m.qk_norm == nn::QKNorm::lp;
    const std::string precision = "--precision " + nn::to_string(m.precision);
    const std::string qk_norm = "--qk-norm " + nn::to_string(m.qk_norm);
    // flag, and why it does nothing here ("" when it does something)
    const std::pair<const char*, std::string> rules[] = {
        {"--loss-scale",
         m.precision != Precision::fp16 ? "sets fp16's loss scaler; " + precision : ""},
        {"--loss-scale-interval",
         m.precision != Precision::fp16 ? "sets fp16's loss scaler; " + precision : ""},
        {"--image-size",
         cfg.modalities.image_fraction == 0 ? "shapes the images; --image-fraction is 0" : ""},
        {"--image-entropy",
         cfg.modalities.image_fraction == 0 ? "shapes the images; --image-fraction is 0" : ""},
        {"--image-codes", !cfg.multimodal() ? "sizes the images' vocabulary; there are no images "
                                              "(--image-fraction 0) and no --modality-signals"
                                            : ""},
        {"--cooldown",
         cfg.lr_schedule != "wsd"
             ? "is the decay of --lr-schedule wsd; --lr-schedule is " + cfg.lr_schedule
             : ""},
        {"--muon-momentum",
         cfg.optimizer != "muon" ? "sets Muon; --optimizer is " + cfg.optimizer : ""},
        {"--lp-p", m.qk_norm != nn::QKNorm::lp ? "is the p of --qk-norm lp; " + qk_norm : ""},
        {"--qk-scale-init", !lp_family ? "sets the scale of --qk-norm l2 or lp; " + qk_norm : ""},
        {"--qk-scale-per-head",
         !lp_family ? "shapes the scale of --qk-norm l2 or lp; " + qk_norm : ""},
        {"--qk-norm-scope", m.qk_norm == nn::QKNorm::none ? "scopes the QK-norm; " + qk_norm : ""},
        {"--qk-norm-order",
         m.qk_norm == nn::QKNorm::none || m.pos_emb != nn::PosEmb::rope
             ? "orders the QK-norm and RoPE; " + qk_norm + ", --pos-emb " + nn::to_string(m.pos_emb)
             : ""},
        {"--rope-theta",
         m.pos_emb != nn::PosEmb::rope ? "is RoPE's base; --pos-emb is learned" : ""},
        {"--rope-local-theta",
         m.pos_emb != nn::PosEmb::rope || m.sliding_window == 0
             ? "is the sliding layers' RoPE base; there are none (--pos-emb rope and a "
               "--sliding-window needed)"
             : ""},
    };
    for (const auto& [flag, why] : rules) {
        const CLI::Option* option = cmd->get_option_no_throw(flag);
        if (option && option->count() > 0 && !why.empty())
            throw UsageError(fmt::format("train: {} does nothing in this run: it {}", flag, why));
    }
}

CLI::Option* add_verbatim_positionals(CLI::App* cmd, const std::string& name,
                                      std::vector<std::string>& values, const std::string& help) {
    cmd->allow_extras();
    cmd->fallthrough(false);  // else the program, not cmd, would collect the rest as its extras
    return cmd->add_option(name, values, help)
        ->expected(1)
        ->allow_extra_args(false)
        ->type_name("TEXT ...");
}

void take_verbatim_positionals(CLI::App* cmd, std::vector<std::string>& values) {
    bool after_marker = false;  // after "--" every argument is a positional, "-x" too
    for (const std::string& arg : cmd->remaining()) {
        if (arg == "--" && !after_marker) {
            after_marker = true;
            continue;
        }
        if (!after_marker && arg.size() > 1 && arg.front() == '-')
            throw UsageError(fmt::format("{}: the following argument was not expected: {}",
                                         cmd->get_name(), arg));
        values.push_back(arg);
    }
}

}  // namespace qk::cli
