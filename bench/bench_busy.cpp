// bench_busy: the default model's training step with 1 and 2 threads, on quiet cores and next to
// a busy neighbour (another process that computes without pause, as a laptop's browser or a
// second training run does).
//
//   ./build/bench/bench_busy            (about a minute)
//   ./build/bench/bench_busy 4 5        rounds (default 6), seconds per condition and round (2)
//
// The neighbour is a child process spinning on one core, started and killed around each timed
// stretch; it is left to the scheduler (not pinned), as a user's other program would be. With
// it, the machine has one core's worth of time to spare for us on top of the core we share:
// two threads can at best reach (2 - 1/2) / 1 = 1.5x one core of a shared pair, and one thread
// has a whole core to itself while the neighbour has the other. The figure that matters is
// "2 threads ÷ 1 thread" in each condition, all measured in the same run, conditions interleaved
// round by round so that drift of the host's speed hits them alike.
//
// The step is bench_train's (forward with targets, backward, clip, AdamW, zero_grad) on the
// default model of `qknorm train` (examples/qknorm.cpp): L4 C192 H6 T64, batch 16, QK-LayerNorm
// with RoPE, bf16 mixed precision. Mean time per step, not the best: a neighbour costs time at
// random moments, and the mean is what a run's length sees.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "qk.h"

using namespace qk;

namespace {

constexpr int64_t kVocab = 65, kBatch = 16, kContext = 64;

nn::GPTConfig default_model() {
    nn::GPTConfig cfg;
    cfg.vocab_size = kVocab;
    cfg.block_size = kContext;
    cfg.n_layer = 4;
    cfg.n_head = 6;
    cfg.n_embd = 192;
    cfg.qk_norm = nn::QKNorm::layernorm;
    cfg.pos_emb = nn::PosEmb::rope;
    cfg.precision = Precision::bf16;
    return cfg;
}

// A process that only computes, until killed.
class BusyNeighbour {
  public:
    BusyNeighbour() : pid_(fork()) {
        if (pid_ == 0) {
            volatile uint64_t x = 1;
            for (;;) x = x * 6364136223846793005ULL + 1;
        }
        if (pid_ < 0) throw Error("bench_busy: fork failed");
    }
    ~BusyNeighbour() {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    BusyNeighbour(const BusyNeighbour&) = delete;
    BusyNeighbour& operator=(const BusyNeighbour&) = delete;

  private:
    pid_t pid_;
};

struct Condition {
    int threads;
    bool busy;
    double seconds = 0;  // total timed
    int64_t steps = 0;
    double ms() const { return 1e3 * seconds / double(steps); }
};

}  // namespace

int main(int argc, char** argv) {
    bench::quiet_openblas_threads(argv);
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 6;
    const double seconds_per_stretch = argc > 2 ? std::atof(argv[2]) : 2.0;
    nn::GPT model(default_model(), /*seed=*/1);
    nn::AdamW opt(model.parameters(), nn::AdamWOptions{.lr = 1e-3});
    Generator gen(7);
    auto random_ids = [&] {
        Tensor t = Tensor::empty({kBatch, kContext}, kI32);
        for (int64_t i = 0; i < t.numel(); ++i)
            t.data<int32_t>()[i] = static_cast<int32_t>(gen.next_block()[0] % kVocab);
        return t;
    };
    const Tensor ids = random_ids(), targets = random_ids();
    auto step = [&] {
        nn::GPTOutput out = model.forward(ids, targets);
        out.loss.backward();
        nn::clip_grad_norm(model.parameters(), 1.0);
        opt.step(1e-3);
        opt.zero_grad();
    };
    std::vector<Condition> conditions{{1, false}, {2, false}, {1, true}, {2, true}};
    fmt::print(
        "# bench_busy: default model (L4 C192 H6 T64 B16, QK-LayerNorm, RoPE, bf16), {} cores, "
        "{} rounds of {:.0f} s per condition\n",
        available_cores(), rounds, seconds_per_stretch);
    using clock = std::chrono::steady_clock;
    for (int round = 0; round < rounds; ++round) {
        for (Condition& c : conditions) {
            set_num_threads(c.threads);
            std::unique_ptr<BusyNeighbour> neighbour;
            if (c.busy) neighbour = std::make_unique<BusyNeighbour>();
            for (int i = 0; i < 3; ++i) step();  // warm-up: the pool, the allocator, the caches
            const auto start = clock::now();
            double elapsed = 0;
            do {
                step();
                ++c.steps;
                elapsed = std::chrono::duration<double>(clock::now() - start).count();
            } while (elapsed < seconds_per_stretch);
            c.seconds += elapsed;
        }
        fmt::print(stderr, "round {}/{}\n", round + 1, rounds);
    }
    fmt::print("\n| neighbour | ms/step, 1 thread | ms/step, 2 threads | 2 threads ÷ 1 thread |\n");
    fmt::print("|---|---:|---:|---:|\n");
    for (int i = 0; i < 4; i += 2)
        fmt::print("| {} | {:.1f} | {:.1f} | {:.2f}x faster |\n",
                   conditions[i].busy ? "one busy process" : "none (quiet)", conditions[i].ms(),
                   conditions[i + 1].ms(), conditions[i].ms() / conditions[i + 1].ms());
    fmt::print(
        "\nMean time per step over every timed step of a condition; conditions interleaved round "
        "by round. Busy: a child process computing without pause, not pinned.\n");
    return 0;
}
