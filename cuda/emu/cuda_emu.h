// CUDA on the CPU: the emulation header that stands in for <cuda_runtime.h> when a .cu source is
// compiled by g++ (include it through cuda/emu/cuda_compat.h, never directly).
//
// Each CUDA thread of a block runs as a fiber; all fibers of a block share one OS thread and the
// blocks of a grid run one after another, so a kernel sees real block semantics: __syncthreads is
// a counting barrier, shuffles are a rendezvous of the lanes in the mask, and the order in which
// ready fibers are resumed can be forward, reverse or seeded random (qk::emu::set_run_order, or
// QK_EMU_ORDER=forward|reverse|random[:seed]), so a missing barrier changes the result. Device
// memory lives in an arena with red zones; misuse is reported as qk::Error with messages that
// start "cuda emulation: ". See cuda/emu/README.md for the whole picture and what it cannot catch.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
// __restrict__ is a g++ keyword already. __noinline__ is left alone: libstdc++ spells
// __attribute__((__noinline__)), which a macro of that name would break.

// Static shared memory: `__shared__ float tile[32][33];` inside a kernel becomes a function-local
// static thread_local. That is one array per OS thread, shared by all fibers of the block running
// there; it is correct because a block's fibers all run on one OS thread and the blocks given to
// one OS thread run one after another. Unlike dynamic shared memory it is not reset between blocks.
#define __shared__ static thread_local

// ---- vector types ----------------------------------------------------------------------------
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

inline constexpr int warpSize = 32;

// ---- runtime API types -------------------------------------------------------------------------
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct cudaDeviceProp {
    char name[256];
    std::size_t totalGlobalMem;
    std::size_t sharedMemPerBlock;
    std::size_t sharedMemPerBlockOptin;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int maxThreadsPerMultiProcessor;
    int multiProcessorCount;
    int major;
    int minor;
    int clockRate;
    std::size_t totalConstMem;
    int l2CacheSize;
};

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaMalloc(void** dev_ptr, std::size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** dev_ptr, std::size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(dev_ptr), bytes);
}
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dev_ptr, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, std::size_t bytes,
                            cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
// Raises the dynamic shared memory a launch may ask for above the default 48 KiB. The emulator
// keeps one limit for all kernels (the largest ever set), so it is looser than the real per-kernel
// opt-in.
cudaError_t cuda_emu_set_max_dynamic_smem(cudaFuncAttribute attr, int value);
template <typename F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute attr, int value) {
    return cuda_emu_set_max_dynamic_smem(attr, value);
}

// ---- the emulator's own API ---------------------------------------------------------------------
namespace qk::emu {

// The order in which a block's ready fibers are resumed, and the order of the blocks.
enum class RunOrder { forward, reverse, random };
void set_run_order(RunOrder order, uint64_t seed = 0);
RunOrder run_order();
uint64_t run_order_seed();
// OS threads that run blocks (default 1; QK_EMU_WORKERS=n). A block's fibers always share one.
void set_workers(int workers);
int workers();

// Bytes and number of cudaMalloc allocations not yet freed (for leak checks in tests).
std::size_t live_device_bytes();
std::size_t live_device_allocations();
// The detailed message behind the last error code a runtime call returned on this thread.
std::string last_error_message();
// True when p lies inside a live cudaMalloc allocation.
bool is_device_pointer(const void* p);

namespace detail {

// Where a sync call sits in the kernel source, for reports.
struct Site {
    const char* file;
    int line;
    const char* what;  // "__syncthreads", "__shfl_down_sync", ...
};

// What a fiber sees as threadIdx/blockIdx/blockDim/gridDim; the scheduler keeps it current.
struct ThreadState {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
// initial-exec: a plain %fs-relative access even from PIC code (no __tls_get_addr per use).
#define QK_EMU_TLS __attribute__((tls_model("initial-exec")))
extern QK_EMU_TLS thread_local constinit ThreadState tl_state;

enum class WarpOp { sync, idx, up, down, bfly, ballot, any, all, collective };

void sync_threads(Site site);
int sync_threads_count(Site site, int predicate);
void sync_warp(Site site, unsigned mask = 0xffffffffu);
// The rendezvous behind shuffles and votes: `bits` is this lane's value (size bytes), `arg` the
// source lane, delta or lane mask. Returns the bits of the value this lane receives.
uint64_t warp_exchange(Site site, WarpOp op, unsigned mask, uint64_t bits, unsigned size, int arg,
                       int width);
// A warp-wide instruction computed once for the whole warp (the matrix instructions of
// cuda/mma.h): each lane passes a pointer to its own operands and results; when every lane of the
// mask has arrived, the last one calls fn with the 32 lanes' pointers (null outside the mask),
// before any lane resumes, so no lane's registers change while fn reads them.
using WarpCollective = void (*)(void* const* lanes);
void warp_collective(Site site, unsigned mask, void* lane_data, WarpCollective fn);
// cp.async (cuda/mma.h): a copy into shared memory is queued on its thread and done only when the
// thread waits for its committed group, so a read before the wait sees the old bytes.
void async_copy(void* dst, const void* src, std::size_t bytes, bool valid);
void async_commit();
void async_wait(int pending);  // until at most `pending` committed groups are left
unsigned active_mask();
void* dynamic_shared_memory();

template <typename T>
T shuffle(Site site, WarpOp op, unsigned mask, T value, int arg, int width = warpSize) {
    static_assert(std::is_arithmetic_v<T> && sizeof(T) <= 8,
                  "cuda emulation: shuffles take arithmetic values of at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    bits = warp_exchange(site, op, mask, bits, sizeof(T), arg, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

// A launch with its kernel type-erased: body(ctx) runs the kernel once for the current fiber.
struct LaunchSpec {
    const char* kernel_name;
    dim3 grid;
    dim3 block;
    std::size_t smem_bytes;
    cudaStream_t stream;
    void (*body)(void*);
    void* ctx;
};
void launch_erased(const LaunchSpec& spec);
// Throws unless p is null or points into (or one past) a live device allocation.
void check_pointer_argument(const char* kernel_name, std::size_t index, const void* p);

template <typename T>
void check_argument(const char* kernel_name, std::size_t index, const T& value) {
    if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>)
        check_pointer_argument(kernel_name, index,
                               const_cast<const void*>(static_cast<const volatile void*>(value)));
}

template <typename Body>
void call_body(void* ctx) {
    (*static_cast<Body*>(ctx))();
}

// QK_LAUNCH lands here. `call` is a generic lambda around the kernel's name, so that template
// kernels deduce their arguments as under nvcc. Arguments are converted once and every thread
// gets its own copies (the kernel takes them by value), as on the GPU.
template <typename Call, typename... Args>
void launch(const char* kernel_name, Call call, dim3 grid, dim3 block, std::size_t smem_bytes,
            cudaStream_t stream, Args&&... args) {
    std::tuple<std::decay_t<Args>...> params(std::forward<Args>(args)...);
    std::size_t index = 0;
    std::apply([&](const auto&... p) { (check_argument(kernel_name, index++, p), ...); }, params);
    auto body = [&] { std::apply(call, std::as_const(params)); };
    launch_erased(
        {kernel_name, grid, block, smem_bytes, stream, &call_body<decltype(body)>, &body});
}

}  // namespace detail
}  // namespace qk::emu

// ---- built-in variables ------------------------------------------------------------------------
#define threadIdx (static_cast<const ::uint3&>(::qk::emu::detail::tl_state.thread_idx))
#define blockIdx (static_cast<const ::uint3&>(::qk::emu::detail::tl_state.block_idx))
#define blockDim (static_cast<const ::dim3&>(::qk::emu::detail::tl_state.block_dim))
#define gridDim (static_cast<const ::dim3&>(::qk::emu::detail::tl_state.grid_dim))

// ---- barriers, shuffles, votes (each call records its source line for reports) ---------------
#define QK_EMU_SITE(what) (::qk::emu::detail::Site{__FILE__, __LINE__, what})
#define __syncthreads() ::qk::emu::detail::sync_threads(QK_EMU_SITE("__syncthreads"))
#define __syncthreads_count(pred) \
    ::qk::emu::detail::sync_threads_count(QK_EMU_SITE("__syncthreads_count"), (pred) ? 1 : 0)
#define __syncthreads_or(pred) \
    (::qk::emu::detail::sync_threads_count(QK_EMU_SITE("__syncthreads_or"), (pred) ? 1 : 0) > 0)
#define __syncthreads_and(pred) \
    (::qk::emu::detail::sync_threads_count(QK_EMU_SITE("__syncthreads_and"), (pred) ? 0 : 1) == 0)
#define __syncwarp(...) \
    ::qk::emu::detail::sync_warp(QK_EMU_SITE("__syncwarp") __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...)                                                                   \
    ::qk::emu::detail::shuffle(QK_EMU_SITE("__shfl_sync"), ::qk::emu::detail::WarpOp::idx, \
                               __VA_ARGS__)
#define __shfl_up_sync(...)                                                                  \
    ::qk::emu::detail::shuffle(QK_EMU_SITE("__shfl_up_sync"), ::qk::emu::detail::WarpOp::up, \
                               __VA_ARGS__)
#define __shfl_down_sync(...)                                                                    \
    ::qk::emu::detail::shuffle(QK_EMU_SITE("__shfl_down_sync"), ::qk::emu::detail::WarpOp::down, \
                               __VA_ARGS__)
#define __shfl_xor_sync(...)                                                                    \
    ::qk::emu::detail::shuffle(QK_EMU_SITE("__shfl_xor_sync"), ::qk::emu::detail::WarpOp::bfly, \
                               __VA_ARGS__)
#define __ballot_sync(mask, pred)                                                                  \
    static_cast<unsigned>(::qk::emu::detail::warp_exchange(                                        \
        QK_EMU_SITE("__ballot_sync"), ::qk::emu::detail::WarpOp::ballot, (mask), (pred) ? 1u : 0u, \
        4, 0, warpSize))
#define __any_sync(mask, pred)                                                                \
    static_cast<int>(::qk::emu::detail::warp_exchange(QK_EMU_SITE("__any_sync"),              \
                                                      ::qk::emu::detail::WarpOp::any, (mask), \
                                                      (pred) ? 1u : 0u, 4, 0, warpSize))
#define __all_sync(mask, pred)                                                                \
    static_cast<int>(::qk::emu::detail::warp_exchange(QK_EMU_SITE("__all_sync"),              \
                                                      ::qk::emu::detail::WarpOp::all, (mask), \
                                                      (pred) ? 1u : 0u, 4, 0, warpSize))
#define __activemask() ::qk::emu::detail::active_mask()

// ---- launches and dynamic shared memory ----------------------------------------------------
// QK_LAUNCH(kernel, grid, block, smem_bytes, stream, args...): runs the whole grid before it
// returns (streams are no-ops); launch-time reports (bad configuration, host pointer argument,
// deadlock, divergent barrier, out-of-bounds write) are thrown as qk::Error.
// An open launch ledger (cuda/ledger.h) records it, as under nvcc.
#define QK_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)                                \
    do {                                                                                       \
        const ::dim3 qk_grid = ::dim3(grid), qk_block = ::dim3(block);                         \
        const ::qk::cuda::ledger::Scope qk_ledger_scope(                                       \
            #kernel, {qk_grid.x, qk_grid.y, qk_grid.z}, {qk_block.x, qk_block.y, qk_block.z},  \
            static_cast<std::size_t>(smem_bytes));                                             \
        ::qk::emu::detail::launch(                                                             \
            #kernel, [](auto&&... qk_emu_args) { kernel(qk_emu_args...); }, qk_grid, qk_block, \
            static_cast<std::size_t>(smem_bytes), stream __VA_OPT__(, ) __VA_ARGS__);          \
    } while (0)
// Inside a kernel body: `name` points at this block's dynamic shared memory (smem_bytes of the
// launch), filled with 0xFF bytes (NaN as float) before each block so reads before writes show.
#define QK_DYNAMIC_SHARED(T, name) \
    T* const name = static_cast<T*>(::qk::emu::detail::dynamic_shared_memory())

#include "cuda/emu/device_functions.h"
#include "cuda/ledger.h"
