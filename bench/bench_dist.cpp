// bench_dist: data-parallel training steps under `mpirun -np N`, and how much of the gradient
// averaging backward did not hide.
//
//   mpirun -np 2 --oversubscribe ./build/bench/bench_dist [A|B|all] [bucket MB, default 25]
// (as root, with OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment)
//
// Per config (A: L4 C128 H4 T64, B: L6 C384 H6 T256; float32, the global batch split over the
// ranks) and mode (overlap on, overlap off, ZeRO-1): the step time (forward, backward, averaging,
// clipping, AdamW), the exposed communication (the time spent in GradientSync::finish, waiting
// for sums that backward did not hide, or in ZeRO-1's reduce-scatter, as a share of the step), and
// the gradient bytes each rank sends in per step. Rank 0 prints; times are the max over ranks.
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/distributed.h"
#include "core/threading.h"
#include "nn/model/gpt.h"
#include "nn/optim/data_parallel.h"
#include "nn/optim/optim.h"
#include "nn/optim/zero.h"
#include "qk.h"

using namespace qk;
using clock_type = std::chrono::steady_clock;

namespace {

struct Config {
    const char* name;
    int64_t L, C, H, T, B;
};
constexpr int64_t kVocab = 65;

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct Timing {
    double step = 0, exposed = 0;
};

// Mean over `steps` timed steps (after 2 warm-up steps) of the step and of its exposed wait.
Timing run(const Config& c, const char* mode, int steps, int64_t bucket_bytes) {
    nn::GPTConfig cfg;
    cfg.vocab_size = kVocab, cfg.block_size = c.T, cfg.n_layer = c.L, cfg.n_head = c.H;
    cfg.n_embd = c.C, cfg.qk_norm = nn::QKNorm::layernorm;
    nn::GPT model(cfg, 1);
    const bool zero = std::strcmp(mode, "zero-1") == 0;
    nn::AdamW adamw(model.parameters(), {.lr = 1e-3});
    std::unique_ptr<nn::GradientSync> sync;
    std::unique_ptr<nn::ShardedAdamW> sharded;
    if (zero)
        sharded = std::make_unique<nn::ShardedAdamW>(model.parameters(), nn::AdamWOptions{});
    else
        sync = std::make_unique<nn::GradientSync>(model.parameters(), bucket_bytes,
                                                  std::strcmp(mode, "overlap") == 0);
    const int64_t local_batch = c.B / dist::world_size();
    Generator gen(7 + dist::rank());
    auto random_ids = [&] {
        Tensor t = Tensor::empty({local_batch, c.T}, kI32);
        for (int64_t i = 0; i < t.numel(); ++i)
            t.data<int32_t>()[i] = static_cast<int32_t>(gen.next_block()[0] % kVocab);
        return t;
    };
    const Tensor ids = random_ids(), targets = random_ids();
    Timing total;
    for (int s = 0; s < steps + 2; ++s) {
        const auto t0 = clock_type::now();
        model.forward(ids, targets).loss.backward();
        const auto t_wait = clock_type::now();
        double exposed = 0;
        if (zero) {
            sharded->reduce_gradients();
            exposed = seconds_since(t_wait);
            sharded->clip_grad_norm(1.0);
            sharded->step(1e-3);
            sharded->zero_grad();
        } else {
            sync->finish();
            exposed = sync->last_wait_seconds();
            nn::clip_grad_norm(model.parameters(), 1.0);
            adamw.step(1e-3);
            adamw.zero_grad();
        }
        const double step = seconds_since(t0);
        if (s >= 2) total.step += step, total.exposed += exposed;
    }
    total.step = dist::all_reduce_max(total.step) / steps;
    total.exposed = dist::all_reduce_max(total.exposed) / steps;
    return total;
}

}  // namespace

int main(int argc, char** argv) {
    dist::init();
    const std::vector<Config> configs = {{"A (L4 C128 H4 T64 B16)", 4, 128, 4, 64, 16},
                                         {"B (L6 C384 H6 T256 B8)", 6, 384, 6, 256, 8}};
    const char* only = argc > 1 && std::strcmp(argv[1], "all") != 0 ? argv[1] : nullptr;
    const double bucket_mb = argc > 2 ? std::atof(argv[2]) : 25.0;  // as qknorm's --bucket-mb
    const auto bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
    if (dist::is_root())
        fmt::print(
            "# data-parallel steps, {} ranks x {} thread(s), float32, global batch split over the "
            "ranks, {} MB buckets\n\n| config | mode | ms/step | exposed communication ms | share "
            "of the step "
            "| gradient MB per rank per step |\n|---|---|---:|---:|---:|---:|\n",
            dist::world_size(), num_threads(), bucket_mb);
    for (const Config& c : configs) {
        if (only && c.name[0] != only[0]) continue;
        int64_t bytes = 0;
        {
            nn::GPTConfig cfg;
            cfg.vocab_size = kVocab, cfg.block_size = c.T, cfg.n_layer = c.L, cfg.n_head = c.H;
            cfg.n_embd = c.C;
            nn::GPT model(cfg, 1);
            for (const Tensor& p : model.parameters()) bytes += p.numel() * 4;
        }
        const int steps = c.C >= 384 ? 5 : 20;
        for (const char* mode : {"overlap", "after backward", "zero-1"}) {
            const Timing t = run(c, mode, steps, bucket_bytes);
            if (dist::is_root())
                fmt::print("| {} | {} | {:.1f} | {:.2f} | {:.1f} % | {:.1f} |\n", c.name, mode,
                           1e3 * t.step, 1e3 * t.exposed, 100 * t.exposed / t.step,
                           double(bytes) / (1 << 20));
        }
    }
    if (dist::is_root())
        fmt::print(
            "\nexposed: the time after backward spent finishing the average (GradientSync::finish: "
            "waiting for buckets still in flight, and writing the means back); for ZeRO-1 its "
            "reduce-scatter (its all-gather of the weights runs inside the step, after the "
            "update).\n");
    return 0;
}
