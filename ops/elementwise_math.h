// The scalar math of every elementwise op, as small functor structs.
//
// Each forward functor maps input value(s) to an output value; each backward functor maps
// (upstream gradient, saved value) to an input gradient. The cpu kernels in elementwise.cpp and
// the CUDA kernels in cuda/elementwise.cu instantiate the same functors, so the two backends
// cannot disagree on the math. QK_HOST_DEVICE marks them callable from device code under nvcc.
//
// exp_fast and tanh_fast are the float32 exp and tanh of the hot loops (softmax, cross_entropy,
// logsumexp, gelu, tanh, soft-cap), written so that a loop of them vectorises: glibc's expf and
// tanhf are scalar calls that stop the loop from vectorising (tanhf, through expm1f, was a third
// of a GPT training step at C = 128: the MLP's gelu on 4C channels, forward and backward).
// Double keeps std:: (float64 is for gradcheck, not speed), and so does device code, where
// expf is a hardware-assisted intrinsic.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/host_device.h"

namespace qk::math {

// float: Cephes' expf, exp(x) = 2^k · e^r with k = round(x / ln 2), r = x − k ln 2 in
// [−ln2/2, ln2/2] (ln 2 split in two for an exact product), e^r by a degree-7 polynomial; max
// relative error 8.5e-8 (1.4 ulp) measured over [−87, 88]. exp_in_range is that core alone, for
// x in [kExpLo, kExpHi], where 2^k is a normal float built from its bits; exp_fast adds the ends:
// x < −87.34 gives 0, x > 88.376 gives +inf (the true overflow is at 88.72), NaN stays NaN.
inline constexpr float kExpLo = -87.33654f, kExpHi = 88.3762626f;
inline float exp_in_range(float x) {
    // 1.5 · 2^23: adding it rounds to an integer (IEEE arithmetic; -ffast-math would fold it)
    constexpr float shifter = 12582912.0f;
    const float k = (x * 1.44269504088896341f + shifter) - shifter;
    const float r = x - k * 0.693359375f - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);  // · 2^k
}

template <class T>
QK_HOST_DEVICE inline T exp_fast(T x) {
#ifdef __CUDA_ARCH__
    return std::exp(x);
#else
    if constexpr (std::is_same_v<T, double>) {
        return std::exp(x);
    } else {
        float xc = x >= kExpLo ? x : kExpLo;  // NaN too: no float-to-int conversion of a NaN
        xc = xc > kExpHi ? kExpHi : xc;
        float y = exp_in_range(xc);
        y = x < kExpLo ? 0.0f : y;
        y = x > kExpHi ? std::numeric_limits<float>::infinity() : y;
        return x != x ? x : y;
    }
#endif
}

// float: Cephes' tanhf. Both branches are computed and one is selected, so the loop vectorises:
//   |x| < 0.625:  tanh x = x + x³ · P(x²), an odd polynomial (no cancellation near 0)
//   otherwise:    tanh |x| = 1 − 2 / (exp(2|x|) + 1), sign restored (exp overflows to inf for
//                 |x| > 44: then 2 / inf = 0 and tanh = ±1, as it should)
// Max relative error 1.8e-7 (3 ulp) measured over [−10, 10]; NaN stays NaN.
template <class T>
QK_HOST_DEVICE inline T tanh_fast(T x) {
#ifdef __CUDA_ARCH__
    return std::tanh(x);
#else
    if constexpr (std::is_same_v<T, double>) {
        return std::tanh(x);
    } else {
        const float a = std::abs(x);
        const float z = x * x;
        float p = -5.70498872745e-3f;
        p = p * z + 2.06390887954e-2f;
        p = p * z - 5.37397155531e-2f;
        p = p * z + 1.33314422036e-1f;
        p = p * z - 3.33332819422e-1f;
        const float small = p * z * x + x;
        const float big = 1.0f - 2.0f / (exp_fast(2.0f * a) + 1.0f);
        return a < 0.625f ? small : std::copysign(big, x);
    }
#endif
}

// ---- binary forward -------------------------------------------------------------------------
struct Add {
    template <class T>
    QK_HOST_DEVICE T operator()(T a, T b) const {
        return a + b;
    }
};
struct Sub {
    template <class T>
    QK_HOST_DEVICE T operator()(T a, T b) const {
        return a - b;
    }
};
struct Mul {
    template <class T>
    QK_HOST_DEVICE T operator()(T a, T b) const {
        return a * b;
    }
};
struct Div {
    template <class T>
    QK_HOST_DEVICE T operator()(T a, T b) const {
        return a / b;
    }
};

// ---- unary forward: y = f(x, s) --------------------------------------------------------------
// s is the op's scalar parameter (pow's exponent, softcap's c); the functors of ops without one
// leave it unnamed. A pointwise op (ops/elementwise.cpp's pointwise()) pairs its forward functor
// F with a backward functor FBackward below.
struct Neg {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return -x;
    }
};
struct AddScalar {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T s) const {
        return x + s;
    }
};
struct MulScalar {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T s) const {
        return x * s;
    }
};
struct RSubScalar {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T s) const {
        return s - x;
    }
};
struct RDivScalar {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T s) const {
        return s / x;
    }
};
struct Pow {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T p) const {
        return std::pow(x, p);
    }
};
struct Exp {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return std::exp(x);
    }
};
struct Log {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return std::log(x);
    }
};
struct Sqrt {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return std::sqrt(x);
    }
};
struct Rsqrt {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return T(1) / std::sqrt(x);
    }
};
struct Abs {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return std::abs(x);
    }
};
struct Tanh {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return tanh_fast(x);
    }
};
struct Relu {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return x > T(0) ? x : T(0);
    }
};
struct Sigmoid {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {  // written so that exp never overflows
        if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
        T e = std::exp(x);
        return e / (T(1) + e);
    }
};
// softcap(x) = c * tanh(x / c): ~x for |x| << c, smoothly bounded by ±c.
struct Softcap {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T c) const {
        return c * tanh_fast(x / c);
    }
};

// gelu(x) ≈ 0.5 x (1 + tanh(u)),  u = sqrt(2/π) (x + 0.044715 x³)   (GPT-2's approximation)
// computed as x · σ(2u) = x / (1 + exp(−2u)), the same function (1 + tanh u = 2σ(2u)): one exp
// and one division, and no cancellation in 1 + tanh u for very negative x.
inline constexpr double kGeluA = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluB = 0.044715;
// exp(t) for a sigmoid written as 1 / (1 + exp(t)), t = −2u for gelu, −x for silu: then
// σ = 1 / (1 + e) and 1 − σ = e σ (no cancellation near 1). The exponent is capped (80 in float,
// 700 in double) so that e stays finite: e = inf would make e σ = inf · 0 = NaN (gelu in float:
// for x < −10). Past the cap σ < 2e-35 (float; 1e-304 double): the function and its slope come
// out as tiny as they truly are, to within that.
//
// float: the exponent is also clamped from below, at kExpLo, instead of flushing exp to 0 there:
// e = exp(−87.3) = 1.2e-38 next to 1 changes neither 1 + e nor any product the callers form, so
// this needs exp_in_range only, without exp_fast's selects. GELU is compute-bound: with this and
// −2u as one multiply-add, forward 1.5x and backward 1.2x faster (bench_elementwise, 1 thread).
// A NaN exponent clamps to kExpLo (a finite e), and the callers' factor x keeps the result NaN.
template <class T>
QK_HOST_DEVICE inline T sigmoid_exp(T t) {
    constexpr T cap = sizeof(T) == 4 ? T(80) : T(700);
#ifdef __CUDA_ARCH__
    return std::exp(t > cap ? cap : t);
#else
    if constexpr (std::is_same_v<T, double>) {
        return std::exp(t > cap ? cap : t);
    } else {
        return exp_in_range(std::min(std::max(kExpLo, t), cap));  // max(lo, NaN) = lo
    }
#endif
}
// e = exp(−2u) at x
template <class T>
QK_HOST_DEVICE inline T gelu_exp(T x) {
    return sigmoid_exp(x * (T(-2 * kGeluA) + T(-2 * kGeluA * kGeluB) * (x * x)));  // −2u
}
struct Gelu {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return x / (T(1) + gelu_exp(x));
    }
};

// silu(x) = x σ(x) = x / (1 + exp(−x))   (SiLU, or swish; the gate of SwiGLU), e = exp(−x)
template <class T>
QK_HOST_DEVICE inline T silu_exp(T x) {
    return sigmoid_exp(-x);
}
struct Silu {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        return x / (T(1) + silu_exp(x));
    }
};

// ---- unary backward: dx = f(dy, saved, s) -----------------------------------------------------
// saved is the op's input x or its output y, as the op's call to pointwise() says (Saves::input
// or Saves::output); each comment names which.
// d/dx exp x = y, with y saved
struct ExpBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T v, T) const {
        return dy * v;
    }
};
// d/dx log x = 1/x, with x saved
struct LogBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const {
        return dy / x;
    }
};
// d/dx sqrt x = 1 / (2 y), with y saved
struct SqrtBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T) const {
        return dy * T(0.5) / y;
    }
};
// d/dx x^(-1/2) = -1/2 y³, with y saved
struct RsqrtBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T) const {
        return dy * T(-0.5) * y * y * y;
    }
};
// d/dx |x| = sign(x) (0 at 0), with x saved
struct AbsBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const {
        return x > T(0) ? dy : (x < T(0) ? -dy : T(0));
    }
};
// d/dx tanh x = 1 - y², with y saved
struct TanhBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T) const {
        return dy * (T(1) - y * y);
    }
};
// d/dx σ(x) = y (1 - y), with y saved
struct SigmoidBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T) const {
        return dy * y * (T(1) - y);
    }
};
// d/dx relu x = [y > 0], with y saved
struct ReluBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T) const {
        return y > T(0) ? dy : T(0);
    }
};
// d/dx c tanh(x/c) = 1 - (y/c)², with y saved
struct SoftcapBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T c) const {
        T t = y / c;
        return dy * (T(1) - t * t);
    }
};
// d/dx x^p = p x^(p-1), with x saved
struct PowBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T p) const {
        return dy * p * std::pow(x, p - T(1));
    }
};
// d/dx s/x = -s/x², with x saved
struct RDivScalarBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T s) const {
        return -dy * s / (x * x);
    }
};
// d/dx gelu = 0.5 (1 + tanh u) + 0.5 x (1 − tanh² u) du/dx,   du/dx = sqrt(2/π) (1 + 3·0.044715 x²)
//           = s + 2 x s (1 − s) du/dx,                         s = σ(2u)
// since 0.5 (1 + tanh u) = s and 0.5 (1 − tanh² u) = 2 s (1 − s).
struct GeluBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const {
        const T e = gelu_exp(x), s = T(1) / (T(1) + e);
        const T du_dx = T(kGeluA) * (T(1) + T(3 * kGeluB) * x * x);
        return dy * (s + T(2) * x * s * (e * s) * du_dx);
    }
};

// d/dx silu = σ(x) + x σ(x) (1 − σ(x)) = s (1 + x (1 − s)),   s = σ(x), with x saved
// and 1 − s = e s with e = exp(−x): no cancellation where s is near 1.
struct SiluBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const {
        const T e = silu_exp(x), s = T(1) / (T(1) + e);
        return dy * s * (T(1) + x * (e * s));
    }
};

}  // namespace qk::math
