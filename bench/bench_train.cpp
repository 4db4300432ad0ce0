// bench_train: one GPT training step (forward, backward, clip, AdamW), against raw sgemm.
//
//   QK_NUM_THREADS=1 ./build/bench/bench_train     (then QK_NUM_THREADS=2)
//   ./build/bench/bench_train A        only config A (quick);  B: only config B; S: only S
// S is the speedrun preset's step (examples/presets/speedrun.toml: RoPE, T 256, batch 4).
//   perf record -g ./build/bench/bench_train B profile [layernorm]   steps only, for a profiler
//
// The step is the trainer's (nn/train/trainer.cpp): forward with targets, loss.backward(),
// clip_grad_norm(1.0), AdamW step, zero_grad, on random int32 ids and targets.
//
// Model FLOPs per step (the PaLM/nanoGPT count: 2 per multiply-add forward, 4 backward):
//   B·T · (6 · (12·L·C² + V·C) + 12·L·T·C)
// 12·L·C² are the Linear weights, V·C the tied LM head, 12·L·T·C the attention's q·kᵀ and A·v
// (forward + backward) at full T×T; the causal half is not discounted. Norms, softmax, gelu and
// AdamW are not counted: they are the "non-GEMM" time that this benchmark exposes.
//
// The reference is raw cblas_sgemm in the same run and with the same thread count: the three
// GEMMs of one Linear layer's training step at the MLP up-projection's shape, x·Wᵀ (N,T),
// dY·W (N,N) and xᵀ·dY (T,N) with x: (B·T, C), W: (4C, C), and their FLOPs over their total time,
// timed alternately with the step (best of each; see time_pairs). A step at fraction 1.0 would
// run every model FLOP as fast as the best-case big GEMM. A bf16 step is held to the same three
// GEMMs in bf16 (RawBf16Gemm, the library's bf16 GEMM), the rate its Linear layers can reach.
//
// Memory: live cpu Storage bytes (core/storage.h counts them), sampled around the step: at the
// start (parameters + AdamW moments), after the forward (+ the activations the graph saved), and
// the peak during the step (+ gradients and backward temporaries). RSS is the process's high-water.
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "ops/gemm.h"
#include "qk.h"

using namespace qk;

namespace {

struct Config {
    const char* name;
    int64_t L, C, H, T, B;
    bool rope = false;  // RoPE instead of learned positions (no wpe)
};
constexpr int64_t kVocab = 65;

double model_flops(const Config& c) {
    const double BT = double(c.B * c.T), L = double(c.L), C = double(c.C), T = double(c.T);
    return BT * (6 * (12 * L * C * C + double(kVocab) * C) + 12 * L * T * C);
}

// The operands of a Linear C -> 4C training step's three GEMMs on B·T tokens, owned here: x, W and
// dY in the GEMMs' input type, y, dx and dW float32.
template <class In>
struct LinearGemmOperands {
    explicit LinearGemmOperands(const Config& c)
        : M(c.B * c.T),
          K(c.C),
          N(4 * c.C),
          x(M * K, In(0.5f)),
          w(N * K, In(0.25f)),
          dy(M * N, In(0.125f)),
          y(M * N),
          dx(M * K),
          dw(K * N) {}
    double flops() const { return 3 * 2.0 * double(M) * double(N) * double(K); }

    int64_t M, K, N;
    std::vector<In> x, w, dy;
    std::vector<float> y, dx, dw;
};

// The three GEMMs as raw cblas_sgemm on OpenBLAS's threads.
class RawSgemm : public LinearGemmOperands<float> {
  public:
    using LinearGemmOperands::LinearGemmOperands;
    void operator()() { run(num_threads()); }
    void run(int threads) {
        bench::RawBlasThreads blas_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, w.data(),
                    K, 0.0f, y.data(), N);  // y = x·Wᵀ
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy.data(), N,
                    w.data(), K, 0.0f, dx.data(), K);  // dx = dY·W
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1.0f, x.data(), K, dy.data(),
                    N, 0.0f, dw.data(), N);  // dWᵀ = xᵀ·dY
    }
};

// The bf16 twin, the reference of a bf16 step: the same three products on bf16 operands with
// float32 sums, through the library's bf16 GEMM (ops/gemm.h: oneDNN on a CPU with AVX-512 BF16)
// on its threads, as the bf16 Linear layers run them.
class RawBf16Gemm : public LinearGemmOperands<bf16> {
  public:
    using LinearGemmOperands::LinearGemmOperands;
    void operator()() {
        using Job = cpu::GemmJob<bf16, float>;
        cpu::gemm(Job{y.data(), N, x.data(), {false, K}, w.data(), {true, K}, M, N, K});  // x·Wᵀ
        cpu::gemm(Job{dx.data(), K, dy.data(), {false, N}, w.data(), {false, K}, M, K, N});  // dY·W
        cpu::gemm(Job{dw.data(), N, x.data(), {true, K}, dy.data(), {false, N}, K, N, M});  // xᵀ·dY
    }
};

// Best (minimum) seconds of raw() and of step() over calls alternated pair by pair, the order
// flipped each pair (as bench_matmul does). The cores are shared: a neighbour only ever adds
// time, so the minimum is the steadiest estimate, and both calls see the same neighbours.
// Each call is timed twice: wall clock, and CPU time of the process (with one thread, the time
// the step actually ran, which excludes the time a neighbour held the core).
// Per step, also the means of what waiting costs the process: context switches (voluntary:
// a thread went to sleep; involuntary: it was preempted), and CPU-seconds, which count every
// thread, spinning or working.
struct Timing {
    double raw_s = 1e30, step_s = 1e30;          // wall clock
    double raw_cpu_s = 1e30, step_cpu_s = 1e30;  // process CPU time
    double step_switches = 0, step_voluntary = 0, step_cpu_total = 0;
    int steps = 0;
};
struct Switches {
    long voluntary, involuntary;  // went to sleep / was preempted
};
Switches context_switches() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);  // every thread of the process
    return {usage.ru_nvcsw, usage.ru_nivcsw};
}
double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
template <class Fn>
void time_one(Fn& fn, double& best_wall, double& best_cpu) {
    using clock = std::chrono::steady_clock;
    const double c0 = cpu_seconds();
    const auto t0 = clock::now();
    fn();
    best_wall = std::min(best_wall, std::chrono::duration<double>(clock::now() - t0).count());
    best_cpu = std::min(best_cpu, cpu_seconds() - c0);
}
template <class Step>
void time_step(Step& step, Timing& t) {
    const Switches before = context_switches();
    const double cpu = cpu_seconds();
    time_one(step, t.step_s, t.step_cpu_s);
    t.step_cpu_total += cpu_seconds() - cpu;
    const Switches after = context_switches();
    t.step_voluntary += double(after.voluntary - before.voluntary);
    t.step_switches +=
        double(after.voluntary - before.voluntary) + double(after.involuntary - before.involuntary);
    ++t.steps;
}
template <class Raw, class Step>
Timing time_pairs(Raw& raw, Step& step, double min_seconds, int min_pairs) {
    using clock = std::chrono::steady_clock;
    raw();  // warm-up: first-touch page faults, OpenBLAS's buffers, the allocator's free lists
    step();
    Timing t;
    const auto start = clock::now();
    for (int pairs = 0; pairs < min_pairs ||
                        std::chrono::duration<double>(clock::now() - start).count() < min_seconds;
         ++pairs) {
        if (pairs % 2 == 0) {
            time_one(raw, t.raw_s, t.raw_cpu_s);
            time_step(step, t);
        } else {
            time_step(step, t);
            time_one(raw, t.raw_s, t.raw_cpu_s);
        }
        if (pairs >= 200) break;
    }
    return t;
}

// The machine's preemption floor: `threads` plain threads (not the pool) that only compute, for
// `seconds`, and the involuntary context switches per second the process suffers meanwhile. A
// process that keeps every core busy is preempted whenever anything else on the machine wakes up
// (kernel threads, daemons, the shell that started it): those switches are the floor, and a step's
// switches above floor × step time are the ones its own waiting causes.
double preemption_floor_per_s(int threads, double seconds) {
    using clock = std::chrono::steady_clock;
    const auto end = clock::now() + std::chrono::duration<double>(seconds);
    auto compute = [end] {
        volatile double x = 1.0;
        while (clock::now() < end)
            for (int i = 0; i < 100000; ++i) x = x * 0.9999999 + 1e-7;
    };
    park_threads();  // the pool's workers asleep: only these threads run
    const Switches before = context_switches();
    std::vector<std::thread> others;
    for (int t = 1; t < threads; ++t) others.emplace_back(compute);
    compute();
    for (std::thread& t : others) t.join();
    const Switches after = context_switches();
    return double(after.involuntary - before.involuntary) / seconds;
}

// Raw sgemm with every thread ÷ with one (best of alternated calls): ~1.9-2x when the cores are
// the process's own. The host may share them for minutes at a time (another tenant, or two
// virtual cores on one physical core): then 2-thread sgemm drops to ~1.2x of one thread, a step
// (less bound by the FMA units) drops less, and every fraction of that run reads too high.
double raw_sgemm_scaling(const Config& c) {
    RawSgemm raw(c);
    auto all_threads = [&] { raw.run(num_threads()); };
    auto one_thread = [&] { raw.run(1); };
    double all = 1e30, one = 1e30, cpu_unused = 1e30;
    one_thread();  // warm-up
    for (int i = 0; i < 20; ++i) {
        time_one(all_threads, all, cpu_unused);
        time_one(one_thread, one, cpu_unused);
    }
    return one / all;
}

struct Result {
    std::string config, variant, precision;
    double ms, tokens_per_s, gflops, raw_gflops, cpu_fraction;
    double switches_per_step, voluntary_per_step, floor_per_step, cpu_s_per_step;
    double param_mb, adam_mb, saved_mb, peak_mb, rss_mb;
    double first_loss;  // of the first step: ~ln V at initialisation, a sanity check
};

// QK_BENCH_ATTENTION=naive measures the unfused attention path; fused (the default) otherwise.
bool fused_attention() {
    const char* path = std::getenv("QK_BENCH_ATTENTION");
    return !(path && std::string(path) == "naive");
}

// QK_BENCH_PRECISION=fp32 (the default), bf16, fp16 (mixed precision) or fp8 (simulated), a
// comma-separated list of them ("fp32,fp16"), both (fp32,bf16) or all: each config and variant at
// each precision, one after the other in the same run, and the step-time ratios against fp32.
std::vector<Precision> precisions() {
    const char* p = std::getenv("QK_BENCH_PRECISION");
    std::string which = p ? p : "fp32";
    if (which == "both") which = "fp32,bf16";
    if (which == "all") which = "fp32,bf16,fp16,fp8";
    std::vector<Precision> out;
    for (size_t start = 0; start <= which.size();) {
        const size_t comma = std::min(which.find(',', start), which.size());
        out.push_back(nn::parse_precision(which.substr(start, comma - start)));
        start = comma + 1;
    }
    return out;
}

double mb(std::size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

double rss_high_water_mb() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return double(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

Result bench_one(const Config& c, nn::QKNorm variant, Precision precision, bool profile) {
    nn::GPTConfig cfg;
    cfg.precision = precision;
    cfg.vocab_size = kVocab;
    cfg.block_size = c.T;
    cfg.n_layer = c.L;
    cfg.n_head = c.H;
    cfg.n_embd = c.C;
    cfg.qk_norm = variant;
    cfg.qk_norm_scope = nn::NormScope::head;
    cfg.fused_attention = fused_attention();
    if (c.rope) cfg.pos_emb = nn::PosEmb::rope;

    const std::size_t before_model = live_storage_bytes();
    nn::GPT model(cfg, /*seed=*/1);
    const std::size_t param_bytes = live_storage_bytes() - before_model;
    nn::AdamW opt(model.parameters(), nn::AdamWOptions{.lr = 1e-3});
    const std::size_t adam_bytes = live_storage_bytes() - before_model - param_bytes;

    Generator gen(7);
    auto random_ids = [&] {
        Tensor t = Tensor::empty({c.B, c.T}, kI32);
        int32_t* p = t.data<int32_t>();
        for (int64_t i = 0; i < t.numel(); ++i)
            p[i] = static_cast<int32_t>(gen.next_block()[0] % kVocab);
        return t;
    };
    const Tensor ids = random_ids(), targets = random_ids();

    double first_loss = 0;
    int steps = 0;
    std::size_t start_bytes = 0, after_forward = 0, peak = 0;
    auto step = [&] {
        start_bytes = live_storage_bytes();
        reset_peak_storage_bytes();
        nn::GPTOutput out = model.forward(ids, targets);
        after_forward = live_storage_bytes();
        out.loss.backward();
        nn::clip_grad_norm(model.parameters(), 1.0);
        opt.step(1e-3);
        opt.zero_grad();
        if (steps++ == 0) first_loss = out.cross_entropy.item();
        peak = peak_storage_bytes();
    };
    if (profile) {  // a few plain steps for a sampling profiler; no table
        for (int i = 0, n = c.C >= 256 ? 6 : 60; i < n; ++i) step();
        return {};
    }
    // The reference: raw sgemm, or for a bf16 step the raw bf16 GEMM.
    const bool big = c.C >= 256;
    RawSgemm raw_sgemm(c);
    RawBf16Gemm raw_bf16(c);
    const bool bf16_reference = precision == Precision::bf16;
    const Timing t = bf16_reference ? time_pairs(raw_bf16, step, big ? 10.0 : 3.0, big ? 4 : 15)
                                    : time_pairs(raw_sgemm, step, big ? 10.0 : 3.0, big ? 4 : 15);
    const double raw_flops = bf16_reference ? raw_bf16.flops() : raw_sgemm.flops();
    const double seconds = t.step_s;
    const double flops = model_flops(c);
    return {c.name,
            nn::to_string(variant),
            nn::to_string(precision),
            seconds * 1e3,
            double(c.B * c.T) / seconds,
            flops / seconds / 1e9,
            raw_flops / t.raw_s / 1e9,
            (flops / t.step_cpu_s) / (raw_flops / t.raw_cpu_s),
            t.step_switches / t.steps,
            t.step_voluntary / t.steps,
            0.0,  // filled in by main, from the floor measured once per run
            t.step_cpu_total / t.steps,
            mb(param_bytes),
            mb(adam_bytes),
            mb(after_forward - start_bytes),
            mb(peak),
            rss_high_water_mb(),
            first_loss};
}

void print_table(const std::vector<Result>& rows) {
    fmt::print(
        "\n| config | qk_norm | precision | ms/step | tokens/s | model GFLOP/s | raw GEMM GFLOP/s "
        "| fraction "
        "| fraction by CPU time | context switches per step (voluntary) | preemption floor per "
        "step "
        "| CPU s per step "
        "| params MB | AdamW MB | saved activations MB | peak live MB | RSS high-water MB |\n");
    fmt::print(
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Result& r : rows)
        fmt::print(
            "| {} | {} | {} | {:.1f} | {:.0f} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.0f} "
            "({:.0f}) | {:.0f} | "
            "{:.3f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f} |\n",
            r.config, r.variant, r.precision, r.ms, r.tokens_per_s, r.gflops, r.raw_gflops,
            r.gflops / r.raw_gflops, r.cpu_fraction, r.switches_per_step, r.voluntary_per_step,
            r.floor_per_step, r.cpu_s_per_step, r.param_mb, r.adam_mb, r.saved_mb, r.peak_mb,
            r.rss_mb);
}

}  // namespace

int main(int argc, char** argv) {
    bench::quiet_openblas_threads(argv);
    const std::string only = argc > 1 ? argv[1] : "";
    const bool profile = argc > 2 && std::string(argv[2]) == "profile";
    const std::string profile_variant = argc > 3 ? argv[3] : "none";
    const Config configs[] = {{"A (L4 C128 H4 T64 B16)", 4, 128, 4, 64, 16},
                              {"B (L6 C384 H6 T256 B8)", 6, 384, 6, 256, 8},
                              {"S (L4 C192 H6 T256 B4 RoPE)", 4, 192, 6, 256, 4, true}};
    fmt::print(
        "# GPT training step, float32 weights, V = {}, {} thread(s) (QK_NUM_THREADS), {} "
        "attention (QK_BENCH_ATTENTION), precision "
        "QK_BENCH_PRECISION=fp32|bf16|fp16|fp8|both|all\n",
        kVocab, num_threads(), fused_attention() ? "fused" : "naive");
    fmt::print(
        "raw sgemm: x·Wᵀ, dY·W, xᵀ·dY of a Linear C -> 4C on B·T tokens ((B·T, C)·(C, 4C) "
        "and its two backward GEMMs), same thread count\n");
    for (const Config& c : configs)
        fmt::print("model GFLOP per step, {}: {:.2f}\n", c.name, model_flops(c) / 1e9);
    if (num_threads() > 1 && !profile)
        fmt::print(
            "raw sgemm, {} threads ÷ 1 thread: {:.2f}x (well under {} means the host shared "
            "the cores during this run, and the fractions below read high)\n",
            num_threads(), raw_sgemm_scaling(configs[0]), std::min(num_threads(), 2) * 0.9);
    std::vector<Result> rows;
    for (const Config& c : configs) {
        if (!only.empty() && c.name[0] != only[0]) continue;
        for (nn::QKNorm v : {nn::QKNorm::none, nn::QKNorm::layernorm})
            for (Precision precision : precisions()) {
                if (profile && nn::to_string(v) != profile_variant) continue;
                rows.push_back(bench_one(c, v, precision, profile));
                if (profile) return 0;
                fmt::print(stderr,
                           "{} {} {}: {:.1f} ms/step, first-step loss {:.3f} (ln {} = {:.3f})\n",
                           c.name, nn::to_string(v), nn::to_string(precision), rows.back().ms,
                           rows.back().first_loss, kVocab, std::log(double(kVocab)));
            }
    }
    if (!rows.empty()) {
        const double floor_per_s = preemption_floor_per_s(num_threads(), 3.0);
        for (Result& r : rows) r.floor_per_step = floor_per_s * r.ms * 1e-3;
        fmt::print(
            "preemption floor: {:.1f} involuntary context switches per second with {} "
            "thread(s) that only compute\n",
            floor_per_s, num_threads());
    }
    print_table(rows);
    for (const Result& fp32 : rows)
        for (const Result& r : rows)
            if (fp32.precision == "fp32" && r.precision != "fp32" && r.config == fp32.config &&
                r.variant == fp32.variant)
                fmt::print("{} {}: step time fp32 / {} = {:.2f}x\n", r.config, r.variant,
                           r.precision, fp32.ms / r.ms);
    fmt::print(
        "\nfraction: model GFLOP/s / raw GEMM GFLOP/s (sgemm; for bf16 rows the bf16 GEMM), both "
        "wall clock (best of alternated "
        "calls); by CPU time: the same with process CPU time (one thread: the time the step "
        "really ran; two threads: CPU-seconds, which also counts waiting threads). Context "
        "switches and CPU s per step: means over the timed steps, from getrusage and the "
        "process CPU clock (every thread). Preemption floor per step: the involuntary switches "
        "that as many threads doing nothing but arithmetic suffer in the step's time (the rest "
        "of the machine waking up); the step's own waiting causes the switches above it.\n"
        "params: weights (float32); AdamW: m and v; saved activations: live bytes after the "
        "forward minus at the step's start (what the graph keeps for backward); peak live: "
        "all live Storage bytes at the step's peak (params + AdamW + activations + gradients + "
        "temporaries); RSS: the process's high-water mark so far.\n");
    return 0;
}
