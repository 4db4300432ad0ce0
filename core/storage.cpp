#include "core/storage.h"

#include <cstdlib>

namespace qk {

namespace {

// 64 bytes: a cache line and an AVX-512 vector, so kernels can use aligned loads.
void* cpu_allocate(std::size_t nbytes) {
    std::size_t rounded = (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, rounded);
    QK_CHECK(ptr, "Storage: out of memory allocating {} bytes on cpu", nbytes);
    return ptr;
}
void cpu_release(void* ptr, std::size_t) { std::free(ptr); }

}  // namespace

const Allocator& cuda_allocator();  // defined by the CUDA backend, or by its stub

const Allocator& allocator_for(Device device) {
    static const Allocator cpu{cpu_allocate, cpu_release};
    return device == Device::cpu ? cpu : cuda_allocator();
}

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
    data_ = allocator_for(device).allocate(nbytes);
}

Storage::~Storage() { allocator_for(device_).release(data_, nbytes_); }

}  // namespace qk
