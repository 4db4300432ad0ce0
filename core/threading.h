// CPU threading: one thread count, one pool of threads, one way to split work.
//
// Every op that uses more than one core goes through parallel_run / parallel_for below, which run
// on the library's own pool (core/threading.cpp). OpenBLAS stays on the calling thread:
// ops/gemm.cpp splits large GEMMs over the pool itself, so one set of threads serves everything.
//
// Why an own pool and not OpenMP. A training step enters ~190 parallel regions (a GEMM, a norm,
// a softmax, an add each), separated by gaps of a few µs of serial work (the autograd bookkeeping,
// allocations, small ops). libgomp's idle threads either sleep (OMP_WAIT_POLICY=passive: every
// region then pays a futex wake-up and the scheduler's latency, ~400-700 context switches per
// step measured at config A) or spin without a time limit (the default: a spinning thread took the
// core from the one doing the work whenever a third thread wanted it, and a step ran 1.5-2x slower
// than passive). The pool here spins for a measured budget, then sleeps:
//   * a worker that finds no work polls for kSpinBudget (1 ms, see threading.cpp for the
//     measurement) with the pause instruction, which covers the gaps inside a step, and then
//     sleeps on a futex, so an idle pool costs nothing and never holds a core for long;
//   * with more threads than cores the budget is 0: spinning threads on oversubscribed cores is
//     the catastrophic case (each spinner keeps a worker that has work off its core);
//   * the caller runs task 0, then claims tasks alongside the workers; it waits only for tasks a
//     worker has started, never for a worker still asleep or waiting for a core;
//   * when another program holds the cores, the workers barely get to help, and waking them
//     costs more than they bring (2 threads beside one busy process on 2 cores: 0.43x the speed
//     of 1 thread): the pool notices (core/help_meter.h) and runs jobs on the caller alone until
//     cores are free again.
// A job is a fixed list of tasks, whoever runs them: maps (parallel_for) cut [0, n) into chunks;
// sums (parallel_run with a fixed split) add per-task partials in task order. Results are
// identical run to run at a given thread count, busy machine or not; a different count may split
// a sum differently.
//
// Every thread computing runs with flush-to-zero and denormals-are-zero: denormal values (in
// Adam's second moment, for one) made a cpu training run ~10x slower.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace qk {

// More threads than this is a typo, not a request: each thread takes a stack, and 100,000 of them
// once overflowed the process's memory.
constexpr int kMaxThreads = 1024;

void init_threads();          // idempotent; called by the library's static initialiser
void set_num_threads(int n);  // n in [1, kMaxThreads], else qk::Error
// A thread count written as text (QK_NUM_THREADS, --threads): a whole number in [1, kMaxThreads],
// else qk::Error naming `origin` and the text.
int parse_thread_count(const std::string& text, const std::string& origin);
int num_threads();
int available_cores();        // the cores this process may run on (its affinity mask)
void enable_flush_to_zero();  // for the calling thread

// A borrowed callable `void(int thread)`: what the pool runs, without a std::function allocation.
class ThreadTask {
  public:
    template <class F>
    ThreadTask(F& f)  // NOLINT: implicit, so that callers pass a lambda
        : object_(&f), call_([](void* o, int t) { (*static_cast<F*>(o))(t); }) {}
    void operator()(int t) const { call_(object_, t); }

  private:
    void* object_;
    void (*call_)(void*, int);
};

// Runs task(t) once for each t = 0 … tasks-1, on up to num_threads() threads: the calling thread
// runs task 0, and it and the pool's workers then claim the next task until none is left. Returns
// when every one has returned (the first exception thrown by any of them is rethrown here). Which
// thread runs which task changes from run to run: task t must depend on t alone. Called from inside
// a task, or while another thread of the program holds the pool, the tasks run one after another
// on the calling thread: same results, no waiting.
void parallel_run(int tasks, ThreadTask task);

// What the pool told its help meter (core/help_meter.h) of the last job its workers were woken
// for: the job's tasks and how many the calling thread ran, its own task 0 included. Zero tasks
// when the last parallel_run woke no worker (serial, or the workers resting). For tests: the
// meter's judgement of whether the workers help rests on this count.
struct JobShare {
    int tasks = 0, by_caller = 0;
};
JobShare last_job_share();

// Puts the pool's idle workers to sleep now rather than at the end of their spin budget: for a
// program about to hand the cores to other threads (another library's, a child process's).
void park_threads();

// True inside a task of parallel_run (where a nested parallel_run would run serially).
bool in_parallel_region();

// body(begin, end) on contiguous ranges that together cover [0, n), each once: [0, n) is cut into
// kChunksPerThread equal chunks per thread, claimed in turn, so that a thread that the kernel
// preempted leaves its chunks to the others instead of holding every thread up. Use it for maps,
// where each element's result depends on nothing else, and parallel_run with a fixed split for
// sums. With parallel == false, or one thread, body(0, n) runs on the caller. Callers pass
// `parallel` as "the work is worth a wake-up" (a size threshold).
constexpr int kChunksPerThread = 4;
template <class Body>
void parallel_for(int64_t n, Body&& body, bool parallel = true) {
    const int threads = parallel ? static_cast<int>(std::min<int64_t>(num_threads(), n)) : 1;
    if (threads <= 1 || in_parallel_region()) {
        if (n > 0) body(int64_t{0}, n);
        return;
    }
    const int64_t chunks = std::min<int64_t>(n, int64_t{threads} * kChunksPerThread);
    auto chunk = [&](int c) { body(n * c / chunks, n * (c + 1) / chunks); };
    parallel_run(static_cast<int>(chunks), chunk);
}

}  // namespace qk
