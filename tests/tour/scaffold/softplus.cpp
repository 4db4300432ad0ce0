// Stop 6: the tour's softplus, read top to bottom (the kernels and the dispatch are given; the
// math, softplus_math.h, and the public function at the end are yours): the math (softplus_math.h),
// the cpu kernels, the autograd node, and the public function that checks, dispatches and records.
//
//   forward    y = log(1 + e^x)            saved: x
//   backward   dx = dy · σ(x)
#include "softplus.h"

#include "softplus_cuda.h"
#include "softplus_math.h"

namespace tour {

using qk::Tensor;

namespace cpu {
// y, x: (n).    y = softplus(x)
template <class T>
void softplus_forward(T* y, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = softplus_value(x[i]);
}
// dx, dy, x: (n).    dx = dy · σ(x)
template <class T>
void softplus_backward(T* dx, const T* dy, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * softplus_slope(x[i]);
}
}  // namespace cpu

namespace {

// The one visible dispatch point: the kernel for the tensor's device and dtype.
template <class CpuFn, class CudaFn>
void on_device([[maybe_unused]] const char* op, const Tensor& x, CpuFn cpu_fn,
               [[maybe_unused]] CudaFn cuda_fn) {
    qk::dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        switch (x.device()) {
            case qk::Device::cpu:
                cpu_fn(T{});
                break;
            case qk::Device::cuda:
#ifdef QK_WITH_CUDA
                cuda_fn(T{});
#else
                qk::throw_built_without_cuda(op);
#endif
                break;
        }
    });
}

[[maybe_unused]] Tensor forward(const Tensor& x) {  // x contiguous
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    on_device(
        "softplus", x,
        [&](auto t) {
            using T = decltype(t);
            cpu::softplus_forward(y.data<T>(), x.data<T>(), x.numel());
        },
        [&](auto t) {
            using T = decltype(t);
            cuda::softplus_forward(y.data<T>(), x.data<T>(), x.numel());
        });
    return y;
}

[[maybe_unused]] Tensor backward(const Tensor& dy_any, const Tensor& x) {  // x contiguous
    Tensor dy = dy_any.contiguous();
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    on_device(
        "softplus backward", x,
        [&](auto t) {
            using T = decltype(t);
            cpu::softplus_backward(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
        },
        [&](auto t) {
            using T = decltype(t);
            cuda::softplus_backward(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
        });
    return dx;
}

}  // namespace

// Check x (defined, float32 or float64: name the op and the shape), make it contiguous with
// autograd::contiguous_input, run forward(), and record a node whose backward calls backward()
// with x saved (autograd::record, autograd::saved).
Tensor softplus(const Tensor& x_in) {
    throw qk::Error(
        fmt::format("stop 6: tour::softplus is yours to write (tour/softplus.cpp); "
                    "x {}",
                    x_in.shape()));
}

}  // namespace tour
