// Self-test kernels for the CUDA emulation, written as a .cu file would be (standard CUDA syntax
// through cuda/emu/cuda_compat.h) but compiled by g++ into the `emu` test suite. Some kernels are
// correct and check the emulated semantics; the "planted bug" ones must be reported.
#include "emu_selftest_kernels.h"

#include <stdexcept>

#include "core/error.h"

namespace emu_selftest {
namespace {

void check(cudaError_t e) {
    if (e != cudaSuccess) throw qk::Error(qk::emu::last_error_message());
}

// A device array that copies in from and out to a std::vector.
template <typename T>
struct DeviceBuffer {
    T* ptr = nullptr;
    std::size_t n;
    explicit DeviceBuffer(std::size_t count) : n(count) { check(cudaMalloc(&ptr, n * sizeof(T))); }
    explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
        check(cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    std::vector<T> get() const {
        std::vector<T> v(n);
        check(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return v;
    }
};

// ---- semantics --------------------------------------------------------------------------------

// out: [blocks * threads * 6 + 4]
__global__ void index_kernel(unsigned* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 6 * (block * nthreads + thread);
    o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z;
    o[3] = blockIdx.x, o[4] = blockIdx.y, o[5] = blockIdx.z;
    if (block == 0 && thread == 0) {
        unsigned* tail = out + 6 * nthreads * gridDim.x * gridDim.y * gridDim.z;
        tail[0] = nthreads, tail[1] = gridDim.x, tail[2] = gridDim.y, tail[3] = gridDim.z;
    }
}

constexpr int kTile = 64;

// x: [n], out: [gridDim.x]; blockDim.x == kTile. Tree reduction in static shared memory.
__global__ void block_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float tile[kTile];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    tile[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) tile[t] += tile[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = tile[0];
}

// The same with the barriers forgotten (planted bug 1).
__global__ void block_sum_no_sync_kernel(const float* x, float* out, int n) {
    __shared__ float tile[kTile];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    tile[t] = i < n ? x[i] : 0.0f;
    for (int s = blockDim.x / 2; s > 0; s >>= 1)
        if (t < s) tile[t] += tile[t + s];
    if (t == 0) out[blockIdx.x] = tile[0];
}

// x: [n], out: [warps]. Lanes past n contribute 0; every thread exists, so full masks are valid.
__global__ void warp_down_kernel(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
}

// x: [n], out: [gridDim.x * blockDim.x], every lane holds its warp's sum.
__global__ void warp_xor_kernel(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    out[i] = v;
}

// x: [n]; scan/bcast/group8/ballot: [gridDim.x * blockDim.x].
__global__ void warp_misc_kernel(const float* x, int n, float* scan, float* bcast, float* group8,
                                 unsigned* ballot) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % warpSize;
    const float v = i < n ? x[i] : 0.0f;
    float s = v;
    for (int off = 1; off < 32; off <<= 1) {
        const float up = __shfl_up_sync(0xffffffffu, s, off);
        if (lane >= off) s += up;
    }
    scan[i] = s;
    bcast[i] = __shfl_sync(0xffffffffu, v, 3);
    float g = v;
    for (int m = 4; m > 0; m >>= 1) g += __shfl_xor_sync(0xffffffffu, g, m, 8);
    group8[i] = g;
    ballot[i] = __ballot_sync(0xffffffffu, v > 0.0f);
}

// x, before, reversed: [blockDim.x]; dynamic shared memory of blockDim.x floats.
__global__ void dynamic_smem_kernel(const float* x, float* before, float* reversed) {
    QK_DYNAMIC_SHARED(float, buf);
    const int t = threadIdx.x, n = blockDim.x;
    before[t] = buf[t];
    buf[t] = x[t];
    __syncthreads();
    reversed[t] = buf[n - 1 - t];
}

__global__ void atomic_sum_kernel(const float* x, int n, float* sum) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(sum, x[i]);
}
__global__ void atomic_count_kernel(int* count) { atomicAdd(count, 1); }
__global__ void atomic_max_kernel(const int* x, int n, int* best) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicMax(best, x[i]);
}

// ---- planted bugs -------------------------------------------------------------------------------

__global__ void fill_off_by_one_kernel(float* p, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) p[i] = 1.0f;  // BUG: writes p[n]
}
__global__ void fill_kernel(float* p, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 1.0f;
}
__global__ void sync_in_branch_kernel(float* p) {
    if (threadIdx.x < 16) {
        __syncthreads();  // BUG: threads 16.. never get here
        p[threadIdx.x] = 1.0f;
    }
}
__global__ void sync_two_sites_kernel(float* p) {
    if (threadIdx.x < 16) {
        __syncthreads();  // BUG: two different barriers
    } else {
        __syncthreads();
    }
    p[threadIdx.x] = 1.0f;
}
__global__ void shuffle_exited_kernel(float* p) {
    if (threadIdx.x < 16) return;
    p[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);  // BUG: lanes 0-15 have exited
}
__global__ void syncwarp_vs_syncthreads_kernel(float* p) {
    if (threadIdx.x == 0)
        __syncwarp();  // BUG: waits for lanes that wait at __syncthreads
    else
        __syncthreads();
    p[threadIdx.x] = 1.0f;
}
__global__ void throwing_kernel(float* p) {
    if (threadIdx.x == 5) throw std::runtime_error("thrown by thread 5");
    __syncthreads();
    p[threadIdx.x] = 1.0f;
}
__global__ void smem_overflow_kernel(float* p) {
    QK_DYNAMIC_SHARED(float, buf);
    buf[threadIdx.x + 1] = 1.0f;  // BUG: one past the end for the last thread
    p[threadIdx.x] = 0.0f;
}

__global__ void cost_kernel(float* p, int barriers) {
    float v = threadIdx.x;
    for (int b = 0; b < barriers; ++b) {
        v += 1.0f;
        __syncthreads();
    }
    if (v < 0) p[0] = v;  // never: keeps v alive
}

}  // namespace

std::vector<unsigned> index_map(dim3 grid, dim3 block) {
    const std::size_t threads = std::size_t{grid.x} * grid.y * grid.z * block.x * block.y * block.z;
    DeviceBuffer<unsigned> out(threads * 6 + 4);
    QK_LAUNCH(index_kernel, grid, block, 0, nullptr, out.ptr);
    return out.get();
}

std::vector<float> block_sums(const std::vector<float>& x, bool with_barriers) {
    const int n = static_cast<int>(x.size()), blocks = (n + kTile - 1) / kTile;
    DeviceBuffer<float> dx(x), out(blocks);
    if (with_barriers)
        QK_LAUNCH(block_sum_kernel, blocks, kTile, 0, nullptr, dx.ptr, out.ptr, n);
    else
        QK_LAUNCH(block_sum_no_sync_kernel, blocks, kTile, 0, nullptr, dx.ptr, out.ptr, n);
    return out.get();
}

std::vector<float> warp_sums_down(const std::vector<float>& x) {
    const int n = static_cast<int>(x.size()), blocks = (n + 95) / 96;
    DeviceBuffer<float> dx(x), out(blocks * 3);
    QK_LAUNCH(warp_down_kernel, blocks, 96, 0, nullptr, dx.ptr, out.ptr, n);
    return out.get();
}

std::vector<float> warp_sums_xor(const std::vector<float>& x) {
    const int n = static_cast<int>(x.size()), blocks = (n + 95) / 96;
    DeviceBuffer<float> dx(x), out(blocks * 96);
    QK_LAUNCH(warp_xor_kernel, blocks, 96, 0, nullptr, dx.ptr, out.ptr, n);
    return out.get();
}

WarpMisc warp_misc(const std::vector<float>& x) {
    const int n = static_cast<int>(x.size()), blocks = (n + 63) / 64;
    DeviceBuffer<float> dx(x), scan(blocks * 64), bcast(blocks * 64), group8(blocks * 64);
    DeviceBuffer<unsigned> ballot(blocks * 64);
    QK_LAUNCH(warp_misc_kernel, blocks, 64, 0, nullptr, dx.ptr, n, scan.ptr, bcast.ptr, group8.ptr,
              ballot.ptr);
    return {scan.get(), bcast.get(), group8.get(), ballot.get()};
}

void dynamic_smem(const std::vector<float>& x, std::vector<float>& before,
                  std::vector<float>& reversed) {
    const int n = static_cast<int>(x.size());
    DeviceBuffer<float> dx(x), b(n), r(n);
    QK_LAUNCH(dynamic_smem_kernel, 1, n, n * sizeof(float), nullptr, dx.ptr, b.ptr, r.ptr);
    before = b.get();
    reversed = r.get();
}

float atomic_sum(const std::vector<float>& x) {
    const int n = static_cast<int>(x.size());
    DeviceBuffer<float> dx(x), sum(std::vector<float>{0.0f});
    QK_LAUNCH(atomic_sum_kernel, (n + 44) / 45, 45, 0, nullptr, dx.ptr, n, sum.ptr);
    return sum.get()[0];
}

int atomic_count(int blocks, int threads) {
    DeviceBuffer<int> count(std::vector<int>{0});
    QK_LAUNCH(atomic_count_kernel, blocks, threads, 0, nullptr, count.ptr);
    return count.get()[0];
}

int atomic_max(const std::vector<int>& x) {
    const int n = static_cast<int>(x.size());
    DeviceBuffer<int> dx(x), best(std::vector<int>{-1000000});
    QK_LAUNCH(atomic_max_kernel, (n + 31) / 32, 32, 0, nullptr, dx.ptr, n, best.ptr);
    return best.get()[0];
}

void write_one_past_end(int n) {
    DeviceBuffer<float> p(n);
    QK_LAUNCH(fill_off_by_one_kernel, (n + 32) / 32, 32, 0, nullptr, p.ptr, n);
}

void pass_host_pointer(int n) {
    std::vector<float> host(n);
    QK_LAUNCH(fill_kernel, (n + 31) / 32, 32, 0, nullptr, host.data(), n);
}

void pass_freed_pointer(int n) {
    float* p = nullptr;
    check(cudaMalloc(&p, n * sizeof(float)));
    check(cudaFree(p));
    QK_LAUNCH(fill_kernel, (n + 31) / 32, 32, 0, nullptr, p, n);
}

void syncthreads_in_branch() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(sync_in_branch_kernel, 2, 32, 0, nullptr, p.ptr);
}

void syncthreads_at_two_sites() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(sync_two_sites_kernel, 2, 32, 0, nullptr, p.ptr);
}

void shuffle_with_exited_lanes() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(shuffle_exited_kernel, 1, 32, 0, nullptr, p.ptr);
}

void syncwarp_against_syncthreads() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(syncwarp_vs_syncthreads_kernel, 1, 32, 0, nullptr, p.ptr);
}

void throw_inside_kernel() {
    DeviceBuffer<float> p(40);
    QK_LAUNCH(throwing_kernel, 2, 40, 0, nullptr, p.ptr);
}

void launch_too_many_threads() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(fill_kernel, 1, 2048, 0, nullptr, p.ptr, 32);
}

void dynamic_smem_overflow() {
    DeviceBuffer<float> p(32);
    QK_LAUNCH(smem_overflow_kernel, 1, 32, 32 * sizeof(float), nullptr, p.ptr);
}

void cost_probe(int blocks, int threads, int barriers) {
    DeviceBuffer<float> p(1);
    QK_LAUNCH(cost_kernel, blocks, threads, 0, nullptr, p.ptr, barriers);
}

}  // namespace emu_selftest
