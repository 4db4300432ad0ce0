// Cost of the CUDA emulation (cuda/emu): nanoseconds per emulated thread, per __syncthreads per
// thread, and per warp shuffle per thread. Build: part of the default build (bench_emu);
// run: build/bench_emu. Figures are medians of several runs.
#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "cuda/emu/cuda_compat.h"

namespace {

__global__ void empty_kernel(float* p) {
    if (threadIdx.x == 100000) p[0] = 1.0f;  // never: keeps the argument used
}

__global__ void barrier_kernel(float* p, int barriers) {
    float v = threadIdx.x;
    for (int b = 0; b < barriers; ++b) {
        v += 1.0f;
        __syncthreads();
    }
    if (v < 0) p[0] = v;
}

__global__ void shuffle_kernel(float* p, int rounds) {
    float v = threadIdx.x;
    for (int r = 0; r < rounds; ++r) v += __shfl_xor_sync(0xffffffffu, v, r & 31);
    if (v < 0) p[0] = v;
}

template <typename F>
double median_seconds(F f, int repeats = 7) {
    f();  // warm-up: maps the fiber stacks
    std::vector<double> s;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    return s[s.size() / 2];
}

}  // namespace

int main() {
    float* p = nullptr;
    if (cudaMalloc(&p, sizeof(float)) != cudaSuccess) return 1;
    const int blocks = 64, rounds = 64;
    fmt::print("{:>8} {:>14} {:>20} {:>20}\n", "threads", "ns/thread", "ns/barrier/thread",
               "ns/shuffle/thread");
    for (int threads : {32, 128, 256, 1024}) {
        const double total = double(blocks) * threads;
        const double t0 =
            median_seconds([&] { QK_LAUNCH(empty_kernel, blocks, threads, 0, nullptr, p); });
        const double tb = median_seconds(
            [&] { QK_LAUNCH(barrier_kernel, blocks, threads, 0, nullptr, p, rounds); });
        const double ts = median_seconds(
            [&] { QK_LAUNCH(shuffle_kernel, blocks, threads, 0, nullptr, p, rounds); });
        fmt::print("{:>8} {:>14.1f} {:>20.1f} {:>20.1f}\n", threads, t0 / total * 1e9,
                   (tb - t0) / (total * rounds) * 1e9, (ts - t0) / (total * rounds) * 1e9);
    }
    cudaFree(p);
    return 0;
}
