// The CUDA backend's runtime: error checking, the caching device allocator, the stream and the
// cuBLAS handle, and host <-> device copies. Kernel files (cuda/<family>.cu) include this header.
//
// The same sources build three ways (meson options `cuda` and `emulate_cuda`, docs/cuda.md):
//   real CUDA   .cu by nvcc, runtime.cpp by g++ with QK_CUDA_REAL, linked with cudart and cuBLAS;
//   emulation   .cu and runtime.cpp by g++ against cuda/emu (kernels run on the cpu as fibers);
//   none        cuda/stub.cpp only: every cuda entry point throws "built without CUDA support".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/emu/cublas_compat.h"
#include "cuda/emu/cuda_compat.h"

namespace qk::cuda {

// Turns a failed CUDA or cuBLAS call into a qk::Error naming the call, the file and the line.
void check(cudaError_t status, const char* call, const char* file, int line);
void check(cublasStatus_t status, const char* call, const char* file, int line);

#define QK_CUDA_CHECK(call) ::qk::cuda::check((call), #call, __FILE__, __LINE__)
// After a launch: a bad configuration shows up here, a fault in the kernel at the next sync.
#define QK_CUDA_CHECK_LAUNCH(kernel_name) \
    ::qk::cuda::check(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)

// The one stream every kernel and copy of the backend runs on (the default stream), and the
// cuBLAS handle bound to it, created on first use.
cudaStream_t stream();
cublasHandle_t blas();

// Whether kernels can run here: a real device is present, or this is the emulation build.
bool device_available();
// "cuda (<device name>)" or "cuda emulation on the cpu".
const char* backend_description();
// The most dynamic shared memory a block may ask for once raised (227 KB on an H100, 163 KB on an
// A100), from device 0.
std::size_t max_shared_memory_per_block();

// Contiguous byte copies; dst and src as the names say. Synchronous: they return when done.
void copy_to_device(void* device_dst, const void* host_src, std::size_t nbytes);
void copy_to_host(void* host_dst, const void* device_src, std::size_t nbytes);
void copy_on_device(void* device_dst, const void* device_src, std::size_t nbytes);
void fill_zero(void* device_dst, std::size_t nbytes);
// At least n counters, zero, for kernels whose last block finishes a reduction (arrived_last in
// cuda/warp_reduce.h): each launch leaves its counters zero again, so one array serves every
// launch on the stream. Grown when asked for more; kept for the process's life.
unsigned* tile_counters(int64_t n);
void synchronize();

// The caching allocator's state: bytes handed out, bytes kept for reuse, cudaMalloc calls.
struct AllocatorStats {
    std::size_t live_bytes = 0, cached_bytes = 0, device_mallocs = 0;
};
AllocatorStats allocator_stats();
void empty_cache();  // cudaFree everything cached (not what is live)

// Launch geometry helpers: enough blocks of `threads` to cover n items (at least 1).
inline unsigned blocks_for(int64_t n, unsigned threads) {
    return static_cast<unsigned>(n <= 0 ? 1 : (n + threads - 1) / threads);
}

// How the two-stage kernels (column sums, split reductions, norm gradients, attention's scale
// pass) cut n items into pieces: enough for about kFillBlocks blocks in all when `tiles` blocks
// share each piece, none under min_piece items, at least one. The count depends on the shape
// only, never on the GPU, so results are the same bits everywhere.
inline constexpr int64_t kFillBlocks = 1056;  // 8 blocks on each of an H100's 132 SMs
struct Pieces {
    int64_t size, count;
};
inline Pieces pieces_for(int64_t n, int64_t tiles, int64_t min_piece) {
    const int64_t wanted = std::max<int64_t>(1, (kFillBlocks + tiles - 1) / tiles);
    const int64_t count = std::min(wanted, std::max<int64_t>(1, n / min_piece));
    const int64_t size = std::max<int64_t>(1, (n + count - 1) / count);
    return {size, std::max<int64_t>(1, (n + size - 1) / size)};
}

}  // namespace qk::cuda
