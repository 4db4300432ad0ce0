// cuda/copy.cu — the device side of copy_into (core/tensor.cpp) and of full/zeros
// (core/factory.cpp). Built as CUDA by nvcc, or as C++ against cuda/emu in the emulation build (see
// cuda/runtime.h).
//
// float32 -> bf16 casts use the device's conversion instruction (cuda/bf16_convert.h), which
// rounds every non-NaN float to the cpu's bf16.
//
// Work split: one thread per element, 256 threads per block, a grid-stride loop past 65535
// blocks. Each thread turns its logical index into the two operands' offsets (StridedIndex), so a
// transposed, narrowed or expanded view is gathered in one pass with no intermediate copy.
// Consecutive threads write consecutive dst elements (dst is usually contiguous), so the writes
// coalesce; the reads are as scattered as the source view is.
//
// CPU twins: copy_cpu in core/tensor.cpp (the for_each_run loop) and make_cpu in core/factory.cpp.
#include <cmath>
#include <cstdint>

#include "core/tensor.h"
#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"

namespace qk::cuda {

namespace {

// dst, src: read through index (dst's offsets first) over n logical elements.
template <class D, class S>
__global__ void copy_strided_kernel(D* dst, const S* src, StridedIndex<2> index, int64_t n) {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += step) {
        int64_t off[2];
        index.offsets(i, off);
        dst[off[0]] = convert_element<D>(src[off[1]]);
    }
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
            QK_LAUNCH((copy_strided_kernel<D, S>), grid_for(n), kThreads, 0, stream(),
                      static_cast<D*>(dst), static_cast<const S*>(src), index, n);
            QK_CUDA_CHECK_LAUNCH("copy_strided_kernel");
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
        QK_LAUNCH((fill_kernel<T>), grid_for(n), kThreads, 0, stream(), static_cast<T*>(dst), n,
                  static_cast<T>(value));
        QK_CUDA_CHECK_LAUNCH("fill_kernel");
    });
}

}  // namespace qk::cuda
