// cuda/copy.cu — the device side of copy_into (core/tensor.cpp) and of full/zeros
// (core/factory.cpp). Built as CUDA by nvcc, or as C++ against cuda/emu in the emulation build (see
// cuda/runtime.h).
//
// float32 -> bf16 casts use the device's conversion instruction (cuda/bf16_convert.h), which
// rounds every non-NaN float to the cpu's bf16.
//
// Work split: four elements per thread (all loaded before any is stored), 256 threads per block,
// a grid-stride loop past 65535 blocks. Where the innermost dim is contiguous on both sides and a
// multiple of 4 (casts, head regrouping), copy_packed_kernel moves four neighbours per index as one
// vector access: the casts and layout copies of a 124M-shaped step streamed at 1.3–1.6 TB/s one
// float at a time on an H200. Each thread turns its logical index into the two operands'
// offsets (StridedIndex), so a transposed, narrowed or expanded view is gathered in one pass with
// no intermediate copy. Consecutive threads write consecutive dst elements (dst is usually
// contiguous), so the writes coalesce; the reads are as scattered as the source view is.
//
// CPU twins: copy_cpu in core/tensor.cpp (the for_each_run loop) and make_cpu in core/factory.cpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"

namespace qk::cuda {

namespace {

// dst, src: read through index (dst's offsets first) over n logical elements.
// Four elements per thread in flight (unrolled_grid_loop, cuda/strided_index.h).
template <class D, class S>
__global__ void copy_strided_kernel(D* dst, const S* src, StridedIndex<2> index, int64_t n) {
    struct Element {
        D* at;
        S value;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            int64_t off[2];
            index.offsets(i, off);
            return Element{dst + off[0], src[off[1]]};
        },
        [&](int64_t, Element e) { *e.at = convert_element<D>(e.value); });
}

// Four neighbours as one aligned value: a 16-byte load of float32, an 8-byte store of bf16.
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
    T v[4];
};

// The same copy four elements at a time, where the innermost dim is contiguous on both sides
// (a cast, or the heads of (B, T, H, D) regrouped into (B, H, T, D)): index counts packs, so the
// index arithmetic and the number of memory instructions drop 4x and each is a vector access.
// copy_packs is one block's share (`block` of `blocks`): of the whole grid in copy_packed_kernel,
// of the blocks one job owns in copy_packed_all_kernel.
template <class D, class S>
__device__ __forceinline__ void copy_packs(Pack4<D>* dst, const Pack4<S>* src,
                                           const StridedIndex<2>& index, int64_t n_packs,
                                           unsigned block, unsigned blocks) {
    struct Element {
        Pack4<D>* at;
        Pack4<S> value;
    };
    unrolled_grid_loop(
        n_packs,
        [&](int64_t i) {
            int64_t off[2];
            index.offsets(i, off);
            return Element{dst + off[0], src[off[1]]};
        },
        [&](int64_t, Element e) {
            Pack4<D> out;
            for (int k = 0; k < 4; ++k) out.v[k] = convert_element<D>(e.value.v[k]);
            *e.at = out;
        },
        block, blocks);
}

template <class D, class S>
__global__ void copy_packed_kernel(Pack4<D>* dst, const Pack4<S>* src, StridedIndex<2> index,
                                   int64_t n_packs) {
    copy_packs(dst, src, index, n_packs, blockIdx.x, gridDim.x);
}

// Up to kMaxCopyJobs packed copies of the same element types in one launch: job j takes blocks
// [first_block[j], first_block[j + 1]) as its own grid. (The pieces of a gradient put in place,
// q, k and v rounded for attention: one launch where each was one.)
inline constexpr int kMaxCopyJobs = 4;
template <class D, class S>
struct PackedCopies {
    int count = 0;
    unsigned first_block[kMaxCopyJobs + 1] = {};
    Pack4<D>* dst[kMaxCopyJobs] = {};
    const Pack4<S>* src[kMaxCopyJobs] = {};
    StridedIndex<2> index[kMaxCopyJobs];
    int64_t n_packs[kMaxCopyJobs] = {};
};

template <class D, class S>
__global__ void copy_packed_all_kernel(PackedCopies<D, S> jobs) {
    int j = 0;
    while (j + 1 < jobs.count && blockIdx.x >= jobs.first_block[j + 1]) ++j;
    copy_packs(jobs.dst[j], jobs.src[j], jobs.index[j], jobs.n_packs[j],
               blockIdx.x - jobs.first_block[j], jobs.first_block[j + 1] - jobs.first_block[j]);
}

// The index of packs for a copy whose innermost merged dim is contiguous on both sides, a multiple
// of 4 long, every other stride a multiple of 4 and both pointers aligned to a pack; or false.
bool pack_index(StridedIndex<2>& index, const void* dst, std::size_t dst_size, const void* src,
                std::size_t src_size) {
    const int last = index.rank - 1;
    if (last < 0 || index.sizes[last] % 4 != 0 || index.strides[0][last] != 1 ||
        index.strides[1][last] != 1 || reinterpret_cast<uintptr_t>(dst) % (4 * dst_size) != 0 ||
        reinterpret_cast<uintptr_t>(src) % (4 * src_size) != 0)
        return false;
    for (int d = 0; d < last; ++d)
        if (index.strides[0][d] % 4 != 0 || index.strides[1][d] % 4 != 0) return false;
    index.sizes[last] /= 4;
    for (int d = 0; d < last; ++d) index.strides[0][d] /= 4, index.strides[1][d] /= 4;
    return true;
}

// dst: (n) contiguous.
template <class T>
__global__ void fill_kernel(T* dst, int64_t n, T value) {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = value;
}

}  // namespace

void copy_strided(void* dst, DType dst_dtype, const Shape& dst_strides, const void* src,
                  DType src_dtype, const Shape& src_strides, const Shape& shape) {
    const int64_t n = numel_of(shape);
    if (n == 0) return;
    const auto index = make_strided_index<2>(shape, {&dst_strides, &src_strides}, "copy");
    dispatch_all(dst_dtype, [&](auto dst_tag) {
        dispatch_all(src_dtype, [&](auto src_tag) {
            using D = decltype(dst_tag);
            using S = decltype(src_tag);
            // A side whose innermost merged stride is not 1 touches a 32-byte DRAM sector per
            // element (a transpose's reads): its bytes count that way.
            auto bytes_per = [&](std::size_t size, int side) {
                const bool strided = index.rank > 0 && index.strides[side][index.rank - 1] != 1;
                return double(strided ? std::max<std::size_t>(size, 32) : size);
            };
            ledger::declare(double(n) * (bytes_per(sizeof(D), 0) + bytes_per(sizeof(S), 1)), 0, 0,
                            sizeof(D) == 8 || sizeof(S) == 8);
            if (StridedIndex<2> packs = index; pack_index(packs, dst, sizeof(D), src, sizeof(S))) {
                QK_LAUNCH((copy_packed_kernel<D, S>), grid_for_unrolled(n / 4), kThreads, 0,
                          stream(), static_cast<Pack4<D>*>(dst), static_cast<const Pack4<S>*>(src),
                          packs, n / 4);
                QK_CUDA_CHECK_LAUNCH("copy_packed_kernel");
                return;
            }
            QK_LAUNCH((copy_strided_kernel<D, S>), grid_for_unrolled(n), kThreads, 0, stream(),
                      static_cast<D*>(dst), static_cast<const S*>(src), index, n);
            QK_CUDA_CHECK_LAUNCH("copy_strided_kernel");
        });
    });
}

void copy_strided_all(DType dst_dtype, DType src_dtype, const std::vector<StridedCopy>& copies) {
    dispatch_all(dst_dtype, [&](auto dst_tag) {
        dispatch_all(src_dtype, [&](auto src_tag) {
            using D = decltype(dst_tag);
            using S = decltype(src_tag);
            PackedCopies<D, S> jobs;
            double bytes = 0;
            for (const StridedCopy& c : copies) {
                const int64_t n = numel_of(c.shape);
                if (n == 0) continue;
                auto index =
                    make_strided_index<2>(c.shape, {&c.dst_strides, &c.src_strides}, "copy");
                if (jobs.count == kMaxCopyJobs ||
                    !pack_index(index, c.dst, sizeof(D), c.src, sizeof(S))) {
                    copy_strided(c.dst, dst_dtype, c.dst_strides, c.src, src_dtype, c.src_strides,
                                 c.shape);  // a launch of its own
                    continue;
                }
                const int j = jobs.count++;
                jobs.dst[j] = static_cast<Pack4<D>*>(c.dst);
                jobs.src[j] = static_cast<const Pack4<S>*>(c.src);
                jobs.index[j] = index;
                jobs.n_packs[j] = n / 4;
                jobs.first_block[j + 1] = jobs.first_block[j] + grid_for_unrolled(n / 4);
                bytes += double(n) * double(sizeof(D) + sizeof(S));
            }
            if (jobs.count == 0) return;
            ledger::declare(bytes, 0, 0, sizeof(D) == 8 || sizeof(S) == 8);
            QK_LAUNCH((copy_packed_all_kernel<D, S>), jobs.first_block[jobs.count], kThreads, 0,
                      stream(), jobs);
            QK_CUDA_CHECK_LAUNCH("copy_packed_all_kernel");
        });
    });
}

void fill(void* dst, DType dtype, int64_t n, double value) {
    if (n == 0) return;
    if (value == 0.0 && !std::signbit(value)) {  // all-zero bits in every dtype: a memset
        fill_zero(dst, static_cast<std::size_t>(n) * dtype_size(dtype));
        return;
    }
    dispatch_all(dtype, [&](auto tag) {
        using T = decltype(tag);
        ledger::declare_elements<T>(0, n);
        QK_LAUNCH((fill_kernel<T>), grid_for(n), kThreads, 0, stream(), static_cast<T*>(dst), n,
                  static_cast<T>(value));
        QK_CUDA_CHECK_LAUNCH("fill_kernel");
    });
}

}  // namespace qk::cuda
