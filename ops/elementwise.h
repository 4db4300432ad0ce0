// Elementwise ops: arithmetic with numpy broadcasting, scalar forms, and the pointwise functions.
#pragma once

#include "core/tensor.h"

namespace qk {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& x, double s);
Tensor mul(const Tensor& x, double s);
Tensor rsub(const Tensor& x, double s);  // s - x
Tensor rdiv(const Tensor& x, double s);  // s / x

Tensor neg(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// tanh approximation (GPT-2). rounded_copy bf16/fp16: on cuda, float32, the output rounded in the
// same pass and kept as its cast copy for the mixed-precision Linear that reads it next
// (ops/rounded_copy.h); the values do not change.
Tensor gelu(const Tensor& x, Precision rounded_copy = Precision::full);
Tensor silu(const Tensor& x);               // x σ(x), SwiGLU's gate
Tensor softcap(const Tensor& x, double c);  // c * tanh(x / c), fused

// In place, not recorded by autograd (gradient accumulation, optimizers): dst += src,
// src broadcast to dst's shape. dst may be any view that does not repeat elements (a slice of a
// larger tensor, a transpose), not an expanded one.
void add_(Tensor& dst, const Tensor& src);

// Launchers of cuda/elementwise.cu (device pointers). F is a functor of ops/elementwise_math.h;
// the .cu instantiates each one the ops above use.
namespace cuda {
// y, x: (n) contiguous; y_half: null or (n), y rounded (bf16 bits if half_is_bf16, else fp16);
// y may be null when y_half is not (the rounding only).    y = f(x, s)
template <class T, class F>
void unary_forward(T* y, const T* x, int64_t n, T s, uint16_t* y_half = nullptr,
                   bool half_is_bf16 = true);
// dx, dy, saved: (n) contiguous.    dx = f(dy, saved, s)
template <class T, class F>
void unary_backward(T* dx, const T* dy, const T* saved, int64_t n, T s);
// out: shape, contiguous; a, b: read through their strides (0 on broadcast dims).
//     out = f(a, b)
template <class T, class F>
void binary_forward(T* out, const T* a, const Shape& a_strides, const T* b, const Shape& b_strides,
                    const Shape& shape);
// dst: shape, through dst_strides (no stride-0 dim); src through src_strides.    dst += src
template <class T>
void accumulate(T* dst, const Shape& dst_strides, const T* src, const Shape& src_strides,
                const Shape& shape);
}  // namespace cuda

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& x, double s) { return add(x, s); }
inline Tensor operator+(double s, const Tensor& x) { return add(x, s); }
inline Tensor operator-(const Tensor& x, double s) { return add(x, -s); }
inline Tensor operator-(double s, const Tensor& x) { return rsub(x, s); }
inline Tensor operator*(const Tensor& x, double s) { return mul(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return mul(x, s); }
inline Tensor operator/(const Tensor& x, double s) { return mul(x, 1.0 / s); }
inline Tensor operator/(double s, const Tensor& x) { return rdiv(x, s); }

}  // namespace qk
