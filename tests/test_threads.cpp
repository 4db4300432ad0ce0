// The thread pool (core/threading.h): what parallel_run promises, the corner cases a pool gets
// wrong (exceptions, nesting, a second caller, fork, a count change), and the stress test: the
// model's training step at 1 … 8 threads on this machine's cores, oversubscribed past them.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/help_meter.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"

using namespace qk;
using namespace qk::test;

TEST_CASE("parallel_run runs every task once, the caller as task 0") {
    for (int n : {1, 2, 3, 8}) {
        ThreadCount threads(n);
        for (int tasks : {1, n, 3 * n + 1}) {  // fewer tasks than threads, as many, more
            std::vector<std::atomic<int>> runs(tasks);
            std::vector<std::thread::id> who(tasks);
            auto task = [&](int t) {
                runs[t]++;
                who[t] = std::this_thread::get_id();
            };
            for (int repeat = 0; repeat < 100; ++repeat) parallel_run(tasks, task);
            for (int t = 0; t < tasks; ++t) CHECK(runs[t] == 100);
            CHECK(who[0] == std::this_thread::get_id());
        }
    }
}

TEST_CASE("parallel_run shares a job with the workers") {
    ThreadCount threads(2);
    // Task 0 (the caller's) waits until task 1 has run elsewhere: a pool whose workers never
    // joined would time out here. Up to 10 s, for a loaded machine.
    std::atomic<bool> second_ran{false};
    std::thread::id second_thread;
    auto task = [&](int t) {
        if (t == 1) {
            second_thread = std::this_thread::get_id();
            second_ran = true;
            return;
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!second_ran && std::chrono::steady_clock::now() < deadline)
            std::this_thread::yield();
    };
    parallel_run(2, task);
    CHECK(second_ran);
    CHECK(second_thread != std::this_thread::get_id());
}

namespace {
bool never_free(int) { return false; }
using MeterClock = HelpMeter::Clock;
using std::chrono::milliseconds;
// One window of 2-task jobs on 2 threads, in which the worker ran one task of each, or none.
void window(HelpMeter& meter, MeterClock::time_point now, bool worker_helped) {
    for (int job = 0; job < HelpMeter::kWindowJobs; ++job)
        meter.record(/*tasks=*/2, /*by_caller=*/worker_helped ? 1 : 2, /*threads=*/2, now);
}
}  // namespace

TEST_CASE("the pool rests its workers while they cannot help, longer while that lasts") {
    MeterClock::time_point t = MeterClock::time_point{} + std::chrono::hours(1);
    HelpMeter meter(never_free);
    window(meter, t, true);
    CHECK(!meter.workers_resting(t, 2));
    window(meter, t, false);  // one window alone: a page fault, a thread starting
    CHECK(!meter.workers_resting(t, 2));
    window(meter, t, false);  // two: a neighbour holds the cores
    CHECK(meter.workers_resting(t + milliseconds(1), 2));
    CHECK(meter.workers_resting(t + milliseconds(499), 2));
    t += milliseconds(500);
    CHECK(!meter.workers_resting(t, 2));          // the first spell is over
    for (int spell : {1000, 2000, 4000, 4000}) {  // the neighbour stays: each spell doubles
        window(meter, t, false);                  // one window after a spell is enough
        CHECK(meter.workers_resting(t + milliseconds(spell - 1), 2));
        CHECK(!meter.workers_resting(t + milliseconds(spell), 2));
        t += milliseconds(spell);
    }
    window(meter, t, true);  // it left: back to sharing, and the next spell is short again
    window(meter, t, false);
    CHECK(!meter.workers_resting(t, 2));
    window(meter, t, false);
    CHECK(!meter.workers_resting(t + milliseconds(500), 2));
}

// Free cores for exactly one worker: the pool of 2 threads needs that many (the caller has its
// own core already), so asking for one more would keep the workers resting.
int cores_asked_for = -1;
bool one_core_free(int workers) {
    cores_asked_for = workers;
    return workers <= 1;
}

TEST_CASE("a resting pool wakes its workers as soon as the system has cores free for them") {
    const MeterClock::time_point t = MeterClock::time_point{} + std::chrono::hours(1);
    HelpMeter meter(one_core_free);
    window(meter, t, false);
    window(meter, t, false);
    CHECK(!meter.workers_resting(t + milliseconds(1), 2));
    CHECK(cores_asked_for == 1);  // the workers' cores, not one more for the caller
}

TEST_CASE("the pool tells its meter every task the caller ran, its own task 0 included") {
    const int threads_before = num_threads();
    set_num_threads(2);
    const std::thread::id caller = std::this_thread::get_id();
    // A resting pool (this machine busy) wakes no worker and records nothing: try for a while.
    JobShare share;
    int counted = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (share.tasks == 0 && std::chrono::steady_clock::now() < deadline) {
        std::atomic<int> by_caller{0};
        auto task = [&](int) {
            if (std::this_thread::get_id() == caller) ++by_caller;
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        };
        parallel_run(8, task);
        share = last_job_share(), counted = by_caller;
        if (share.tasks == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    set_num_threads(threads_before);
    REQUIRE(share.tasks == 8);
    CHECK(share.by_caller == counted);
    CHECK(counted >= 1);
}

TEST_CASE("jobs of one task, which a worker cannot share, never send the workers to rest") {
    const MeterClock::time_point t = MeterClock::time_point{} + std::chrono::hours(1);
    HelpMeter meter(never_free);
    for (int job = 0; job < 10 * HelpMeter::kWindowJobs; ++job) meter.record(1, 1, 2, t);
    CHECK(!meter.workers_resting(t, 2));
}

TEST_CASE("parallel_for covers [0, n) once, in contiguous chunks") {
    ThreadCount threads(3);
    for (int64_t n : {0, 1, 2, 3, 10, 1000}) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        std::atomic<int> calls{0};
        parallel_for(n, [&](int64_t begin, int64_t end) {
            CHECK(begin < end);
            for (int64_t i = begin; i < end; ++i) hits[i]++;
            calls++;
        });
        for (int h : hits) CHECK(h == 1);
        CHECK(calls == std::min<int64_t>(n, 3 * kChunksPerThread));
    }
}

TEST_CASE("a task's exception reaches the caller, and the pool goes on working") {
    ThreadCount threads(2);
    auto failing = [](int t) {
        if (t == 1) throw Error("task 1 failed");
    };
    CHECK(throws_with([&] { parallel_run(2, failing); }, {"task 1 failed"}));
    std::atomic<int> runs{0};
    auto counting = [&](int) { runs++; };
    parallel_run(2, counting);
    CHECK(runs == 2);
}

TEST_CASE("a parallel_run inside a task runs serially on that thread") {
    ThreadCount threads(2);
    std::atomic<int> inner{0};
    auto outer = [&](int) {
        CHECK(in_parallel_region());
        const auto me = std::this_thread::get_id();
        auto nested = [&](int) {
            CHECK(std::this_thread::get_id() == me);
            inner++;
        };
        parallel_run(2, nested);
    };
    parallel_run(2, outer);
    CHECK(inner == 4);
    CHECK(!in_parallel_region());
}

TEST_CASE("set_num_threads inside a task is refused") {
    ThreadCount threads(2);
    auto task = [](int t) {
        if (t == 0) set_num_threads(1);
    };
    CHECK(throws_with([&] { parallel_run(2, task); }, {"inside a parallel task"}));
}

TEST_CASE("two program threads may use the library at once") {
    ThreadCount threads(2);
    Generator gen(3);
    const Tensor a = randn({256, 256}, kF32, gen), b = randn({256, 256}, kF32, gen);
    const Tensor expected = matmul(a, b);
    std::atomic<int> mismatches{0};
    auto user = [&] {
        for (int i = 0; i < 20; ++i)
            if (max_abs_diff(matmul(a, b), expected) > 1e-4) mismatches++;
    };
    std::thread first(user), second(user);
    first.join();
    second.join();
    CHECK(mismatches == 0);
}

TEST_CASE("a forked child builds its own pool") {
    ThreadCount threads(2);
    Generator gen(4);
    const Tensor x = randn({512, 512}, kF32, gen);
    const double expected = sum(x * x).item();  // the parent's pool is running now
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the parent's workers are not here: a pool that waited for them hangs
        const double got = sum(x * x).item();
        _exit(std::abs(got - expected) <= 1e-3 * std::abs(expected) ? 0 : 1);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (waitpid(child, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
            FAIL("the forked child hung in the thread pool");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("random tensors do not depend on the thread count") {
    // rand and randn draw in order from one generator: they must stay serial (a parallel fill
    // once reordered the draws at 2 threads, and a model's initial weights changed with it).
    Tensor one, two;
    {
        ThreadCount threads(1);
        Generator gen(5);
        one = randn({1 << 18}, kF32, gen);
    }
    {
        ThreadCount threads(2);
        Generator gen(5);
        two = randn({1 << 18}, kF32, gen);
    }
    CHECK(max_abs_diff(one, two) == 0);
}

namespace {

// A model just big enough that its ops use the pool (rows × width over the thresholds).
struct StepResult {
    double loss = 0, grad_norm = 0, seconds = 1e30;
};

StepResult train_steps(int threads, int steps) {
    ThreadCount count(threads);
    nn::GPTConfig cfg;
    cfg.vocab_size = 65, cfg.block_size = 64, cfg.n_layer = 2, cfg.n_head = 4, cfg.n_embd = 128;
    cfg.qk_norm = nn::QKNorm::layernorm;
    nn::GPT model(cfg, /*seed=*/1);
    nn::AdamW opt(model.parameters(), nn::AdamWOptions{.lr = 1e-3});
    Generator gen(7);
    Tensor ids = Tensor::empty({8, 64}, kI32), targets = Tensor::empty({8, 64}, kI32);
    for (Tensor* t : {&ids, &targets})
        for (int64_t i = 0; i < t->numel(); ++i)
            t->data<int32_t>()[i] = static_cast<int32_t>(gen.next_block()[0] % 65);
    StepResult r;
    for (int s = 0; s < steps; ++s) {
        const auto start = std::chrono::steady_clock::now();
        nn::GPTOutput out = model.forward(ids, targets);
        out.loss.backward();
        r.grad_norm = nn::clip_grad_norm(model.parameters(), 1.0);
        opt.step(1e-3);
        opt.zero_grad();
        r.loss = out.cross_entropy.item();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        r.seconds = std::min(r.seconds, seconds);
    }
    return r;
}

}  // namespace

TEST_CASE("stress: the training step at 1 to 8 threads, oversubscribed past the cores") {
    const int cores = std::min(available_cores(), 8);
    train_steps(cores, 2);  // warm-up: the allocator's free lists, first-touch page faults
    const StepResult reference = train_steps(1, 5);
    std::vector<double> best(9);  // best step time per thread count
    for (int n = 1; n <= 8; ++n) {
        CAPTURE(n);
        const StepResult first = train_steps(n, 5), again = train_steps(n, 5);
        // Identical run to run at one thread count; across counts, only the split of row sums
        // and GEMMs differs (the last bits, grown over 5 steps).
        CHECK(first.loss == again.loss);
        CHECK(first.grad_norm == again.grad_norm);
        CHECK(std::abs(first.loss - reference.loss) < 1e-5);
        CHECK(std::abs(first.grad_norm - reference.grad_norm) < 1e-4 * reference.grad_norm);
        best[n] = std::min(first.seconds, again.seconds);
    }
    // More threads than cores must not fall off a cliff (spinning threads on oversubscribed
    // cores did, 3-20x): each count within 2x of the step at the core count, timed back to back
    // (best of 5 steps each). The cores are shared with other machines' work, which can slow any
    // one measurement: a slowdown counts only when it shows in each of 3 tries.
    for (int n = cores; n <= 8; ++n) {
        double ratio = 1e30;
        for (int attempt = 0; attempt < 3 && ratio >= 2; ++attempt) {
            const double at_cores = train_steps(cores, 5).seconds;
            const double at_n = std::min(best[n], train_steps(n, 5).seconds);
            ratio = std::min(ratio, at_n / at_cores);
        }
        MESSAGE(n << " threads: " << ratio << "x the step time at " << cores << " threads");
        CHECK(ratio < 2);
    }
}
