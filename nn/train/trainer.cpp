#include "nn/train/trainer.h"
#include "nn/train/train_data.h"

#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "autograd/grad_mode.h"
#include "core/distributed.h"
#include "core/factory.h"
#include "core/safetensors.h"
#include "nn/model/sample.h"
#include "nn/optim/data_parallel.h"
#include "nn/optim/loss_scale.h"
#include "nn/optim/qk_clip.h"
#include "nn/signals/fp8_telemetry.h"
#include "nn/signals/metrics_file.h"
#include "nn/signals/modality_signals.h"
#include "nn/signals/plot.h"
#include "nn/train/checkpoint.h"
#include "nn/train/eval_protocol.h"
#include "nn/train/fine_tune.h"
#include "nn/train/run_control.h"
#include "nn/train/run_dir.h"
#include "nn/train/run_optimizer.h"
#include "nn/train/train_step.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace qk::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The installed copy first: an installed library must not need its source tree.
std::string default_data_path() {
    for (const char* candidate :
         {QK_DATA_DIR "/tinyshakespeare.txt", QK_SOURCE_DIR "/data/tinyshakespeare.txt",
          "data/tinyshakespeare.txt"})
        if (fs::exists(candidate)) return candidate;
    throw Error("train: the bundled data/tinyshakespeare.txt was not found; pass --data FILE");
}

namespace {

// Why this step's loss stops the run ("" if it does not): non-finite, or a spike above
// diverge_factor × the lowest loss so far.
std::string divergence(double loss, double grad_norm, double min_loss, double factor) {
    if (!std::isfinite(loss) || !std::isfinite(grad_norm))
        return fmt::format("loss {}, gradient norm {}", loss, grad_norm);
    if (factor > 0 && loss > factor * min_loss)
        return fmt::format(
            "loss {:.4g} is above {:g} x the lowest loss so far, {:.4g} "
            "(--diverge-factor)",
            loss, factor, min_loss);
    return "";
}

// ---- the loop's pieces -----------------------------------------------------------------------

// The validation loss, and with by_modality (a mixed stream's vocab) its split by the targets'
// modality.
double evaluate(GPT& model, const TextDataset& data, const TrainConfig& cfg,
                const ModalityVocab& vocab = {}, ModalitySignals* by_modality = nullptr) {
    NoGradGuard no_grad;
    model.eval();
    Generator gen(cfg.seed ^ 0xe7a1u);  // the same validation batches at every evaluation
    double total = 0;
    ModalitySignals split;
    for (int64_t i = 0; i < cfg.eval_batches; ++i) {
        Tensor ids, targets;
        // Every rank draws every batch, and reads and evaluates its share.
        const bool mine = i % dist::world_size() == dist::rank();
        data.batch(false, cfg.batch_size, gen, ids, targets, [mine](int64_t) { return mine; });
        if (!mine) continue;
        const GPTOutput out = model.forward(ids.to(model.device()), targets.to(model.device()));
        total += out.cross_entropy.item();
        if (by_modality) add_output_signals(split, out.logits, targets, vocab);
    }
    model.train();
    if (by_modality) {
        reduce_over_ranks(split);
        *by_modality = split;
    }
    return dist::all_reduce_sum(total) / static_cast<double>(cfg.eval_batches);
}

// stderr is a terminal: the progress bar redraws in place. Into a file or a pipe, a carriage
// return per step would pile up (845 KB for the default run): a plain line every 1/20 of the run.
bool progress_on_terminal() {
    static const bool terminal = ::isatty(2) == 1;
    return terminal;
}

void print_progress(int64_t step, int64_t total, double loss, double val_loss, double tokens_per_s,
                    double eta_seconds) {
    const std::string val = std::isnan(val_loss) ? "  -   " : fmt::format("{:.4f}", val_loss);
    const std::string figures =
        fmt::format("step {}/{}  loss {:.4f}  val {}  {:.0f} tok/s  ETA {}", step, total, loss, val,
                    tokens_per_s, format_duration(eta_seconds));
    if (!progress_on_terminal()) {
        const int64_t every = std::max<int64_t>(1, (total + 19) / 20);
        if (step % every == 0 || step == total) fmt::print(stderr, "{}\n", figures);
        return;
    }
    const int width = 24, filled = static_cast<int>(width * step / std::max<int64_t>(total, 1));
    const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    fmt::print(stderr, "\r[{}] {}   ", bar, figures);
    std::fflush(stderr);
}

// What every rank must agree on before the first step: the saved config and the knobs that
// change the collectives each rank makes.
std::string replica_settings(const TrainConfig& cfg, const TrainingData& input) {
    json j = json::parse(cfg.to_json());
    if (dist::world_size() == 1) return j.dump();  // nothing to compare with
    // The data's content, not only its path: ranks on other machines may read another file.
    j["data_fnv1a64"] = input.fingerprint;
    j["bucket_mb"] = cfg.bucket_mb;
    j["overlap"] = cfg.overlap;
    j["dist_timeout"] = cfg.dist_timeout;
    j["zero"] = cfg.zero;
    j["ranks"] = dist::world_size();
    return j.dump();
}

// The optimizer a config asks for: AdamW, or Muon for the blocks' matrices and AdamW for the
// rest, on this process's ranks.
RunOptimizerOptions run_optimizer_options(const TrainConfig& cfg) {
    RunOptimizerOptions options;
    options.adamw = {.lr = cfg.lr,
                     .beta1 = cfg.beta1,
                     .beta2 = cfg.beta2,
                     .eps = 1e-8,
                     .weight_decay = cfg.weight_decay,
                     .independent_weight_decay = cfg.independent_weight_decay,
                     .lr_max = cfg.lr};
    options.muon = cfg.optimizer == "muon";
    options.attn_rows = {cfg.model.q_width(), cfg.model.kv_width()};
    // Newton–Schulz at the model's GEMM precision (fp8's other GEMMs are bf16).
    const Precision gemm = cfg.model.precision;
    options.muon_options = {
        .momentum = cfg.muon_momentum,
        .weight_decay = cfg.weight_decay,
        .precision = gemm == Precision::fp8 ? Precision::bf16 : gemm,
    };
    options.zero = static_cast<int>(cfg.zero);
    options.bucket_bytes = static_cast<int64_t>(cfg.bucket_mb * (1 << 20));
    options.overlap = cfg.overlap;
    return options;
}

// What a checkpoint saves besides the weights and the optimizer: the step, the generators, the
// config, and the loss scaler's state.
TrainingState training_state(const TrainConfig& cfg, int64_t done, GPT& model,
                             const Generator& data_gen, const LossScaler* scaler) {
    TrainingState state{done,
                        data_gen.seed(),
                        data_gen.counter(),
                        model.dropout_generator().seed(),
                        model.dropout_generator().counter(),
                        {{"train_config", cfg.to_json()}}};
    if (scaler) state.extra["loss_scaler"] = scaler->state_json();
    if (cfg.model.precision == Precision::fp8) state.extra["fp8_scaling"] = fp8_state_json(model);
    return state;
}

// At a checkpoint step `done`, after its update: the training state to save goes to `pending`,
// to be written once the next step's loss vouches for the weights; the last step has no next
// loss, and its validation loss, measured on those weights, vouches for them instead: it is
// written now. Returns why the run diverged ("" if it did not): the update made a weight or a
// moment non-finite, or the final validation loss is a spike.
std::string checkpoint_after_update(const TrainConfig& cfg, int64_t done, double last_val,
                                    double min_loss, GPT& model, const RunOptimizer& optimizer,
                                    const Tokenizer& tokenizer, const Generator& data_gen,
                                    const LossScaler* scaler,
                                    std::optional<TrainingState>& pending) {
    // The loss was finite before this step's update, but the update itself can overflow (a huge
    // lr · weight decay): check what would be saved.
    if (!optimizer.all_finite())
        return fmt::format(
            "training diverged at step {}: the update made a weight or an optimizer moment NaN or "
            "Inf; {}",
            done, kept_checkpoint_note(cfg.run_dir));
    pending = training_state(cfg, done, model, data_gen, scaler);
    if (done != cfg.steps) return "";
    if (const std::string why = divergence(last_val, 0.0, min_loss, cfg.diverge_factor);
        !why.empty())
        return fmt::format("training diverged at step {}: validation {} on the final weights; {}",
                           done, why, kept_checkpoint_note(cfg.run_dir));
    write_checkpoint(cfg, model, optimizer, tokenizer, *pending);
    pending.reset();
    return "";
}

// Ctrl-C or SIGTERM asked the run to stop, on any rank: every rank gets the same answer, so that
// all of them write the checkpoint's collectives and stop together.
bool stop_asked(const StopSignals& signals) {
    const double asked = signals.requested() ? 1.0 : 0.0;
    return (dist::world_size() > 1 ? dist::all_reduce_max(asked) : asked) > 0;
}

// The checkpoint of a run stopped by a signal after step `done`, whatever --checkpoint-every
// says, and the message that tells how to go on.
std::string checkpoint_on_stop(const TrainConfig& cfg, int64_t done, GPT& model,
                               const RunOptimizer& optimizer, const Tokenizer& tokenizer,
                               const Generator& data_gen, const LossScaler* scaler) {
    if (!optimizer.all_finite())
        return fmt::format(
            "stopped at step {}: the last update made a weight NaN or Inf, so no checkpoint of "
            "it was written",
            done);
    write_checkpoint(cfg, model, optimizer, tokenizer,
                     training_state(cfg, done, model, data_gen, scaler));
    return fmt::format(
        "stopped at step {} of {}: checkpoint {} written; continue with: {} train --resume {}",
        done, cfg.steps, checkpoint_prefix(cfg.run_dir, done) + ".model.safetensors", cfg.program,
        cfg.run_dir);
}

// Where the loop starts: the step, and what metrics.jsonl says of the steps before it.
struct RunStart {
    int64_t step = 0;
    MetricsSoFar so_far;
};

// A new run: the validation loss at initialisation (step 0, the reference of Wortsman et al.'s
// LR sensitivity in `qknorm sweep`), config.json and the first line of metrics.jsonl.
RunStart start_run(const TrainConfig& cfg, GPT& model, const TextDataset& data) {
    const double val_loss = evaluate(model, data, cfg);
    if (dist::is_root()) {
        write_file_atomic(cfg.run_dir + "/config.json", cfg.to_json());
        write_file_atomic(cfg.run_dir + "/metrics.jsonl",
                          json{{"step", 0}, {"val_loss", val_loss}}.dump() + "\n");
    }
    return {};
}

// A resumed run: the weights, optimizer state and generators of the run's latest checkpoint, and
// metrics.jsonl cut back to it. Rank 0 reads the checkpoint and hands it to the others: they
// need no copy of the run directory, and the checkpoint does not depend on how many ranks wrote
// or read it.
RunStart resume_run(const TrainConfig& cfg, GPT& model, RunOptimizer& optimizer,
                    Generator& data_gen, LossScaler* scaler) {
    json resumed;
    MetricsSoFar so_far;
    OptimizerState whole = optimizer.state();  // the whole state, also with --zero 1
    if (dist::is_root()) {
        const std::vector<int64_t> steps = checkpoint_steps(cfg.run_dir);
        QK_CHECK(!steps.empty(), "resume: {} has no complete checkpoint", cfg.run_dir);
        const std::string prefix = checkpoint_prefix(cfg.run_dir, steps.back());
        const std::string model_path = prefix + ".model.safetensors";
        const SafetensorsFile checkpoint = load_safetensors(model_path);  // read once
        check_checkpoint_config(model_path, checkpoint.metadata, model.config());
        load_weights_into(model, checkpoint, model_path);
        const std::string state_path = prefix + ".state.safetensors";
        TrainingState state = load_training_state(state_path, whole);
        QK_CHECK(state.step == steps.back(), "resume: {} says step {}, but its name says step {}",
                 state_path, state.step, steps.back());
        so_far = truncate_metrics(cfg.run_dir, state.step);
        // What the command line changed (--steps, --zero, ...) is the run's configuration now.
        write_file_atomic(cfg.run_dir + "/config.json", cfg.to_json());
        resumed = {{"step", state.step},
                   {"data", {state.data_seed, state.data_counter}},
                   {"dropout", {state.dropout_seed, state.dropout_counter}}};
        // A run that switches to fp16 or fp8 on resume starts its scaler and scales afresh.
        if (scaler && state.extra.count("loss_scaler"))
            resumed["loss_scaler"] = state.extra.at("loss_scaler");
        if (cfg.model.precision == Precision::fp8 && state.extra.count("fp8_scaling"))
            resumed["fp8_scaling"] = state.extra.at("fp8_scaling");
    }
    resumed = json::parse(broadcast_string(resumed.dump()));
    broadcast_tensors(model.parameters());
    for (const auto& [name, t] : whole.tensors) dist::broadcast(t);
    const int64_t start_step = resumed["step"].get<int64_t>();
    whole.steps = start_step;
    optimizer.load(whole);
    data_gen.set_state(resumed["data"][0].get<uint64_t>(), resumed["data"][1].get<uint64_t>());
    model.dropout_generator().set_state(resumed["dropout"][0].get<uint64_t>(),
                                        resumed["dropout"][1].get<uint64_t>());
    if (resumed.contains("loss_scaler"))
        scaler->load_state_json(resumed["loss_scaler"].get<std::string>(), cfg.run_dir);
    if (resumed.contains("fp8_scaling"))
        load_fp8_state(model, resumed["fp8_scaling"].get<std::string>(), cfg.run_dir);
    Tensor losses =
        from_vector({so_far.last_loss, so_far.last_val_loss, so_far.min_loss}, {3}, DType::f64);
    dist::broadcast(losses);  // the divergence check's reference, the same on every rank
    return {start_step, {losses.at({0}), losses.at({1}), losses.at({2})}};
}

// The end of a run, on rank 0: plot.svg, result.json (the marker of a finished run, which a
// sweep skips) and, unless it diverged, the sample of cfg.sample_tokens characters.
void write_run_end(const TrainConfig& cfg, GPT& model, const Tokenizer& tokenizer, double seconds,
                   TrainResult& result) {
    write_run_plot(cfg);
    write_file_atomic(cfg.run_dir + "/result.json",
                      json{{"steps_done", result.steps_done},
                           {"final_loss", result.final_loss},
                           {"final_val_loss", result.final_val_loss},
                           {"final_val_bpb", result.final_val_bpb},
                           {"final_val_loss_nanogpt", std::isnan(result.final_val_loss_nanogpt)
                                                          ? json()
                                                          : json(result.final_val_loss_nanogpt)},
                           {"diverged", result.diverged},
                           {"message", result.message},
                           {"seconds", seconds}}
                          .dump(2));
    if (!result.diverged && cfg.sample_tokens > 0) {
        Generator gen(cfg.seed);
        SampleOptions options{.max_new_tokens = cfg.sample_tokens,
                              .temperature = 0.8,
                              .top_k = 0,
                              .vocab = tokenizer.vocab_size()};
        // A document's start (<|endoftext|>) where the tokenizer has one; else id 0, the
        // smallest byte of the text: the newline, for any ordinary text file.
        const int32_t start = tokenizer.document_separator().value_or(0);
        result.sample = tokenizer.decode(generate(model, {start}, options, gen));
    }
}

// ---- the run, step by step -------------------------------------------------------------------

// What a run holds from open_run to its end.
struct TrainingRun {
    TrainConfig cfg;
    bool root = dist::is_root();       // the one rank that writes the run directory
    std::unique_ptr<RunDirLock> lock;  // held to the end: one process per run directory
    TrainingData input;                // the tokenizer, the dataset, bytes per validation token
    std::unique_ptr<GPT> model;
    std::unique_ptr<RunOptimizer> optimizer;
    Generator data_gen{0};
    std::ofstream metrics;  // metrics.jsonl, appended a line per step (rank 0)
    int64_t start_step = 0;
    TrainResult result;
    double last_val = NAN, min_loss = INFINITY, step_seconds_total = 0;
    // A checkpoint is written only once the next step's loss, measured on its weights, passes
    // the divergence check: a run that blows up never leaves its blown-up weights as "last good".
    std::optional<TrainingState> pending;
    std::optional<LossScaler> scaler;  // --precision fp16 and fp8 only
    LossScaler* scaler_or_null() { return scaler ? &*scaler : nullptr; }
    std::chrono::steady_clock::time_point start_time = std::chrono::steady_clock::now();

    double tokens_per_step() const {
        return static_cast<double>(cfg.batch_size * cfg.context_length());
    }
};

// A run directory this run made, removed with what the run wrote in it if the run is refused
// before its first step (a wrong --device, a tokenizer too large for --init-from): a refused run
// leaves nothing behind. Cleared once the run starts.
struct NewDirectory {
    std::string path;
    NewDirectory() = default;
    NewDirectory(const NewDirectory&) = delete;
    NewDirectory& operator=(const NewDirectory&) = delete;
    ~NewDirectory() {
        std::error_code ignored;
        if (!path.empty()) fs::remove_all(path, ignored);
    }
};

// Checks the config, reads the data, locks and prepares the run directory, builds the model and
// the optimizer, and starts the run from scratch or from its latest checkpoint.
TrainingRun open_run(const TrainConfig& config, bool resume) {
    TrainingRun run;
    TrainConfig& cfg = run.cfg = config;
    if (!resume) import_model_config(cfg);  // a resumed run's config.json holds the model
    cfg.validate();
    dist::set_timeout(cfg.dist_timeout);
    const int64_t ranks = dist::world_size();
    QK_CHECK(cfg.batch_size % (ranks * cfg.grad_accum) == 0,
             "train: --batch-size {} does not split over {} rank(s) x --grad-accum {}: it must be "
             "a multiple of {} (each rank's micro-batch has batch-size / (ranks * grad-accum) "
             "sequences)",
             cfg.batch_size, ranks, cfg.grad_accum, ranks * cfg.grad_accum);
    if (cfg.data_path.empty()) cfg.data_path = default_data_path();
    run.input = load_training_data(cfg);
    if (run.root && cfg.progress && cfg.modalities.image_fraction > 0)
        fmt::print("{}\n", describe_mix(cfg.modalities, run.input.train_mix));
    NewDirectory made;  // removed again if the run is refused before it starts
    if (run.root) {
        QK_CHECK(!fs::exists(cfg.run_dir) || fs::is_directory(cfg.run_dir),
                 "train: --run-dir '{}' is a file, not a directory", cfg.run_dir);
        made.path = fs::exists(cfg.run_dir) ? "" : cfg.run_dir;
        fs::create_directories(cfg.run_dir);
        run.lock = std::make_unique<RunDirLock>(cfg.run_dir, "train: --run-dir");
        resume = prepare_run_dir(cfg, resume);
    }
    resume = broadcast_string(resume ? "resume" : "start") == "resume";

    if (cfg.init_from.empty())
        cfg.model.vocab_size = run.input.tokenizer.vocab_size();
    else  // the imported embedding keeps its rows; the tokenizer uses the first ones
        QK_CHECK(run.input.tokenizer.vocab_size() <= cfg.model.vocab_size,
                 "train: --tokenizer {} has {} ids, more than the {} of --init-from {}",
                 cfg.tokenizer, run.input.tokenizer.vocab_size(), cfg.model.vocab_size,
                 cfg.init_from);
    const Device device = cfg.device == "cuda" ? Device::cuda : Device::cpu;
    if (device == Device::cuda) set_tf32(cfg.tf32);
    // Initialised on the cpu: the same weights on every device.
    run.model = std::make_unique<GPT>(cfg.model, cfg.seed);
    if (!cfg.init_from.empty() && !resume) import_model_weights(cfg, *run.model);
    run.model->to(device);
    check_replicas_agree(replica_settings(cfg, run.input), run.model->parameters());
    run.optimizer =
        std::make_unique<RunOptimizer>(run.model->named_parameters(), run_optimizer_options(cfg));
    if (run.root && (ranks > 1 || cfg.zero))
        fmt::print("optimizer state: {:.1f} MB on each of {} rank(s){}\n",
                   static_cast<double>(run.optimizer->state_bytes()) / (1 << 20), ranks,
                   cfg.zero ? " (ZeRO-1: AdamW's moments sharded)" : "");
    run.data_gen = Generator(cfg.seed + 1);
    if (cfg.model.precision == Precision::fp16)
        run.scaler.emplace(LossScaleOptions{cfg.loss_scale, cfg.loss_scale_interval});
    // fp8: no loss scale (the per-tensor scales adapt), but a gradient whose E5M2 cast overflowed
    // to Inf skips its step all the same.
    if (cfg.model.precision == Precision::fp8)
        run.scaler.emplace(LossScaleOptions{.init = 1.0, .adjust = false});
    const RunStart begun =
        resume ? resume_run(cfg, *run.model, *run.optimizer, run.data_gen, run.scaler_or_null())
               : start_run(cfg, *run.model, *run.input.dataset);
    run.start_step = begun.step;
    run.result.steps_done = begun.step;  // a resumed run that was already complete says so
    run.result.final_loss = begun.so_far.last_loss;
    run.last_val = begun.so_far.last_val_loss;
    run.min_loss = begun.so_far.min_loss;
    if (run.root) run.metrics.open(cfg.run_dir + "/metrics.jsonl", std::ios::app);
    made.path.clear();  // the run starts: its directory stays
    return run;
}

// One optimisation step: the gradients of the global batch, clipping, the divergence check, the
// update (and QK-Clip), and the step's line of metrics.jsonl, with the validation loss when due.
// Returns false when the step diverged (the run's result says why; the weights are unchanged).
bool train_step(TrainingRun& run, int64_t step) {
    const TrainConfig& cfg = run.cfg;
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = cfg.lr_at(step);
    const bool with_stats = step % cfg.stats_interval() == 0 || step + 1 == cfg.steps;
    std::vector<AttentionStats> stats;  // every step with QK-Clip: it reads S_h from them
    const bool measure = with_stats || cfg.qk_clip > 0;
    const double loss_scale = run.scaler ? run.scaler->scale() : 1.0;
    const ModalityVocab& vocab = run.input.modalities;
    const bool split = with_stats && vocab.text_vocab > 0;  // signals by modality
    ModalitySignals modality;
    const StepGradients grads = accumulate_gradients(
        *run.model, *run.input.dataset, cfg, run.data_gen, *run.optimizer,
        measure ? &stats : nullptr, loss_scale, split ? &modality : nullptr, vocab);
    const double loss = grads.loss;
    const double grad_norm =
        grads.backward_done ? run.optimizer->clip(cfg.grad_clip, loss_scale) : NAN;
    // fp16 (fp8): gradients that overflowed under a finite loss skip the update (and halve the
    // scale).
    const bool skipped =
        run.scaler && std::isfinite(loss) && !run.scaler->update(!std::isfinite(grad_norm));
    if (const std::string why =
            skipped ? "" : divergence(loss, grad_norm, run.min_loss, cfg.diverge_factor);
        !why.empty()) {
        run.result.diverged = true;
        run.result.message = fmt::format("training diverged at step {}: {}; {}", step + 1, why,
                                         kept_checkpoint_note(cfg.run_dir));
        // JSON has no NaN or Inf: such a loss is written as null.
        if (run.root)
            run.metrics << json{{"step", step + 1},
                                {"loss", std::isfinite(loss) ? json(loss) : json()},
                                {"diverged", true},
                                {"reason", why}}
                               .dump()
                        << "\n";
        return false;
    }
    run.min_loss = std::min(run.min_loss, loss);
    // This step's loss was measured on the weights of the pending checkpoint and passed: only
    // now is that checkpoint known to be good (the weights are still unchanged).
    if (run.pending)
        write_checkpoint(cfg, *run.model, *run.optimizer, run.input.tokenizer, *run.pending);
    run.pending.reset();
    if (!skipped) run.optimizer->step(lr);
    run.optimizer->zero_grad();
    const int64_t heads_clipped =
        cfg.qk_clip > 0 && !skipped ? qk_clip(*run.model, stats, cfg.qk_clip) : 0;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.step_seconds_total += seconds;

    json line{{"step", step + 1},
              {"loss", loss},
              {"lr", lr},
              {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json()},
              {"tokens_per_s", run.tokens_per_step() / seconds}};
    if ((step + 1) % cfg.eval_interval() == 0 || step + 1 == cfg.steps) {
        const bool mixed = vocab.text_vocab > 0;
        ModalitySignals val_split;
        run.last_val =
            evaluate(*run.model, *run.input.dataset, cfg, vocab, mixed ? &val_split : nullptr);
        line["val_loss"] = run.last_val;
        line["val_bpb"] = run.input.bits_per_byte(run.last_val);
        if (cfg.eval_protocol == "nanogpt" && step + 1 == cfg.steps) {  // the whole split: once
            run.result.final_val_loss_nanogpt = nanogpt_val_loss(*run.model, *run.input.dataset);
            line["val_loss_nanogpt"] = run.result.final_val_loss_nanogpt;
        }
        if (mixed) line["val_loss_by_modality"] = modality_json(val_split)["loss"];
    }
    if (with_stats) line["layers"] = stats_to_json(stats);
    if (split) line["modality"] = modality_json(modality);
    if (cfg.qk_clip > 0) line["heads_clipped"] = heads_clipped;
    if (cfg.model.precision == Precision::fp8)
        line["fp8_saturated"] = take_fp8_saturation(*run.model);
    if (run.scaler) {
        line["loss_scale"] = loss_scale;
        line["skipped_steps"] = run.scaler->skipped_steps();
        if (skipped) line["skipped"] = true;
    }
    if (run.root) run.metrics << line.dump() << "\n" << std::flush;
    run.result.final_loss = loss;
    run.result.steps_done = step + 1;
    return true;
}

// At a checkpoint step (every --checkpoint-every, and the last): its state goes pending, or, at
// the last step, is written. Returns false when the update or the final validation diverged.
bool checkpoint_if_due(TrainingRun& run, int64_t done) {
    if (done % run.cfg.checkpoint_every != 0 && done != run.cfg.steps) return true;
    run.result.message = checkpoint_after_update(run.cfg, done, run.last_val, run.min_loss,
                                                 *run.model, *run.optimizer, run.input.tokenizer,
                                                 run.data_gen, run.scaler_or_null(), run.pending);
    run.result.diverged = !run.result.message.empty();
    return !run.result.diverged;
}

void report_progress(const TrainingRun& run, int64_t done) {
    if (!run.cfg.progress || !run.root) return;
    const double mean_step = run.step_seconds_total / static_cast<double>(done - run.start_step);
    print_progress(done, run.cfg.steps, run.result.final_loss, run.last_val,
                   run.tokens_per_step() / mean_step,
                   mean_step * static_cast<double>(run.cfg.steps - done));
}

// Ctrl-C or SIGTERM after step `done`: its checkpoint and the plot so far; not finished, so no
// result.json and no sample.
TrainResult stop_with_checkpoint(TrainingRun& run, int64_t done, const StopSignals& signals) {
    if (run.cfg.progress && run.root && progress_on_terminal()) fmt::print(stderr, "\n");
    run.result.stop_signal = signals.signal_number() ? signals.signal_number() : SIGTERM;
    run.result.message =
        checkpoint_on_stop(run.cfg, done, *run.model, *run.optimizer, run.input.tokenizer,
                           run.data_gen, run.scaler_or_null());
    run.result.final_val_loss = run.last_val;
    if (run.root) write_run_plot(run.cfg);
    return run.result;
}

// The end of a run, finished or diverged: the plot, result.json and the sample (rank 0).
TrainResult finish(TrainingRun& run) {
    if (run.cfg.progress && run.root && progress_on_terminal()) fmt::print(stderr, "\n");
    run.result.final_val_loss = run.last_val;
    run.result.final_val_bpb = run.input.bits_per_byte(run.last_val);
    if (!run.root) return run.result;  // the other ranks write nothing
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start_time).count();
    write_run_end(run.cfg, *run.model, run.input.tokenizer, seconds, run.result);
    return run.result;
}

}  // namespace

std::string format_duration(double seconds) {
    const int s = static_cast<int>(seconds);
    return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, s / 60 % 60)
                     : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

TrainResult train(const TrainConfig& config, bool resume, const TrainHooks& hooks) {
    TrainingRun run = open_run(config, resume);  // data, model, optimizer, where the loop starts
    const StopSignals signals;  // Ctrl-C: stop after the step in progress, with a checkpoint
    for (int64_t step = run.start_step; step < run.cfg.steps; ++step) {
        if (hooks.before_step) hooks.before_step(step);
        if (!train_step(run, step)) break;             // diverged: the loss or the gradient
        if (!checkpoint_if_due(run, step + 1)) break;  // diverged: the update or the final val
        report_progress(run, step + 1);
        if (hooks.kill_after > 0 && step + 1 >= hooks.kill_after) return run.result;
        if (stop_asked(signals)) return stop_with_checkpoint(run, step + 1, signals);
    }
    return finish(run);
}

}  // namespace qk::nn
