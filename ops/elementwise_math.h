// The scalar math of every elementwise op, as small functor structs.
//
// Each forward functor maps input value(s) to an output value; each backward functor maps
// (upstream gradient, saved value) to an input gradient. The cpu kernels in elementwise.cpp and
// the CUDA kernels in cuda/elementwise.cu instantiate the same functors, so the two backends
// cannot disagree on the math. QK_HOST_DEVICE marks them callable from device code under nvcc.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define QK_HOST_DEVICE __host__ __device__
#else
#define QK_HOST_DEVICE
#endif

namespace qk::math {

// ---- binary forward -------------------------------------------------------------------------
struct Add { template <class T> QK_HOST_DEVICE T operator()(T a, T b) const { return a + b; } };
struct Sub { template <class T> QK_HOST_DEVICE T operator()(T a, T b) const { return a - b; } };
struct Mul { template <class T> QK_HOST_DEVICE T operator()(T a, T b) const { return a * b; } };
struct Div { template <class T> QK_HOST_DEVICE T operator()(T a, T b) const { return a / b; } };

// ---- unary forward (s is the op's scalar parameter, unused by most) ---------------------------
struct Neg { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return -x; } };
struct AddScalar { template <class T> QK_HOST_DEVICE T operator()(T x, T s) const { return x + s; } };
struct MulScalar { template <class T> QK_HOST_DEVICE T operator()(T x, T s) const { return x * s; } };
struct RSubScalar { template <class T> QK_HOST_DEVICE T operator()(T x, T s) const { return s - x; } };
struct RDivScalar { template <class T> QK_HOST_DEVICE T operator()(T x, T s) const { return s / x; } };
struct Pow { template <class T> QK_HOST_DEVICE T operator()(T x, T p) const { return std::pow(x, p); } };
struct Exp { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return std::exp(x); } };
struct Log { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return std::log(x); } };
struct Sqrt { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return T(1) / std::sqrt(x); } };
struct Abs { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return std::abs(x); } };
struct Tanh { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return std::tanh(x); } };
struct Relu { template <class T> QK_HOST_DEVICE T operator()(T x, T) const { return x > T(0) ? x : T(0); } };
struct Sigmoid {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {  // written so that exp never overflows
        if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
        T e = std::exp(x);
        return e / (T(1) + e);
    }
};
// softcap(x) = c * tanh(x / c): ~x for |x| << c, smoothly bounded by ±c.
struct Softcap { template <class T> QK_HOST_DEVICE T operator()(T x, T c) const { return c * std::tanh(x / c); } };

// gelu(x) ≈ 0.5 x (1 + tanh(u)),  u = sqrt(2/π) (x + 0.044715 x³)   (GPT-2's approximation)
inline constexpr double kGeluA = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluB = 0.044715;
struct Gelu {
    template <class T>
    QK_HOST_DEVICE T operator()(T x, T) const {
        T u = T(kGeluA) * (x + T(kGeluB) * x * x * x);
        return T(0.5) * x * (T(1) + std::tanh(u));
    }
};

// ---- unary backward: dx = f(dy, saved, s) -----------------------------------------------------
// dy/dx = y for exp, with y saved
struct DyTimes { template <class T> QK_HOST_DEVICE T operator()(T dy, T v, T) const { return dy * v; } };
// d/dx log x = 1/x, with x saved
struct DyOver { template <class T> QK_HOST_DEVICE T operator()(T dy, T x, T) const { return dy / x; } };
// d/dx sqrt x = 1 / (2 y), with y saved
struct SqrtBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T y, T) const { return dy * T(0.5) / y; } };
// d/dx x^(-1/2) = -1/2 y³, with y saved
struct RsqrtBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T y, T) const { return dy * T(-0.5) * y * y * y; } };
// d/dx |x| = sign(x) (0 at 0), with x saved
struct AbsBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const { return x > T(0) ? dy : (x < T(0) ? -dy : T(0)); }
};
// d/dx tanh x = 1 - y², with y saved
struct TanhBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T y, T) const { return dy * (T(1) - y * y); } };
// d/dx σ(x) = y (1 - y), with y saved
struct SigmoidBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T y, T) const { return dy * y * (T(1) - y); } };
// d/dx relu x = [y > 0], with y saved
struct ReluBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T y, T) const { return y > T(0) ? dy : T(0); } };
// d/dx c tanh(x/c) = 1 - (y/c)², with y saved
struct SoftcapBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T y, T c) const { T t = y / c; return dy * (T(1) - t * t); }
};
// d/dx x^p = p x^(p-1), with x saved
struct PowBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T x, T p) const { return dy * p * std::pow(x, p - T(1)); } };
// d/dx s/x = -s/x², with x saved
struct RDivBackward { template <class T> QK_HOST_DEVICE T operator()(T dy, T x, T s) const { return -dy * s / (x * x); } };
// d/dx gelu = 0.5 (1 + tanh u) + 0.5 x (1 - tanh² u) du/dx,  du/dx = sqrt(2/π)(1 + 3·0.044715 x²)
struct GeluBackward {
    template <class T>
    QK_HOST_DEVICE T operator()(T dy, T x, T) const {
        T u = T(kGeluA) * (x + T(kGeluB) * x * x * x);
        T th = std::tanh(u);
        T du_dx = T(kGeluA) * (T(1) + T(3 * kGeluB) * x * x);
        return dy * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du_dx);
    }
};

}  // namespace qk::math
