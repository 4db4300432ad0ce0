// Host entry points of the CUDA emulation's self-test kernels (tests/emu_selftest_kernels.cpp):
// each copies its inputs to the device, launches, and copies the results back.
#pragma once

#include <string>
#include <vector>

#include "cuda/emu/cuda_compat.h"

namespace emu_selftest {

// Six numbers per thread, in launch order (block-major): threadIdx.xyz, blockIdx.xyz; then four
// more at the end of the vector from block (0,0,0) thread (0,0,0): blockDim.x*y*z, gridDim.xyz.
std::vector<unsigned> index_map(dim3 grid, dim3 block);

// Per-block sums of x by a shared-memory tree reduction (64 threads per block); with_barriers
// false drops the __syncthreads calls (a planted bug).
std::vector<float> block_sums(const std::vector<float>& x, bool with_barriers);

// Per-warp sums of x (96 threads per block, ragged n fine): by __shfl_down_sync from lane 0,
// or by __shfl_xor_sync into every lane (then one value per thread).
std::vector<float> warp_sums_down(const std::vector<float>& x);
std::vector<float> warp_sums_xor(const std::vector<float>& x);
// Per-thread: inclusive prefix sum within the warp (__shfl_up_sync), the value of lane 3
// (__shfl_sync), the sum over groups of 8 lanes (xor with width 8), and the ballot of x > 0.
struct WarpMisc {
    std::vector<float> scan, broadcast, group8;
    std::vector<unsigned> ballot;
};
WarpMisc warp_misc(const std::vector<float>& x);

// Dynamic shared memory of n floats in one block of n threads: `before` is what each thread read
// before writing, `reversed` is x reversed through shared memory.
void dynamic_smem(const std::vector<float>& x, std::vector<float>& before,
                  std::vector<float>& reversed);

// Sums by atomicAdd from every thread of many blocks.
float atomic_sum(const std::vector<float>& x);
int atomic_count(int blocks, int threads);
int atomic_max(const std::vector<int>& x);

// Planted bugs and misuse, each expected to be reported.
void write_one_past_end(int n);       // `i <= n` instead of `i < n`
void pass_host_pointer(int n);        // a std::vector's data() as a kernel argument
void pass_freed_pointer(int n);       // a pointer after cudaFree
void syncthreads_in_branch();         // __syncthreads inside if (threadIdx.x < 16)
void syncthreads_at_two_sites();      // the two halves at different __syncthreads
void shuffle_with_exited_lanes();     // lanes 0-15 return, the rest shuffle with a full mask
void syncwarp_against_syncthreads();  // lane 0 at __syncwarp, the others at __syncthreads
void throw_inside_kernel();           // thread 5 throws while the others wait at a barrier
void launch_too_many_threads();       // a block of 2048 threads
void dynamic_smem_overflow();         // one float past the dynamic shared memory

// One launch of `blocks` x `threads` trivial threads, each passing `barriers` __syncthreads.
void cost_probe(int blocks, int threads, int barriers);

}  // namespace emu_selftest
