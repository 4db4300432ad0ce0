#include "core/storage.h"

#include <atomic>
#include <cstdlib>

#ifdef QK_WITH_CUDA
#include "cuda/runtime.h"
#endif

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

// Relaxed atomics: the counts only need to be exact, not ordered against other memory.
std::atomic<std::size_t> live_bytes{0}, peak_bytes{0};

void count_allocation(std::size_t nbytes) {
    const std::size_t now = live_bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    std::size_t peak = peak_bytes.load(std::memory_order_relaxed);
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
}

}  // namespace

const Allocator& cuda_allocator();  // defined by the CUDA backend, or by its stub

const Allocator& allocator_for(Device device) {
    static const Allocator cpu{cpu_allocate, cpu_release};
    return device == Device::cpu ? cpu : cuda_allocator();
}

std::size_t live_storage_bytes() { return live_bytes.load(std::memory_order_relaxed); }
std::size_t peak_storage_bytes() { return peak_bytes.load(std::memory_order_relaxed); }
void reset_peak_storage_bytes() { peak_bytes.store(live_bytes.load(std::memory_order_relaxed)); }

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
#ifdef QK_WITH_CUDA
    // Asked once: a real build on a machine without a GPU (or driver) says so here, rather than
    // as an out-of-memory error from cudaMalloc.
    static const bool have_device = cuda::device_available();
    QK_CHECK(device == Device::cpu || have_device,
             "Storage: cannot allocate {} bytes on cuda: no CUDA device is available ({})", nbytes,
             cuda::backend_description());
#endif
    data_ = allocator_for(device).allocate(nbytes);
    if (device == Device::cpu) count_allocation(nbytes);
}

Storage::~Storage() {
    allocator_for(device_).release(data_, nbytes_);
    if (device_ == Device::cpu) live_bytes.fetch_sub(nbytes_, std::memory_order_relaxed);
}

}  // namespace qk
