// The CUDA backend's runtime (see runtime.h): checks, the caching allocator, stream, cuBLAS.
//
// The caching allocator: cudaMalloc and cudaFree synchronise the device and cost tens of
// microseconds, far more than most kernels, so freed blocks are kept in per-size free lists and
// handed out again. Sizes are rounded up (to 512 bytes below 1 MiB, to 1 MiB above) so that the
// activations of successive training steps, which have the same shapes, hit the cache.
#include "cuda/runtime.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/storage.h"
#include "cuda/ledger.h"

namespace qk::cuda {

void check(cudaError_t status, const char* call, const char* file, int line) {
    if (status == cudaSuccess) return;
    throw Error(fmt::format("cuda: {} failed at {}:{}: {} ({})", call, file, line,
                            cudaGetErrorString(status), static_cast<int>(status)));
}

void check(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    throw Error(fmt::format("cuBLAS: {} failed at {}:{}: {} ({})", call, file, line,
                            cublasGetStatusString(status), static_cast<int>(status)));
}

cudaStream_t stream() { return nullptr; }  // the default stream: every call is ordered

cublasHandle_t blas() {
    static cublasHandle_t handle = [] {
        cublasHandle_t h = nullptr;
        QK_CUDA_CHECK(cublasCreate(&h));
        QK_CUDA_CHECK(cublasSetStream(h, stream()));
        return h;
    }();
    return handle;
}

bool device_available() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

const char* backend_description() {
#if defined(QK_CUDA_REAL)
    static const std::string description = [] {
        cudaDeviceProp prop{};
        if (!device_available() || cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
            return std::string("cuda (no device)");
        return fmt::format("cuda ({})", prop.name);
    }();
    return description.c_str();
#else
    return "cuda emulation on the cpu";
#endif
}

std::size_t max_shared_memory_per_block() {
    static const std::size_t bytes = [] {
        cudaDeviceProp prop{};
        QK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        return std::size_t(prop.sharedMemPerBlockOptin);
    }();
    return bytes;
}

void copy_to_device(void* dst, const void* src, std::size_t nbytes) {
    if (nbytes) QK_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, std::size_t nbytes) {
    if (nbytes) QK_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
}
void copy_on_device(void* dst, const void* src, std::size_t nbytes) {
    if (nbytes) QK_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToDevice));
}
void fill_zero(void* dst, std::size_t nbytes) {
    if (!nbytes) return;
    ledger::declare(double(nbytes));  // a launch that writes nbytes, as a kernel's fill would
    const ledger::Scope scope("memset", "cuda");
    QK_CUDA_CHECK(cudaMemset(dst, 0, nbytes));
}
void synchronize() { QK_CUDA_CHECK(cudaDeviceSynchronize()); }

unsigned* tile_counters(int64_t n) {
    static unsigned* counters = nullptr;
    static int64_t capacity = 0;
    if (n > capacity) {
        // Zeroed by a copy from the host, which a dry-run ledger does not skip (its memsets).
        const int64_t grown = std::max<int64_t>(n, 4096);
        const std::vector<unsigned> zeros(static_cast<std::size_t>(grown), 0u);
        void* fresh = nullptr;
        QK_CUDA_CHECK(cudaMalloc(&fresh, sizeof(unsigned) * zeros.size()));
        copy_to_device(fresh, zeros.data(), sizeof(unsigned) * zeros.size());
        synchronize();  // the old array's last users are done before it goes
        if (counters) QK_CUDA_CHECK(cudaFree(counters));
        counters = static_cast<unsigned*>(fresh);
        capacity = grown;
    }
    return counters;
}

// ---- the caching allocator -----------------------------------------------------------------

namespace {

std::size_t rounded_size(std::size_t nbytes) {
    constexpr std::size_t kSmall = 512, kLarge = std::size_t{1} << 20;
    const std::size_t n = std::max<std::size_t>(nbytes, 1);
    return n < kLarge ? (n + kSmall - 1) / kSmall * kSmall : (n + kLarge - 1) / kLarge * kLarge;
}

struct Cache {
    std::mutex mutex;
    std::map<std::size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
    AllocatorStats stats;
};

Cache& cache() {
    static Cache* c = new Cache;  // never destroyed: storages may be freed during static teardown
    return *c;
}

void* device_allocate(std::size_t nbytes) {
    const std::size_t size = rounded_size(nbytes);
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    auto& blocks = c.free_blocks[size];
    void* ptr = nullptr;
    if (!blocks.empty()) {
        ptr = blocks.back();
        blocks.pop_back();
        c.stats.cached_bytes -= size;
    } else {
        cudaError_t status = cudaMalloc(&ptr, size);
        if (status == cudaErrorMemoryAllocation) {  // give the cache back and try once more
            cudaGetLastError();
            for (auto& [block_size, list] : c.free_blocks)
                for (void* p : list) cudaFree(p);
            c.free_blocks.clear();
            c.stats.cached_bytes = 0;
            status = cudaMalloc(&ptr, size);
        }
        QK_CHECK(status == cudaSuccess, "cuda: out of device memory allocating {} bytes ({})",
                 nbytes, cudaGetErrorString(status));
        ++c.stats.device_mallocs;
    }
    c.stats.live_bytes += size;
    return ptr;
}

void device_release(void* ptr, std::size_t nbytes) {
    const std::size_t size = rounded_size(nbytes);
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    c.free_blocks[size].push_back(ptr);
    c.stats.live_bytes -= size;
    c.stats.cached_bytes += size;
}

}  // namespace

AllocatorStats allocator_stats() {
    std::lock_guard lock(cache().mutex);
    return cache().stats;
}

void empty_cache() {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    for (auto& [size, list] : c.free_blocks)
        for (void* p : list) QK_CUDA_CHECK(cudaFree(p));
    c.free_blocks.clear();
    c.stats.cached_bytes = 0;
}

}  // namespace qk::cuda

namespace qk {

const Allocator& cuda_allocator() {
    static const Allocator allocator{cuda::device_allocate, cuda::device_release};
    return allocator;
}

}  // namespace qk
