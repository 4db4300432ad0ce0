// The gated product of a GLU MLP, fused.
//
// Forward, per element, with a = act(g) (silu or tanh-GELU, ops/elementwise_math.h):
//     y = a · u                                       saves g and u (a is recomputed)
// Backward, the product rule then the activation's chain rule:
//     du = dy · a                                     (the product's term for u)
//     dg = act'(g) · (dy · u)                         (the product's term for a, through act)
// Each term is computed in the order the unfused composition act(g) * u computes it (the
// product's backward gives dy · u and dy · a, the activation's backward multiplies by act'), so
// the fused op gives the same bits: one launch forward and one backward on cuda, where the
// composition took two and three.
#include "ops/glu.h"

#include "autograd/node.h"
#include "core/strided.h"
#include "core/threading.h"
#include "ops/elementwise_math.h"
#include "ops/on_device.h"
#include "ops/rounded_copy.h"

namespace qk {

namespace cpu {

// y, gate, up: (n) contiguous.    y = act(gate) · up
template <class T, class Act>
void glu_forward(T* y, const T* gate, const T* up, int64_t n) {
    auto range = [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) y[i] = Act{}(gate[i], T(0)) * up[i];
    };
    parallel_for(n, range, n >= kParallelElementwise);
}

// dgate, dup, dy, gate, up: (n) contiguous.    du = dy · a,   dg = act'(g) · (dy · u)
template <class T, class Act, class ActBackward>
void glu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
    auto range = [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
            dup[i] = dy[i] * Act{}(gate[i], T(0));
            dgate[i] = ActBackward{}(dy[i] * up[i], gate[i], T(0));
        }
    };
    parallel_for(n, range, n >= kParallelElementwise);
}

}  // namespace cpu

namespace {

template <class T>
void forward_on_cpu(T* y, const T* gate, const T* up, int64_t n, GluActivation activation) {
    if (activation == GluActivation::silu)
        cpu::glu_forward<T, math::Silu>(y, gate, up, n);
    else
        cpu::glu_forward<T, math::Gelu>(y, gate, up, n);
}

template <class T>
void backward_on_cpu(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                     GluActivation activation) {
    if (activation == GluActivation::silu)
        cpu::glu_backward<T, math::Silu, math::SiluBackward>(dgate, dup, dy, gate, up, n);
    else
        cpu::glu_backward<T, math::Gelu, math::GeluBackward>(dgate, dup, dy, gate, up, n);
}

const char* name_of(GluActivation activation) {
    return activation == GluActivation::silu ? "swiglu" : "geglu";
}

}  // namespace

Tensor glu(const Tensor& gate_in, const Tensor& up_in, GluActivation activation,
           Precision rounded_copy) {
    const char* op = name_of(activation);
    QK_CHECK(gate_in.defined() && up_in.defined(), "{}: gate and up are both required", op);
    QK_CHECK(gate_in.shape() == up_in.shape(), "{}: gate {} and up {} must have the same shape", op,
             gate_in.shape(), up_in.shape());
    QK_CHECK(gate_in.dtype() == up_in.dtype() && gate_in.device() == up_in.device(),
             "{}: gate ({}, {}) and up ({}, {}) must share a dtype and a device", op,
             gate_in.dtype(), gate_in.device(), up_in.dtype(), up_in.device());
    QK_CHECK(gate_in.dtype() == kF32 || gate_in.dtype() == kF64,
             "{}: needs float32 or float64, got {}", op, gate_in.dtype());
    const Tensor gate = autograd::contiguous_input(gate_in), up = autograd::contiguous_input(up_in);
    const int64_t n = gate.numel();
    Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    const Tensor y_half = rounded_copy_for(y, rounded_copy);
    const bool bf16_copy = rounded_copy == Precision::bf16;
    on_device(
        op, gate.device(), gate.dtype(),
        [&](auto tag) {
            using T = decltype(tag);
            forward_on_cpu(y.data<T>(), gate.data<T>(), up.data<T>(), n, activation);
        },
        [&](auto tag) {
            using T = decltype(tag);
            cuda::glu_forward(y.data<T>(), gate.data<T>(), up.data<T>(), n, activation,
                              half_bits(y_half), bf16_copy);
        });
    keep_rounded_copy(y, y_half);
    return autograd::record(
        op, y, {gate_in, up_in},
        [gate = autograd::saved(gate), up = autograd::saved(up), activation, op, n, rounded_copy,
         bf16_copy](const Tensor& dy_in) {
            const Tensor dy = dy_in.contiguous();
            Tensor dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
            Tensor dup = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
            const Tensor dgate_half = rounded_copy_for(dgate, rounded_copy);
            const Tensor dup_half = rounded_copy_for(dup, rounded_copy);
            on_device(
                op, gate.device(), gate.dtype(),
                [&](auto tag) {
                    using T = decltype(tag);
                    backward_on_cpu(dgate.data<T>(), dup.data<T>(), dy.data<T>(), gate.data<T>(),
                                    up.data<T>(), n, activation);
                },
                [&](auto tag) {
                    using T = decltype(tag);
                    cuda::glu_backward(dgate.data<T>(), dup.data<T>(), dy.data<T>(), gate.data<T>(),
                                       up.data<T>(), n, activation, half_bits(dgate_half),
                                       half_bits(dup_half), bf16_copy);
                });
            keep_rounded_copy(dgate, dgate_half);
            keep_rounded_copy(dup, dup_half);
            return std::vector<Tensor>{dgate, dup};
        });
}

}  // namespace qk
