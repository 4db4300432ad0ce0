// The block runner of the CUDA emulation (internal), as seen by the launch code in launch.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/emu/cuda_emu.h"

namespace qk::emu::detail {

// splitmix64: small, seedable, good enough to permute run orders.
struct Rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    template <typename T>
    void shuffle(std::vector<T>& v) {
        for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
    }
};

// Runs one block of the launch on this OS thread, its fibers resumed in the given order; throws
// qk::Error on a deadlock or divergent barrier, and rethrows what a kernel thread threw.
void run_block(const LaunchSpec& spec, uint3 block, RunOrder order, Rng& rng);
// True while this OS thread is running a block.
bool in_kernel();

}  // namespace qk::emu::detail
