// Storage: one owned, 64-byte aligned buffer on one device. Tensors share it through shared_ptr;
// views never copy it. The CUDA backend plugs in its own allocator through `Allocator`.
#pragma once

#include <cstddef>
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

  private:
    void* data_ = nullptr;
    std::size_t nbytes_ = 0;
    Device device_;
};

}  // namespace qk
