// Internal glue between the parts of the CUDA emulation (scheduler, arena, runtime API, cuBLAS
// shim); not for kernel sources.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "cuda/emu/cuda_emu.h"

namespace qk::emu::detail {

// Where a pointer lives, as far as the arena can tell.
enum class Where {
    host,      // outside the arena
    device,    // inside (or one past the end of) a live allocation
    freed,     // inside an allocation that was freed (and not yet reused)
    red_zone,  // inside the arena but in no allocation: a red zone or unused space
};
struct PointerInfo {
    Where where = Where::host;
    uintptr_t base = 0;      // start of the allocation (device and freed)
    std::size_t size = 0;    // its size in bytes as asked of cudaMalloc
    std::size_t offset = 0;  // p - base
};
PointerInfo classify(const void* p);
// "a host pointer 0x..." / "device memory (offset 8 in an allocation of 400 bytes)" / ...
std::string describe(const void* p, const PointerInfo& info);

// Throws qk::Error ("cuda emulation: <api>: <what> ...") unless [p, p + bytes) lies inside one
// live device allocation. Used by the cuBLAS shim, which reports rather than returns.
void require_device_range(const char* api, const char* what, const void* p, std::size_t bytes);

// Checks the red zones of every live allocation after a launch and restores them. Returns an empty
// string when all are intact, else the report naming the kernel.
std::string check_red_zones(const char* kernel_name);

// Records a runtime error for cudaGetLastError / last_error_message and returns its code.
cudaError_t record_error(cudaError_t code, std::string message);
// Keeps only the message (cuBLAS statuses do not touch the runtime's last error).
void record_message(std::string message);

// The live handles of a library shim (cuBLAS's, cuBLASLt's), so that a null or destroyed handle
// is refused as the library refuses it. One registry per Context type, never destroyed (a handle
// may be used during static teardown). Context must be complete where create/destroy are called.
template <class Context>
class LiveHandles {
  public:
    static LiveHandles& get() {
        static auto* registry = new LiveHandles;
        return *registry;
    }
    Context* create() {
        auto* handle = new Context;
        std::lock_guard lock(mutex_);
        handles_.insert(handle);
        return handle;
    }
    bool destroy(Context* handle) {  // false for a null or unknown handle
        {
            std::lock_guard lock(mutex_);
            if (!handle || handles_.erase(handle) == 0) return false;
        }
        delete handle;
        return true;
    }
    bool live(Context* handle) {
        std::lock_guard lock(mutex_);
        return handle && handles_.count(handle);
    }

  private:
    std::mutex mutex_;
    std::set<Context*> handles_;
};

// True for the null stream and streams from cudaStreamCreate not yet destroyed (else records
// cudaErrorInvalidResourceHandle).
bool valid_stream(cudaStream_t stream);

// The largest dynamic shared memory a launch may ask for (48 KiB unless raised).
std::size_t max_dynamic_smem();

std::string format_dim(const dim3& d);

}  // namespace qk::emu::detail
