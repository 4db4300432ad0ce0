// A plain benchmark harness: time a function, and the references every figure is quoted against.
//
// Figures are ratios against a reference measured in the same run (raw cblas_sgemm GFLOP/s, or
// a memcpy of the same bytes), because this machine's absolute speed drifts with its neighbours.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include <cblas.h>
#include <fmt/format.h>
#include <unistd.h>

#include "core/storage.h"
#include "core/threading.h"

namespace qk::bench {

// The raw-sgemm reference runs OpenBLAS with its own threads, as many as ours, while it lives:
// the library keeps OpenBLAS on one thread and splits GEMMs itself (ops/gemm.cpp), so the
// reference is what OpenBLAS does alone with the same number of threads.
// The pool's idle workers are put to sleep first (park_threads), so that they do not spin on the
// cores OpenBLAS's threads are about to use.
struct RawBlasThreads {
    explicit RawBlasThreads(int threads = num_threads()) {
        park_threads();
        openblas_set_num_threads(threads);
    }
    ~RawBlasThreads() { openblas_set_num_threads(1); }
};

// OpenBLAS's idle threads spin, calling sched_yield, for 2^28 cycles (~0.1 s) after each call
// before they sleep, and a benchmark that alternates raw sgemm with our own threaded code would
// measure that code next to a busy neighbour. OPENBLAS_THREAD_TIMEOUT=4 (2^4 cycles: sleep at
// once) fixes it, but OpenBLAS reads it when it loads: the benchmark sets it and starts itself
// again. Call first thing in main.
inline void quiet_openblas_threads(char** argv) {
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT")) return;
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    execv("/proc/self/exe", argv);
    std::perror("execv /proc/self/exe");  // only on failure: go on with the busy neighbour
}

// Median seconds per call of fn over repeats of at least `min_seconds` in total (after one
// warm-up call). The median resists the other tenant of the physical core.
inline double time_median(const std::function<void()>& fn, double min_seconds = 0.3,
                          int min_repeats = 5) {
    using clock = std::chrono::steady_clock;
    fn();
    std::vector<double> samples;
    const auto start = clock::now();
    while (samples.size() < static_cast<size_t>(min_repeats) ||
           std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
        const auto t0 = clock::now();
        fn();
        samples.push_back(std::chrono::duration<double>(clock::now() - t0).count());
        if (samples.size() >= 1000) break;
    }
    std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
    return samples[samples.size() / 2];
}

// GB/s of memcpy moving `bytes` (read + write counted once each: 2 * bytes moved).
inline double memcpy_gbps(size_t bytes) {
    Storage src(bytes, Device::cpu), dst(bytes, Device::cpu);
    std::memset(src.data(), 1, bytes);
    std::memset(dst.data(), 0, bytes);
    double s = time_median([&] { std::memcpy(dst.data(), src.data(), bytes); });
    return 2.0 * bytes / s / 1e9;
}

// Thread t's share [begin, end) of n items split over `threads`.
inline std::pair<size_t, size_t> slice_of(size_t n, int t, int threads) {
    return {n * size_t(t) / size_t(threads), n * size_t(t + 1) / size_t(threads)};
}

// The fastest of five parallel_run(threads, task) calls, in seconds (STREAM reports the best).
template <class Task>
double best_parallel_seconds(int threads, Task& task) {
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        parallel_run(threads, task);
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

// GB/s of a STREAM-style copy of `bytes` with the library's threads, each copying its own slice
// (read + write counted: 2 * bytes moved); best of a few runs, as STREAM reports. Arrays far
// larger than the caches (256 MB each by default) measure main memory.
inline double stream_copy_gbps(size_t bytes = size_t{256} << 20) {
    Storage src(bytes, Device::cpu), dst(bytes, Device::cpu);
    char *from = static_cast<char*>(src.data()), *to = static_cast<char*>(dst.data());
    const int threads = num_threads();
    auto touch = [&](int t) {  // each slice first touched by the thread that copies it
        const auto [begin, end] = slice_of(bytes, t, threads);
        std::memset(from + begin, 1, end - begin);
        std::memset(to + begin, 0, end - begin);
    };
    auto copy = [&](int t) {
        const auto [begin, end] = slice_of(bytes, t, threads);
        std::memcpy(to + begin, from + begin, end - begin);
    };
    parallel_run(threads, touch);
    return 2.0 * double(bytes) / best_parallel_seconds(threads, copy) / 1e9;
}

// GB/s of reading `bytes` once with the library's threads (each its own slice, summed as
// integers so that the loop vectorises without reordering float sums), best of a few runs: what
// a decode step does with its weights. One core reads more slowly than it copies (a copy's
// writes go out in parallel with its reads), so at one thread this is the tighter bound.
inline double stream_read_gbps(size_t bytes = size_t{256} << 20) {
    const size_t words = bytes / 8;
    Storage src(words * 8, Device::cpu);
    uint64_t* data = static_cast<uint64_t*>(src.data());
    const int threads = num_threads();
    // A cache line apart, and volatile: a sum nobody reads could otherwise be optimised away.
    std::vector<uint64_t> sums(size_t(threads) * 8, 0);
    auto touch = [&](int t) {
        const auto [begin, end] = slice_of(words, t, threads);
        std::fill(data + begin, data + end, uint64_t(t));
    };
    auto read = [&](int t) {
        const auto [begin, end] = slice_of(words, t, threads);
        uint64_t sum = 0;
        for (size_t i = begin; i < end; ++i) sum += data[i];
        static_cast<volatile uint64_t&>(sums[size_t(t) * 8]) = sum;
    };
    parallel_run(threads, touch);
    return double(words * 8) / best_parallel_seconds(threads, read) / 1e9;
}

}  // namespace qk::bench
