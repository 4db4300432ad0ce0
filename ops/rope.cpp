// rope: rotary position embeddings, rotate-half convention (GPT-NeoX, Llama).
//
// Per head vector x ∈ R^D at position t, h = D/2, for each pair i < h with angle a = t·θ^(−2i/D):
//   forward    y_i     = x_i·cos a − x_{i+h}·sin a          (y = x·cos + rotate_half(x)·sin,
//              y_{i+h} = x_{i+h}·cos a + x_i·sin a           rotate_half(x) = (−x_{h:}, x_{:h}))
//   saves      nothing but the tables cos, sin: (T, h); y is linear in x
//   backward   y = R x with R a block rotation by +a, so dx = Rᵀ dy = R(−a) dy:
//              dx_i     = dy_i·cos a + dy_{i+h}·sin a
//              dx_{i+h} = dy_{i+h}·cos a − dy_i·sin a
//              the forward kernel with the sine's sign flipped (direction −1).
// Why it encodes relative position: pair i of q at position m is the complex number q_i·e^{i·m·ω}
// and of k at n is k_i·e^{i·n·ω}; their real dot product is Re(q_i·conj(k_i)·e^{i(m−n)ω}), which
// depends on m − n only (tests/test_rope.cpp checks it by shifting every position).
//
// Tables: the angle t·ω_i is formed in float64 (in float32, t·ω for t ~ 10^3 would lose ~10^-4 of
// the angle before the sine sees it) and cos/sin rounded once to the model's dtype.
// The kernel ladder: v1 is the formula per element; v2 walks a row's two halves with unit
// stride (it vectorises) and splits the G·P rows over the thread pool.
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/threading.h"
#include "ops/on_device.h"

namespace qk {

namespace cpu {

template <class T>
void rope_rotate_v1(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                    int direction) {
    const int64_t h = D / 2;
    for (int64_t g = 0; g < G; ++g)
        for (int64_t t = 0; t < P; ++t)
            for (int64_t i = 0; i < h; ++i) {
                const int64_t row = (g * P + t) * D;
                const T c = cos[t * h + i], s = sin[t * h + i] * T(direction);
                const T a = x[row + i], b = x[row + i + h];
                y[row + i] = a * c - b * s;
                y[row + i + h] = b * c + a * s;
            }
}

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kRopeParallelWork = 1 << 15;

template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, int64_t G, int64_t P, int64_t D,
                 int direction) {
    const int64_t h = D / 2;
    const T sign = T(direction);
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {  // r = g·P + t
            const T* c = cos + (r % P) * h;
            const T* s = sin + (r % P) * h;
            const T *x_lo = x + r * D, *x_hi = x_lo + h;
            T *y_lo = y + r * D, *y_hi = y_lo + h;
#pragma omp simd
            for (int64_t i = 0; i < h; ++i) {
                const T a = x_lo[i], b = x_hi[i], si = s[i] * sign;
                y_lo[i] = a * c[i] - b * si;
                y_hi[i] = b * c[i] + a * si;
            }
        }
    };
    parallel_for(G * P, rows, G * P * D >= kRopeParallelWork);
}

template void rope_rotate_v1<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, int);
template void rope_rotate_v1<double>(double*, const double*, const double*, const double*, int64_t,
                                     int64_t, int64_t, int);
template void rope_rotate<float>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                 int64_t, int);
template void rope_rotate<double>(double*, const double*, const double*, const double*, int64_t,
                                  int64_t, int64_t, int);

}  // namespace cpu

RopeTables rope_tables(int64_t T, int64_t D, double theta, DType dtype, Device device) {
    QK_CHECK(T >= 0 && D > 0 && D % 2 == 0,
             "rope_tables: need T >= 0 positions and an even head dim D > 0, got T = {}, D = {}", T,
             D);
    QK_CHECK(std::isfinite(theta) && theta > 1,
             "rope_tables: the base theta must be finite and > 1, got {}", theta);
    QK_CHECK(is_compute_dtype(dtype), "rope_tables: dtype must be float32 or float64, got {}",
             dtype);
    const int64_t h = D / 2;
    std::vector<double> cos_values(static_cast<size_t>(T * h)), sin_values(cos_values.size());
    for (int64_t i = 0; i < h; ++i) {
        const double frequency = std::pow(theta, -2.0 * static_cast<double>(i) / D);
        for (int64_t t = 0; t < T; ++t) {
            const double angle = static_cast<double>(t) * frequency;
            cos_values[t * h + i] = std::cos(angle);
            sin_values[t * h + i] = std::sin(angle);
        }
    }
    return {from_vector(cos_values, {T, h}, dtype).to(device),
            from_vector(sin_values, {T, h}, dtype).to(device)};
}

void check_rope_tables(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin) {
    QK_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0 && x.size(-1) > 0,
             "{}: x must be (..., T, D) with D even, got {}", op, x.shape());
    QK_CHECK(is_compute_dtype(x.dtype()), "{}: x must be float32 or float64, got {} of shape {}",
             op, x.dtype(), x.shape());
    const Shape table{x.size(-2), x.size(-1) / 2};
    QK_CHECK(cos.shape() == table && sin.shape() == table,
             "{}: for x of shape {} the cos and sin tables must be {}, got {} and {}", op,
             x.shape(), table, cos.shape(), sin.shape());
    QK_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(),
             "{}: the tables must have x's dtype {}, got {} and {}", op, x.dtype(), cos.dtype(),
             sin.dtype());
    QK_CHECK(cos.device() == x.device() && sin.device() == x.device(),
             "{}: x is on {}, the tables on {} and {}", op, x.device(), cos.device(), sin.device());
    QK_CHECK(!cos.requires_grad() && !sin.requires_grad(),
             "{}: the cos/sin tables are constants; detach them (shape {})", op, table);
}

Tensor rope_rotated(const Tensor& x, const Tensor& cos, const Tensor& sin, int direction) {
    const int64_t P = x.size(-2), D = x.size(-1), G = P > 0 ? x.numel() / (P * D) : 0;
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    on_device(
        "rope", x.device(), x.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            cpu::rope_rotate(y.data<T>(), x.data<T>(), cos.data<T>(), sin.data<T>(), G, P, D,
                             direction);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::rope_rotate(y.data<T>(), x.data<T>(), cos.data<T>(), sin.data<T>(), G, P, D,
                              direction);
        });
    return y;
}

Tensor rope(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in) {
    check_rope_tables("rope", x_in, cos_in, sin_in);
    const Tensor x = autograd::contiguous_input(x_in), cos = autograd::contiguous_input(cos_in),
                 sin = autograd::contiguous_input(sin_in);
    Tensor y = rope_rotated(x, cos, sin, +1);
    return autograd::record(
        "rope", y, {x_in},
        [cos = autograd::saved(cos), sin = autograd::saved(sin)](const Tensor& dy) {
            return std::vector<Tensor>{rope_rotated(dy.contiguous(), cos, sin, -1)};  // Rᵀ dy
        });
}

}  // namespace qk
