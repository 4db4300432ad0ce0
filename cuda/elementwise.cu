// cuda/elementwise.cu — the elementwise ops on the device: unary maps and their backward, binary
// arithmetic with numpy broadcasting, and the in-place accumulation behind autograd's `+=`.
// Built as CUDA by nvcc, or as C++ against cuda/emu in the emulation build (see cuda/runtime.h).
//
// Work split: four output elements per thread, 256 threads per block (8 warps), a grid-stride loop
// past 65535 blocks; a thread loads its four before storing any (unrolled_grid_loop). Elementwise
// work has no reuse, so the only thing that matters is memory traffic: consecutive threads touch
// consecutive elements of the contiguous output, so a warp's 32 loads and stores coalesce into a
// few 128-byte transactions. The broadcast operands of a binary op are read through their strides
// (StridedIndex; stride 0 on a broadcast dim, so a bias row is read from cache by every row of
// threads and never materialised).
//
// The math is not here: every kernel instantiates the functors of ops/elementwise_math.h, the
// same ones the cpu kernels use, so the two backends cannot disagree on a formula.
// The backward of a broadcast binary op (summing the gradient over broadcast dims) is sum_to,
// which runs the reduction kernels of cuda/reduce.cu.
//
// CPU twins: cpu::unary_forward, cpu::unary_backward, cpu::binary_forward and cpu::accumulate in
// ops/elementwise.cpp.
#include <cstdint>

#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/strided_index.h"
#include "ops/elementwise.h"
#include "ops/elementwise_math.h"

namespace qk::cuda {

namespace {

// Each kernel runs unrolled_grid_loop (cuda/strided_index.h): four elements per thread in flight.

// y, x: (n) contiguous; y_half: null or (n).    y[i] = f(x[i], s), y_half[i] = round(y[i])
// y null: only the rounding is written (its one reader is a mixed GEMM: ops/matmul.h's
// linear_gelu_linear).
template <class T, class F>
__global__ void unary_forward_kernel(T* y, const T* x, int64_t n, T s, uint16_t* y_half,
                                     bool half_is_bf16) {
    const F f{};
    unrolled_grid_loop(
        n, [&](int64_t i) { return x[i]; },
        [&](int64_t i, T xi) {
            const T yi = f(xi, s);
            if (y) y[i] = yi;
            store_half(y_half, i, yi, half_is_bf16);
        });
}

// dx, dy, saved: (n) contiguous.    dx[i] = f(dy[i], saved[i], s)
template <class T, class F>
__global__ void unary_backward_kernel(T* dx, const T* dy, const T* saved, int64_t n, T s) {
    const F f{};
    struct Pair {
        T dy, saved;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            return Pair{dy[i], saved[i]};
        },
        [&](int64_t i, Pair p) { dx[i] = f(p.dy, p.saved, s); });
}

// out: (n) contiguous, the broadcast shape; a, b: offsets from index (a's first).
//     out[i] = f(a[i], b[i])
template <class T, class F>
__global__ void binary_forward_kernel(T* out, const T* a, const T* b, StridedIndex<2> index,
                                      int64_t n) {
    const F f{};
    struct Pair {
        T a, b;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            int64_t off[2];
            index.offsets(i, off);
            return Pair{a[off[0]], b[off[1]]};
        },
        [&](int64_t i, Pair p) { out[i] = f(p.a, p.b); });
}

// dst, src: offsets from index (dst's first). dst has no stride-0 dim, so each element has one
// writer and no atomics are needed.    dst[i] += src[i]
template <class T>
__global__ void accumulate_kernel(T* dst, const T* src, StridedIndex<2> index, int64_t n) {
    struct Sum {
        T* at;
        T value;
    };
    unrolled_grid_loop(
        n,
        [&](int64_t i) {
            int64_t off[2];
            index.offsets(i, off);
            return Sum{dst + off[0], dst[off[0]] + src[off[1]]};
        },
        [&](int64_t, Sum s) { *s.at = s.value; });
}

}  // namespace

template <class T, class F>
void unary_forward(T* y, const T* x, int64_t n, T s, uint16_t* y_half, bool half_is_bf16) {
    if (n == 0) return;
    QK_CHECK(y || y_half, "unary_forward: neither y nor its rounding to write ({} elements)", n);
    ledger::declare(double(sizeof(T)) * double(y ? 2 * n : n) + (y_half ? 2.0 * double(n) : 0.0),
                    double(n), 0, sizeof(T) == 8);
    QK_LAUNCH((unary_forward_kernel<T, F>), grid_for_unrolled(n), kThreads, 0, stream(), y, x, n, s,
              y_half, half_is_bf16);
    QK_CUDA_CHECK_LAUNCH("unary_forward_kernel");
}

template <class T, class F>
void unary_backward(T* dx, const T* dy, const T* saved, int64_t n, T s) {
    if (n == 0) return;
    ledger::declare_elements<T>(2 * n, n, 2 * n);
    QK_LAUNCH((unary_backward_kernel<T, F>), grid_for_unrolled(n), kThreads, 0, stream(), dx, dy,
              saved, n, s);
    QK_CUDA_CHECK_LAUNCH("unary_backward_kernel");
}

template <class T, class F>
void binary_forward(T* out, const T* a, const Shape& a_strides, const T* b, const Shape& b_strides,
                    const Shape& shape) {
    const int64_t n = numel_of(shape);
    if (n == 0) return;
    const auto index = make_strided_index<2>(shape, {&a_strides, &b_strides}, "elementwise");
    ledger::declare_elements<T>(2 * n, n, n);
    QK_LAUNCH((binary_forward_kernel<T, F>), grid_for_unrolled(n), kThreads, 0, stream(), out, a, b,
              index, n);
    QK_CUDA_CHECK_LAUNCH("binary_forward_kernel");
}

template <class T>
void accumulate(T* dst, const Shape& dst_strides, const T* src, const Shape& src_strides,
                const Shape& shape) {
    const int64_t n = numel_of(shape);
    if (n == 0) return;
    const auto index = make_strided_index<2>(shape, {&dst_strides, &src_strides}, "add_");
    ledger::declare_elements<T>(2 * n, n, n);
    QK_LAUNCH((accumulate_kernel<T>), grid_for_unrolled(n), kThreads, 0, stream(), dst, src, index,
              n);
    QK_CUDA_CHECK_LAUNCH("accumulate_kernel");
}

// ---- the instantiations ops/elementwise.cpp uses ---------------------------------------------
// QK_UNARY(F): the forward of a unary op without autograd functor of its own (neg, the scalar
// arithmetic); QK_POINTWISE(F): a pointwise op, its forward F and its backward FBackward;
// QK_BINARY(F): a binary op.
#define QK_UNARY(F)                                                                              \
    template void unary_forward<float, math::F>(float*, const float*, int64_t, float, uint16_t*, \
                                                bool);                                           \
    template void unary_forward<double, math::F>(double*, const double*, int64_t, double,        \
                                                 uint16_t*, bool);
#define QK_UNARY_BACKWARD(F)                                                                      \
    template void unary_backward<float, math::F>(float*, const float*, const float*, int64_t,     \
                                                 float);                                          \
    template void unary_backward<double, math::F>(double*, const double*, const double*, int64_t, \
                                                  double);
#define QK_POINTWISE(F) QK_UNARY(F) QK_UNARY_BACKWARD(F##Backward)
#define QK_BINARY(F)                                                                               \
    template void binary_forward<float, math::F>(float*, const float*, const Shape&, const float*, \
                                                 const Shape&, const Shape&);                      \
    template void binary_forward<double, math::F>(double*, const double*, const Shape&,            \
                                                  const double*, const Shape&, const Shape&);

QK_UNARY(Neg)
QK_UNARY(AddScalar)
QK_UNARY(MulScalar)
QK_UNARY(RSubScalar)

QK_POINTWISE(RDivScalar)
QK_POINTWISE(Pow)
QK_POINTWISE(Exp)
QK_POINTWISE(Log)
QK_POINTWISE(Sqrt)
QK_POINTWISE(Rsqrt)
QK_POINTWISE(Abs)
QK_POINTWISE(Tanh)
QK_POINTWISE(Sigmoid)
QK_POINTWISE(Relu)
QK_POINTWISE(Gelu)
QK_POINTWISE(Silu)
QK_POINTWISE(Softcap)

QK_BINARY(Add)
QK_BINARY(Sub)
QK_BINARY(Mul)
QK_BINARY(Div)

template void accumulate<float>(float*, const Shape&, const float*, const Shape&, const Shape&);
template void accumulate<double>(double*, const Shape&, const double*, const Shape&, const Shape&);

}  // namespace qk::cuda
