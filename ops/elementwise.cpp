// Elementwise ops.
//
// Forward: out[i] = f(a[i], b[i]) with numpy broadcasting (a and b are read through strides, a
// broadcast dim has stride 0, so nothing is copied), or y[i] = f(x[i]) for the unary ops.
//
// Backward of a binary op: the chain rule per element, then the sum over every dim that was
// broadcast, because a broadcast input element fed all the outputs along that dim:
//     add: da = sum_to(dy)           db = sum_to(dy)
//     sub: da = sum_to(dy)           db = sum_to(-dy)
//     mul: da = sum_to(dy * b)       db = sum_to(dy * a)          saves a, b
//     div: da = sum_to(dy / b)       db = sum_to(-dy * y / b)     saves b, y = a / b
// Backward of a unary op: dx = dy * f'(x), with f' written through whichever of x or y = f(x) is
// cheaper (tanh: 1 - y², exp: y, log: 1/x); ops/elementwise_math.h holds each f and f'.
#include "ops/elementwise.h"

#include "autograd/node.h"
#include "core/strided.h"
#include "core/threading.h"
#include "ops/elementwise_math.h"
#include "ops/on_device.h"
#include "ops/reduce.h"
#include "ops/rounded_copy.h"

namespace qk {

namespace cpu {

// y: (n), x: (n), both contiguous.   y = f(x, s)
template <class T, class F>
void unary_forward(T* y, const T* x, int64_t n, T s, F f) {
    auto range = [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) y[i] = f(x[i], s);
    };
    parallel_for(n, range, n >= kParallelElementwise);
}

// dx, dy, saved: (n), contiguous.   dx = f(dy, saved, s)
template <class T, class F>
void unary_backward(T* dx, const T* dy, const T* saved, int64_t n, T s, F f) {
    auto range = [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) dx[i] = f(dy[i], saved[i], s);
    };
    parallel_for(n, range, n >= kParallelElementwise);
}

// out: shape, contiguous. a, b: read with the given strides (0 on broadcast dims).
template <class T, class F>
void binary_forward(T* out, const T* a, const Shape& a_strides, const T* b, const Shape& b_strides,
                    const Shape& shape, F f) {
    const Shape out_strides = contiguous_strides(shape);
    const int64_t sa = shape.empty() ? 0 : a_strides.back();
    const int64_t sb = shape.empty() ? 0 : b_strides.back();
    auto run = [&](const auto& off, int64_t n) {
        T* o = out + off[0];
        const T* pa = a + off[1];
        const T* pb = b + off[2];
        // The common stride patterns get their own loops so that they vectorise.
        if (sa == 1 && sb == 1)
            for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
        else if (sa == 1 && sb == 0)
            for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[0]);
        else if (sa == 0 && sb == 1)
            for (int64_t i = 0; i < n; ++i) o[i] = f(pa[0], pb[i]);
        else
            for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i * sa], pb[i * sb]);
    };
    parallel_for_each_run<3>(shape, {&out_strides, &a_strides, &b_strides}, run);
}

// dst: shape, any strides without stride-0 dims (a view into a larger tensor is fine);
// src: read with src_strides (0 on broadcast dims).    dst += src
template <class T>
void accumulate(T* dst, const Shape& dst_strides, const T* src, const Shape& src_strides,
                const Shape& shape) {
    const int64_t sd = shape.empty() ? 0 : dst_strides.back();
    const int64_t ss = shape.empty() ? 0 : src_strides.back();
    auto run = [&](const auto& off, int64_t n) {
        T* d = dst + off[0];
        const T* p = src + off[1];
        if (sd == 1 && ss == 1)
            for (int64_t i = 0; i < n; ++i) d[i] += p[i];
        else if (sd == 1 && ss == 0)
            for (int64_t i = 0; i < n; ++i) d[i] += p[0];
        else
            for (int64_t i = 0; i < n; ++i) d[i * sd] += p[i * ss];
    };
    parallel_for_each_run<2>(shape, {&dst_strides, &src_strides}, run);
}

}  // namespace cpu

namespace {

// Strides that read `t` as if it had been expanded to `shape` (0 along broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
    Shape strides(shape.size(), 0);
    const size_t lead = shape.size() - t.shape().size();
    for (size_t i = 0; i < t.shape().size(); ++i)
        strides[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
    return strides;
}

void check_same_kind(const char* op, const Tensor& a, const Tensor& b) {
    QK_CHECK(a.dtype() == b.dtype(), "{}: dtypes differ: {} {} and {} {}", op, a.dtype(), a.shape(),
             b.dtype(), b.shape());
    QK_CHECK(is_compute_dtype(a.dtype()),
             "{}: needs float32 or float64 tensors, got {} {} and {} {} (cast int32 ids with "
             ".to(kF32))",
             op, a.dtype(), a.shape(), b.dtype(), b.shape());
    QK_CHECK(a.device() == b.device(), "{}: devices differ: {} is on {}, {} is on {}", op,
             a.shape(), a.device(), b.shape(), b.device());
}

template <class F>
Tensor map_binary(const char* op, const Tensor& a, const Tensor& b, F f) {
    check_same_kind(op, a, b);
    Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    on_device(
        op, a.device(), a.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::binary_forward(out.data<T>(), a.data<T>(), broadcast_strides(a, shape),
                                b.data<T>(), broadcast_strides(b, shape), shape, f);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::binary_forward<T, F>(out.data<T>(), a.data<T>(), broadcast_strides(a, shape),
                                       b.data<T>(), broadcast_strides(b, shape), shape);
        });
    return out;
}

// y = f(x, s), elementwise; x contiguous (autograd::contiguous_input). rounded_copy: y's rounding
// written beside it on cuda (ops/rounded_copy.h).
template <class F>
Tensor map_unary(const char* op, const Tensor& x, double s, F f,
                 Precision rounded_copy = Precision::full) {
    QK_CHECK(is_compute_dtype(x.dtype()),
             "{}: needs a float32 or float64 tensor, got {} of shape {} (cast int32 ids with "
             ".to(kF32))",
             op, x.dtype(), x.shape());
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    const Tensor y_half = rounded_copy_for(y, rounded_copy);
    on_device(
        op, x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::unary_forward(y.data<T>(), x.data<T>(), x.numel(), T(s), f);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::unary_forward<T, F>(y.data<T>(), x.data<T>(), x.numel(), T(s), half_bits(y_half),
                                      rounded_copy == Precision::bf16);
        });
    keep_rounded_copy(y, y_half);
    return y;
}

// dx = f(dy, saved, s), elementwise; dy and saved have the same shape.
template <class F>
Tensor map_backward([[maybe_unused]] const char* op, const Tensor& dy_in, const Tensor& saved,
                    double s, F f) {
    Tensor dy = dy_in.contiguous();
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    on_device(
        op, dy.device(), dy.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::unary_backward(dx.data<T>(), dy.data<T>(), saved.data<T>(), dy.numel(), T(s), f);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::unary_backward<T, F>(dx.data<T>(), dy.data<T>(), saved.data<T>(), dy.numel(),
                                       T(s));
        });
    return dx;
}

using autograd::Grads;

// What the backward functor of a pointwise op reads besides dy: the op's input x or its output
// y = f(x), whichever its derivative is cheaper through (tanh: 1 − y², log: 1/x).
enum class Saves { input, output };

// A unary op y = Forward(x, s), dx = Backward(dy, saved, s) with saved = x or y as `saves` says;
// s is the op's scalar parameter (pow's exponent, softcap's c).
template <class Forward, class Backward>
Tensor pointwise(const char* op, const Tensor& x_in, double s, Saves saves,
                 Precision rounded_copy = Precision::full) {
    const Tensor x = autograd::contiguous_input(x_in);
    Tensor y = map_unary(op, x, s, Forward{}, rounded_copy);
    return autograd::record(
        op, y, {x_in},
        [op, s, saved = autograd::saved(saves == Saves::output ? y : x)](const Tensor& dy) {
            return Grads{map_backward(op, dy, saved, s, Backward{})};
        });
}

// The same for an op without a parameter: its functors ignore s.
template <class Forward, class Backward>
Tensor pointwise(const char* op, const Tensor& x, Saves saves) {
    return pointwise<Forward, Backward>(op, x, 0.0, saves);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
    Tensor y = map_binary("add", a, b, math::Add{});
    return autograd::record("add", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& dy) {
        return Grads{sum_to(dy, sa), sum_to(dy, sb)};
    });
}

Tensor sub(const Tensor& a, const Tensor& b) {
    Tensor y = map_binary("sub", a, b, math::Sub{});
    return autograd::record("sub", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& dy) {
        return Grads{sum_to(dy, sa), sum_to(neg(dy), sb)};
    });
}

Tensor mul(const Tensor& a, const Tensor& b) {
    Tensor y = map_binary("mul", a, b, math::Mul{});
    return autograd::record("mul", y, {a, b},
                            [a = autograd::saved(a), b = autograd::saved(b)](const Tensor& dy) {
                                return Grads{sum_to(dy * b, a.shape()), sum_to(dy * a, b.shape())};
                            });
}

Tensor div(const Tensor& a, const Tensor& b) {
    Tensor y = map_binary("div", a, b, math::Div{});
    return autograd::record(
        "div", y, {a, b},
        [sa = a.shape(), b = autograd::saved(b), y = autograd::saved(y)](const Tensor& dy) {
            Tensor da = dy / b;
            return Grads{sum_to(da, sa), sum_to(neg(da * y), b.shape())};
        });
}

Tensor add(const Tensor& x, double s) {
    Tensor y = map_unary("add", autograd::contiguous_input(x), s, math::AddScalar{});
    return autograd::record("add_scalar", y, {x}, [](const Tensor& dy) { return Grads{dy}; });
}

Tensor mul(const Tensor& x, double s) {
    Tensor y = map_unary("mul", autograd::contiguous_input(x), s, math::MulScalar{});
    return autograd::record("mul_scalar", y, {x}, [s](const Tensor& dy) { return Grads{dy * s}; });
}

Tensor rsub(const Tensor& x, double s) {
    Tensor y = map_unary("rsub", autograd::contiguous_input(x), s, math::RSubScalar{});
    return autograd::record("rsub_scalar", y, {x}, [](const Tensor& dy) { return Grads{neg(dy)}; });
}

Tensor neg(const Tensor& x) {
    Tensor y = map_unary("neg", autograd::contiguous_input(x), 0, math::Neg{});
    return autograd::record("neg", y, {x}, [](const Tensor& dy) { return Grads{neg(dy)}; });
}

Tensor rdiv(const Tensor& x, double s) {
    return pointwise<math::RDivScalar, math::RDivScalarBackward>("rdiv", x, s, Saves::input);
}
Tensor pow(const Tensor& x, double p) {
    return pointwise<math::Pow, math::PowBackward>("pow", x, p, Saves::input);
}
Tensor exp(const Tensor& x) {
    return pointwise<math::Exp, math::ExpBackward>("exp", x, Saves::output);
}
Tensor log(const Tensor& x) {
    return pointwise<math::Log, math::LogBackward>("log", x, Saves::input);
}
Tensor sqrt(const Tensor& x) {
    return pointwise<math::Sqrt, math::SqrtBackward>("sqrt", x, Saves::output);
}
Tensor rsqrt(const Tensor& x) {
    return pointwise<math::Rsqrt, math::RsqrtBackward>("rsqrt", x, Saves::output);
}
Tensor abs(const Tensor& x) {
    return pointwise<math::Abs, math::AbsBackward>("abs", x, Saves::input);
}
Tensor tanh(const Tensor& x) {
    return pointwise<math::Tanh, math::TanhBackward>("tanh", x, Saves::output);
}
Tensor sigmoid(const Tensor& x) {
    return pointwise<math::Sigmoid, math::SigmoidBackward>("sigmoid", x, Saves::output);
}
Tensor relu(const Tensor& x) {
    return pointwise<math::Relu, math::ReluBackward>("relu", x, Saves::output);
}
Tensor gelu(const Tensor& x, Precision rounded_copy) {
    return pointwise<math::Gelu, math::GeluBackward>("gelu", x, 0.0, Saves::input, rounded_copy);
}
Tensor silu(const Tensor& x) {
    return pointwise<math::Silu, math::SiluBackward>("silu", x, Saves::input);
}

Tensor softcap(const Tensor& x, double c) {
    QK_CHECK(c > 0, "softcap: cap c must be > 0, got {} (input shape {})", c, x.shape());
    return pointwise<math::Softcap, math::SoftcapBackward>("softcap", x, c, Saves::output);
}

void add_(Tensor& dst, const Tensor& src) {
    check_same_kind("add_", dst, src);
    for (size_t d = 0; d < dst.shape().size(); ++d)
        QK_CHECK(dst.shape()[d] == 1 || dst.strides()[d] != 0,
                 "add_: destination {} has strides {}: an expanded (stride 0) dim would be written "
                 "more than once",
                 dst.shape(), dst.strides());
    QK_CHECK(broadcast_shapes(dst.shape(), src.shape(), "add_") == dst.shape(),
             "add_: source {} does not broadcast to destination {}", src.shape(), dst.shape());
    mark_written(dst);
    on_device(
        "add_", dst.device(), dst.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::accumulate(dst.data<T>(), dst.strides(), src.data<T>(),
                            broadcast_strides(src, dst.shape()), dst.shape());
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::accumulate(dst.data<T>(), dst.strides(), src.data<T>(),
                             broadcast_strides(src, dst.shape()), dst.shape());
        });
}

}  // namespace qk
