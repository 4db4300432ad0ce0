// The thread pool behind parallel_run (the design and its reasons are in core/threading.h).
//
// One job at a time: the caller publishes the task, bumps `generation` and runs its own share;
// each worker sees the bump, runs its share (or nothing, when the job uses fewer threads), and
// counts `pending` down; the caller returns when `pending` reaches 0. Waiting on either counter
// is spin_then_sleep(): poll with `pause` for the spin budget, then sleep in the kernel
// (std::atomic::wait, a futex on Linux), woken by notify only when somebody sleeps.
//
// The spin budget, measured with bench_train at 2 threads on the 2-core machine (QK_SPIN_US sets
// it for such a measurement; means over the timed steps, from getrusage):
//    budget       config A (L4 C128 T64 B16)               config B (L6 C384 T256 B8)
//                 ms/step  switches/step (voluntary)       ms/step  switches/step (voluntary)
//    0 (sleep)    47-53    370-410 (365-405)               890-910  540-580 (510-545)
//    200 µs       37-38    5-6 (1-4)                       850-870  56-80 (27-50)
//    1 ms         38-40    2 (0)                           890-910  35 (4-5)
//    2 ms         -        -                               865-880  32-41 (3)
// A step's gaps between parallel jobs are shorter than ~100 µs once the serial stretches are gone
// (a bias fill, a bias-gradient sum and the gradient-norm sum each were 0.2-1 ms on one thread:
// ops/gemm.cpp, ops/reduce.cpp and nn/optim/optim.cpp now split them too); the voluntary switches
// left at 200 µs are waits for a worker that the kernel preempted. The ~30 involuntary switches per
// config-B step are those preemptions: with both cores busy, every other runnable task (kernel
// threads included) must take one of ours for a while; with one thread, a B step sees ~4.
// bench_train measures that floor with two threads that only compute: 32-35 per second, 25-27 in
// a B step's time, so the pool's own share of a B step is 1-3. 1 ms it is: an idle pool gives its
// cores back 1 ms after the last job.
#include "core/threading.h"

#include <cblas.h>
#include <pmmintrin.h>
#include <sched.h>
#include <xmmintrin.h>

#include <malloc.h>
#include <pthread.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/help_meter.h"

namespace qk {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::microseconds kSpinBudget{1000};

thread_local bool inside_task = false;  // on the pool's workers always, on a caller during a job

// Polls ready() with the pause instruction (which tells the core, and a hyperthread sibling, that
// this is a wait loop) until it is true or the budget has passed; the clock is read every 64 polls.
template <class Ready>
void spin_until(Ready ready, std::chrono::nanoseconds budget) {
    if (ready() || budget.count() <= 0) return;
    const auto deadline = Clock::now() + budget;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            _mm_pause();
            if (ready()) return;
        }
        if (Clock::now() >= deadline) return;
    }
}

// Returns once done(word) holds: polls with spin_until for the spin budget (cut short when `park`
// is set), then sleeps in word.wait(), woken by the writer's notify. Workers wait for the
// generation to move on; the caller waits for `pending` to reach 0.
template <class Done>
void spin_then_sleep(const std::atomic<uint32_t>& word, Done done, std::chrono::nanoseconds spin,
                     const std::atomic<bool>* park = nullptr) {
    auto value = [&] { return word.load(std::memory_order_acquire); };
    spin_until([&] { return done(value()) || (park && park->load(std::memory_order_relaxed)); },
               spin);
    for (uint32_t v; !done(v = value());) word.wait(v, std::memory_order_acquire);
}

// QK_THREAD_LIMIT=N refuses thread N + 1 (the caller is thread 1) as the system refuses one
// (std::system_error, EAGAIN): the test of that path. A real refusal by `ulimit -v` also starves
// OpenBLAS, whose buffer allocation then retries forever, so the suite cannot provoke it that way.
int injected_thread_limit() {
    const char* env = std::getenv("QK_THREAD_LIMIT");
    return env ? parse_thread_count(env, "QK_THREAD_LIMIT") : kMaxThreads;
}

class Pool {
  public:
    // A system that refuses a thread (ulimit -u, ulimit -v against the stacks) leaves the pool
    // with the workers it did start, and a notice: never std::terminate on a joinable thread.
    Pool(int threads, std::chrono::nanoseconds spin) : spin_(spin) {
        const int limit = injected_thread_limit();
        try {
            for (int w = 1; w < threads; ++w) {
                if (w >= limit)
                    throw std::system_error(
                        std::make_error_code(std::errc::resource_unavailable_try_again),
                        "QK_THREAD_LIMIT");
                workers_.emplace_back([this] { work(); });
            }
        } catch (const std::system_error& e) {
            // the caller is thread 1, worker w is thread w + 1
            fmt::print(stderr, "qk: the system refused thread {} of {} ({}): running on {}\n",
                       workers_.size() + 2, threads, e.what(), workers_.size() + 1);
        }
        threads_ = static_cast<int>(workers_.size()) + 1;
    }
    ~Pool() {
        stopping_ = true;
        publish();
        for (std::thread& w : workers_) w.join();
    }
    int threads() const { return threads_; }
    JobShare last_share() const { return last_share_; }

    void park() { park_.store(true, std::memory_order_relaxed); }

    void run(int tasks, const ThreadTask& task) {
        task_ = &task;
        tasks_ = tasks;
        const Clock::time_point start = Clock::now();
        last_share_ = {};
        if (meter_.workers_resting(start, threads_)) {
            next_task_.store(0, std::memory_order_relaxed);
            run_tasks();
        } else {
            const int by_caller = run_with_workers();
            meter_.record(tasks, by_caller, threads_, start);
            last_share_ = {tasks, by_caller};
        }
        task_ = nullptr;
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

  private:
    static constexpr uint32_t kClosed = 1u << 31;  // in inside_, above the count of workers

    // The job's fields are written before this release and read after the workers' acquire.
    void publish() {
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();  // a system call only when a worker sleeps
    }
    void run_task(int t) {
        try {
            (*task_)(t);
        } catch (...) {
            const std::lock_guard<std::mutex> lock(error_mutex_);
            if (!error_) error_ = std::current_exception();
        }
    }
    // Publishes the job, runs task 0 and claims more alongside the workers; returns how many tasks
    // the caller ran.
    int run_with_workers() {
        park_.store(false, std::memory_order_relaxed);
        next_task_.store(1, std::memory_order_relaxed);  // task 0 is the caller's
        inside_.store(0, std::memory_order_release);     // open: a worker that joins sees the above
        publish();
        run_task(0);
        const int by_caller = 1 + run_tasks();
        // Close the job to latecomers, then wait only for the workers inside it: a worker still
        // asleep, or waiting for a core, joins nothing and is not waited for.
        inside_.fetch_or(kClosed, std::memory_order_acq_rel);
        spin_then_sleep(
            inside_, [](uint32_t s) { return s == kClosed; }, spin_);
        return by_caller;
    }
    // Claims and runs the job's next task until none is left; returns how many it ran.
    int run_tasks() {
        int ran = 0;
        for (int t; (t = next_task_.fetch_add(1, std::memory_order_relaxed)) < tasks_; ++ran)
            run_task(t);
        return ran;
    }
    // A worker enters the current job unless the caller has closed it.
    bool join() {
        uint32_t s = inside_.load(std::memory_order_acquire);
        while (!(s & kClosed))
            if (inside_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return true;
        return false;
    }
    void leave() {
        if (inside_.fetch_sub(1, std::memory_order_acq_rel) == (kClosed | 1)) inside_.notify_one();
    }
    void work() {
        enable_flush_to_zero();
        inside_task = true;  // a worker's own parallel_run calls run serially
        uint32_t seen = 0;
        for (;;) {
            spin_then_sleep(
                generation_, [seen](uint32_t g) { return g != seen; }, spin_, &park_);
            seen = generation_.load(std::memory_order_acquire);
            if (stopping_) return;
            if (!join()) continue;  // that job is over: wait for the next
            run_tasks();
            leave();
        }
    }

    HelpMeter meter_;
    JobShare last_share_;  // written and read under pool_mutex
    int threads_ = 1;      // the workers that started, and the calling thread
    const std::chrono::nanoseconds spin_;
    std::vector<std::thread> workers_;
    std::atomic<uint32_t> generation_{0};    // one increment per job
    std::atomic<uint32_t> inside_{kClosed};  // workers inside the current job, | kClosed
    std::atomic<int> next_task_{0};          // the next task to claim
    std::atomic<bool> park_{false};          // idle workers: sleep now, do not spin
    const ThreadTask* task_ = nullptr;
    int tasks_ = 0;
    bool stopping_ = false;
    std::mutex error_mutex_;
    std::exception_ptr error_;
};

int current_threads = 1;
// Held by the thread running a job, and by set_num_threads. A second program thread that finds it
// taken runs its task serially instead of waiting.
std::mutex pool_mutex;
// Built on the first parallel job and rebuilt when the count changes. Never destroyed at exit:
// its workers sleep in the kernel and end with the process.
Pool* pool = nullptr;

// Spinning on more threads than cores keeps threads that have work off the cores: no spinning
// then. QK_SPIN_US overrides the budget, for measuring it (threading.cpp's header).
constexpr int64_t kMaxSpinMicroseconds = 1'000'000;  // a second of spinning: more is no budget

std::chrono::nanoseconds spin_budget(int threads) {
    if (threads > available_cores()) return {};
    if (const char* env = std::getenv("QK_SPIN_US")) {
        // Bounded before the conversion to nanoseconds, which would overflow near INT64_MAX.
        int64_t us = -1;
        const char* end = env + std::strlen(env);
        const auto [ptr, ec] = std::from_chars(env, end, us);
        QK_CHECK(ec == std::errc() && ptr == end && us >= 0 && us <= kMaxSpinMicroseconds,
                 "QK_SPIN_US: the spin budget must be a whole number of microseconds in [0, {}], "
                 "got '{}'",
                 kMaxSpinMicroseconds, env);
        return std::chrono::microseconds(us);
    }
    return kSpinBudget;
}

}  // namespace

bool idle_cores_for(int workers) {
    std::FILE* file = std::fopen("/proc/loadavg", "r");
    if (!file) return false;
    int runnable = 0;  // "0.52 0.58 0.59 2/345 12345": the 4th field's first number
    const bool read = std::fscanf(file, "%*f %*f %*f %d", &runnable) == 1;
    std::fclose(file);
    return read && runnable + workers <= available_cores();
}

void enable_flush_to_zero() {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

bool in_parallel_region() { return inside_task; }

JobShare last_job_share() {
    const std::lock_guard<std::mutex> lock(pool_mutex);
    return pool ? pool->last_share() : JobShare{};
}

void park_threads() {
    const std::lock_guard<std::mutex> lock(pool_mutex);
    if (pool) pool->park();
}

void parallel_run(int tasks, ThreadTask task) {
    if (tasks <= 0) return;
    std::unique_lock<std::mutex> lock(pool_mutex, std::defer_lock);
    if (tasks == 1 || current_threads == 1 || inside_task || !lock.try_lock()) {
        for (int t = 0; t < tasks; ++t) task(t);
        return;
    }
    if (!pool || pool->threads() != current_threads) {
        const std::chrono::nanoseconds spin = spin_budget(current_threads);  // may throw
        delete pool;
        pool = nullptr;
        pool = new Pool(current_threads, spin);
        current_threads = pool->threads();  // fewer, if the system refused some
    }
    inside_task = true;
    struct Leave {
        ~Leave() { inside_task = false; }
    } leave;
    pool->run(tasks, task);
}

void set_num_threads(int n) {
    QK_CHECK(n >= 1 && n <= kMaxThreads,
             "set_num_threads: the thread count must be in [1, {}], got {}", kMaxThreads, n);
    QK_CHECK(!inside_task, "set_num_threads({}): called from inside a parallel task", n);
    const std::lock_guard<std::mutex> lock(pool_mutex);
    current_threads = n;  // the pool follows at the next parallel job
    // OpenBLAS stays on the calling thread: ops/gemm.cpp splits large GEMMs over our pool.
    openblas_set_num_threads(1);
}

int num_threads() { return current_threads; }

int parse_thread_count(const std::string& text, const std::string& origin) {
    int n = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, n);
    QK_CHECK(ec == std::errc() && ptr == end && n >= 1 && n <= kMaxThreads,
             "{}: the thread count must be a whole number in [1, {}], got '{}'", origin,
             kMaxThreads, text);
    return n;
}

int available_cores() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return std::max(CPU_COUNT(&set), 1);
}

void init_threads() {
    static bool done = false;
    if (done) return;
    done = true;
    // This runs before main, where an exception would abort the program: a bad QK_NUM_THREADS is
    // reported and replaced by the default here, and programs that take a thread count (qknorm)
    // parse the variable again themselves to refuse it.
    int n = std::min(available_cores(), kMaxThreads);
    if (const char* env = std::getenv("QK_NUM_THREADS")) {
        try {
            n = parse_thread_count(env, "QK_NUM_THREADS");
        } catch (const Error& e) {
            std::fprintf(stderr, "qk: %s; using %d\n", e.what(), n);
        }
    }
    set_num_threads(n);
    // A forked child has only the thread that forked: the parent's workers are not there. The
    // child forgets the pool (leaking it: its threads cannot be joined) and builds its own.
    pthread_atfork(nullptr, nullptr, [] { pool = nullptr; });
}

namespace {
// Runs at library load, so that every program gets the policy without asking for it.
struct ThreadingInit {
    ThreadingInit() {
        // glibc serves blocks over 32 MB with fresh mmap()s and unmaps them on free; each new page
        // then faults on first touch (~6 µs here), which made a 50 MB fill 40x slower than into a
        // reused buffer. Keep large blocks in the heap so activations of one step reuse the last's.
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        enable_flush_to_zero();
        init_threads();
    }
} threading_init;
}  // namespace

}  // namespace qk
