// Storage: one owned, 64-byte aligned buffer on one device. Tensors share it through shared_ptr;
// views never copy it. The CUDA backend plugs in its own allocator through `Allocator`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace qk {

struct Allocator {
    void* (*allocate)(std::size_t nbytes);
    void (*release)(void* ptr, std::size_t nbytes);
};

// Returns the allocator for a device; throws "built without CUDA support" for cuda in a CPU build.
const Allocator& allocator_for(Device device);

// Bytes held by live cpu Storages (what tensors asked for, before the allocator rounds up), and
// the most held at once since the last reset_peak_storage_bytes(). Benchmarks read these to
// report a training step's peak memory as parameters + optimiser state + activations.
std::size_t live_storage_bytes();
std::size_t peak_storage_bytes();
void reset_peak_storage_bytes();  // peak := live

class Storage {
  public:
    Storage(std::size_t nbytes, Device device);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    std::size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }

    // How many times the library has written into this buffer in place: copy_into, add_,
    // Tensor::set, the optimizers' updates and broadcasts each advance it, so that a copy made
    // from the values at one version is known stale at the next. A raw write through data<T>()
    // does not: code that writes a weight that way calls mark_written (core/tensor.h).
    std::uint64_t version() const { return version_; }
    void bump_version() { ++version_; }

    // One copy of the whole buffer in another dtype, and the version of the values it holds: a
    // weight rounded to bfloat16 once for every GEMM that reads it until the next write, where
    // it was rounded at every call (cast_once in core/tensor.h). The optimizer rewrites it in
    // the same pass as the weight, so in training a weight is rounded once per step.
    struct CastCopy {
        std::shared_ptr<Storage> storage;  // null: none made yet
        DType dtype = DType::f32;
        std::uint64_t version = 0;
        // Made or rewritten under a dry-run launch ledger (cuda/ledger.h), whose kernels are
        // recorded, not run: it holds nothing, and serves only further dry runs.
        bool recorded_only = false;
    };
    CastCopy& cast_copy() { return cast_copy_; }
    const CastCopy& cast_copy() const { return cast_copy_; }

  private:
    void* data_ = nullptr;
    std::size_t nbytes_ = 0;
    Device device_;
    std::uint64_t version_ = 0;
    CastCopy cast_copy_;
};

}  // namespace qk
