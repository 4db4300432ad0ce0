// The CUDA runtime API subset of the emulation: errors, copies and sets with their pointer checks,
// streams (synchronous no-ops that are still validated), and the one emulated device.
//
// Where real CUDA returns an error code, so does the emulator: the code comes back from the call
// and from cudaGetLastError as usual, and the detailed message (what was wrong, with the pointers
// and sizes) is kept for qk::emu::last_error_message(). Problems found while running a kernel have
// no faithful error code and are thrown as qk::Error instead (see scheduler.cpp and arena.cpp).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "cuda/emu/emu_internal.h"
#include "cuda/ledger.h"

struct CUstream_st {
    int id;
};

namespace qk::emu {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string last_message;

std::mutex stream_mutex;
std::set<cudaStream_t>& live_streams() {
    static auto* streams = new std::set<cudaStream_t>;
    return *streams;
}

std::atomic<std::size_t> max_smem{48 * 1024};
constexpr std::size_t kSmemOptinLimit = 227 * 1024;  // sm_90's per-block opt-in ceiling

const char* kind_name(cudaMemcpyKind kind) {
    switch (kind) {
        case cudaMemcpyHostToHost:
            return "cudaMemcpyHostToHost";
        case cudaMemcpyHostToDevice:
            return "cudaMemcpyHostToDevice";
        case cudaMemcpyDeviceToHost:
            return "cudaMemcpyDeviceToHost";
        case cudaMemcpyDeviceToDevice:
            return "cudaMemcpyDeviceToDevice";
        case cudaMemcpyDefault:
            return "cudaMemcpyDefault";
    }
    return "an invalid cudaMemcpyKind";
}

// Checks one side of a copy or set: on the device it must lie inside one live allocation, on the
// host outside the arena. Returns the problem, or an empty string.
std::string check_side(const char* role, const void* p, std::size_t bytes, bool want_device) {
    using detail::Where;
    const detail::PointerInfo info = detail::classify(p);
    if (!p) return fmt::format("the {} is null", role);
    if (want_device && info.where != Where::device)
        return fmt::format("the {} is {}, expected device memory", role, detail::describe(p, info));
    if (!want_device && info.where != Where::host)
        return fmt::format("the {} is {}, expected host memory", role, detail::describe(p, info));
    if (want_device && info.offset + bytes > info.size)
        return fmt::format(
            "the {} runs {} bytes past the end of its device allocation of {} bytes "
            "(it starts at offset {})",
            role, info.offset + bytes - info.size, info.size, info.offset);
    return {};
}

bool in_arena(const void* p) { return detail::classify(p).where != detail::Where::host; }

cudaError_t copy(const char* api, void* dst, const void* src, std::size_t bytes,
                 cudaMemcpyKind kind) {
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return detail::record_error(
            cudaErrorInvalidMemcpyDirection,
            fmt::format("{}: kind {} is not a cudaMemcpyKind", api, static_cast<int>(kind)));
    if (bytes == 0) return cudaSuccess;
    bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) {  // unified addressing: where the pointers live decides
        dst_device = in_arena(dst);
        src_device = in_arena(src);
    }
    std::string problem = check_side("destination", dst, bytes, dst_device);
    if (problem.empty()) problem = check_side("source", src, bytes, src_device);
    if (!problem.empty())
        return detail::record_error(
            cudaErrorInvalidValue,
            fmt::format("{}({}, {} bytes): {}", api, kind_name(kind), bytes, problem));
    if (dst_device && src_device && qk::cuda::ledger::dry_run()) return cudaSuccess;
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t set(const char* api, void* dst, int value, std::size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    if (auto problem = check_side("destination", dst, bytes, true); !problem.empty())
        return detail::record_error(cudaErrorInvalidValue,
                                    fmt::format("{}({} bytes): {}", api, bytes, problem));
    if (qk::cuda::ledger::dry_run()) return cudaSuccess;
    std::memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t check_stream(const char* api, cudaStream_t stream) {
    if (!stream) return cudaSuccess;
    std::lock_guard lock(stream_mutex);
    if (live_streams().count(stream)) return cudaSuccess;
    return detail::record_error(cudaErrorInvalidResourceHandle,
                                fmt::format("{}: stream {} was not created by cudaStreamCreate "
                                            "or was already destroyed",
                                            api, static_cast<const void*>(stream)));
}

}  // namespace

std::string last_error_message() { return last_message; }

namespace detail {

void record_message(std::string message) {
    last_message =
        message.starts_with("cuda emulation: ") ? std::move(message) : "cuda emulation: " + message;
}

cudaError_t record_error(cudaError_t code, std::string message) {
    last_error = code;
    record_message(std::move(message));
    return code;
}

std::size_t max_dynamic_smem() { return max_smem.load(); }

bool valid_stream(cudaStream_t stream) { return check_stream("launch", stream) == cudaSuccess; }

}  // namespace detail
}  // namespace qk::emu

using qk::emu::detail::record_error;

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "cudaSuccess";
        case cudaErrorInvalidValue:
            return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation:
            return "cudaErrorMemoryAllocation";
        case cudaErrorInitializationError:
            return "cudaErrorInitializationError";
        case cudaErrorInvalidConfiguration:
            return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevicePointer:
            return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidMemcpyDirection:
            return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorNoDevice:
            return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice:
            return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle:
            return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady:
            return "cudaErrorNotReady";
        case cudaErrorIllegalAddress:
            return "cudaErrorIllegalAddress";
        case cudaErrorLaunchFailure:
            return "cudaErrorLaunchFailure";
        case cudaErrorNotSupported:
            return "cudaErrorNotSupported";
        case cudaErrorUnknown:
            return "cudaErrorUnknown";
    }
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInitializationError:
            return "initialization error";
        case cudaErrorInvalidConfiguration:
            return "invalid configuration argument";
        case cudaErrorInvalidDevicePointer:
            return "invalid device pointer";
        case cudaErrorInvalidMemcpyDirection:
            return "invalid copy direction for memcpy";
        case cudaErrorNoDevice:
            return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorNotReady:
            return "device not ready";
        case cudaErrorIllegalAddress:
            return "an illegal memory access was encountered";
        case cudaErrorLaunchFailure:
            return "unspecified launch failure";
        case cudaErrorNotSupported:
            return "operation not supported";
        case cudaErrorUnknown:
            return "unknown error";
    }
    return "unrecognized error code";
}

cudaError_t cudaGetLastError() { return std::exchange(qk::emu::last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return qk::emu::last_error; }

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    return qk::emu::copy("cudaMemcpy", dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (auto e = qk::emu::check_stream("cudaMemcpyAsync", stream)) return e;
    return qk::emu::copy("cudaMemcpyAsync", dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dev_ptr, int value, std::size_t bytes) {
    return qk::emu::set("cudaMemset", dev_ptr, value, bytes);
}
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, std::size_t bytes, cudaStream_t stream) {
    if (auto e = qk::emu::check_stream("cudaMemsetAsync", stream)) return e;
    return qk::emu::set("cudaMemsetAsync", dev_ptr, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return record_error(cudaErrorInvalidValue, "cudaStreamCreate: stream is null");
    static std::atomic<int> next_id{1};
    *stream = new CUstream_st{next_id++};
    std::lock_guard lock(qk::emu::stream_mutex);
    qk::emu::live_streams().insert(*stream);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return cudaSuccess;
    if (auto e = qk::emu::check_stream("cudaStreamDestroy", stream)) return e;
    std::lock_guard lock(qk::emu::stream_mutex);
    qk::emu::live_streams().erase(stream);
    delete stream;
    return cudaSuccess;
}
// Everything runs synchronously, so there is never anything to wait for.
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return qk::emu::check_stream("cudaStreamSynchronize", stream);
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return record_error(cudaErrorInvalidValue, "cudaGetDeviceCount: count is null");
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0)
        return record_error(
            cudaErrorInvalidDevice,
            fmt::format("cudaSetDevice({}): the emulation has device 0 only", device));
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (!device) return record_error(cudaErrorInvalidValue, "cudaGetDevice: device is null");
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop) return record_error(cudaErrorInvalidValue, "cudaGetDeviceProperties: prop is null");
    if (device != 0)
        return record_error(cudaErrorInvalidDevice,
                            fmt::format("cudaGetDeviceProperties(device {}): the emulation has "
                                        "device 0 only",
                                        device));
    *prop = {};
    std::snprintf(prop->name, sizeof(prop->name), "%s", "qknorm CPU emulation");
    prop->totalGlobalMem = std::size_t{64} << 30;  // the arena's reservation
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = qk::emu::kSmemOptinLimit;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->multiProcessorCount = qk::emu::workers();
    prop->major = 8;  // the features of sm_80 are what the emulation offers
    prop->minor = 0;
    prop->clockRate = 1000000;
    prop->totalConstMem = 65536;
    prop->l2CacheSize = 4 << 20;
    return cudaSuccess;
}

cudaError_t cuda_emu_set_max_dynamic_smem(cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || static_cast<std::size_t>(value) > qk::emu::kSmemOptinLimit)
        return record_error(cudaErrorInvalidValue,
                            fmt::format("cudaFuncSetAttribute: {} bytes of dynamic shared memory "
                                        "(at most {})",
                                        value, qk::emu::kSmemOptinLimit));
    std::size_t cur = qk::emu::max_smem.load();
    while (static_cast<std::size_t>(value) > cur &&
           !qk::emu::max_smem.compare_exchange_weak(cur, static_cast<std::size_t>(value))) {
    }
    return cudaSuccess;
}
