// matmul with Precision::bf16 or fp16: batched products of float32 operands rounded to the half
// type, float32 sums, as autocast runs them (attention's q·kᵀ and p·v, Newton–Schulz's X X̃ᵀ):
//     y = α · ã · b̃          dA = α · dỸ · b̃ᵀ          dB = α · ãᵀ · dỸ
// with ˜ a value rounded to the half type (the rounding counts as the identity in the backward:
// ops/matmul.cpp). One GEMM per batch matrix on the cpu (ops/gemm_bf16.cpp), one strided-batched
// cuBLAS call per run of the batch on cuda (cuda::gemm_mixed).
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "ops/gemm.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/reduce.h"

namespace qk::matmul_impl {

namespace {

// ---- matmul at bf16 / fp16 precision ------------------------------------------------------

// An operand rounded to Half, stored as GEMM reads it best: a transposed view (kᵀ in attention)
// as the rounding of the matrix it views, read transposed; anything else as a contiguous
// rounding. Either way the rounding is one pass over the float32 values.
template <class Half>
struct HalfOperand {
    Tensor half;             // (..., rows, cols), or (..., cols, rows) read transposed
    cpu::GemmLayout layout;  // how GEMM reads op(x) = (rows, cols)
    HalfOperand transposed() const { return {half, {!layout.trans, layout.ld}}; }
};

// t is detached, or dY under the backward's NoGradGuard. A whole buffer comes through cast_once,
// read either way round: softmax's probabilities and their gradient arrive with their rounding
// already kept beside them (SoftmaxOptions::rounded_copy), and Newton–Schulz's X X̃ᵀ rounds X once.
template <class Half>
HalfOperand<Half> round_operand(const Tensor& t) {
    if (stored_transposed(t))
        return {cast_once(t.transpose(-2, -1), dtype_of<Half>()).contiguous(), {true, t.size(-2)}};
    return {cast_once(t, dtype_of<Half>()).contiguous(), {false, t.size(-1)}};
}

// y: (batch..., M, N) float32, new.    y[β] = alpha · op(a[β]) · op(b[β]),  op(a): (M, K)
// One GEMM per batch index on the cpu, one strided-batched cuBLAS call per run of the batch on
// cuda; broadcast operands are read at stride 0.
template <class Half>
Tensor mixed_product(const HalfOperand<Half>& a, const HalfOperand<Half>& b, const Shape& batch,
                     int64_t M, int64_t N, int64_t K, float alpha, Device device) {
    Shape shape = batch;
    shape.insert(shape.end(), {M, N});
    if (numel_of(shape) == 0) return Tensor::empty(shape, kF32, device);
    if (K == 0) return zeros(shape, kF32, device);  // an empty sum
    Tensor y = Tensor::empty(shape, kF32, device);
    const Shape sa = batch_strides(a.half, batch), sb = batch_strides(b.half, batch);
    switch (device) {
        case Device::cpu:
            cpu::batched_gemm(y.data<float>(), a.half.template data<Half>(), sa, a.layout,
                              b.half.template data<Half>(), sb, b.layout, batch, M, N, K, alpha);
            break;
        case Device::cuda:
#ifdef QK_WITH_CUDA
            for_each_batch_run(batch, M * N, sa, sb, [&](const BatchRun& r) {
                cuda::gemm_mixed(y.data<float>() + r.y, N, r.stride_y,
                                 a.half.template data<Half>() + r.a, a.layout.trans, a.layout.ld,
                                 r.stride_a, b.half.template data<Half>() + r.b, b.layout.trans,
                                 b.layout.ld, r.stride_b, M, N, K, r.count, alpha, 0.0f);
            });
#else
            throw_built_without_cuda("matmul");
#endif
            break;
    }
    return y;
}

template <class Half>
Tensor matmul_mixed(const Tensor& a_in, const Tensor& b_in, float alpha) {
    constexpr DType kHalf = dtype_of<Half>();
    QK_CHECK(a_in.dtype() == kF32 && b_in.dtype() == kF32,
             "matmul: {} precision needs float32 a and b, got a {} {} and b {} {}",
             kHalf == kBF16 ? "bf16" : "fp16", a_in.dtype(), a_in.shape(), b_in.dtype(),
             b_in.shape());
    const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
    const Shape batch = broadcast_shapes(batch_of(a_in), batch_of(b_in), "matmul");
    const HalfOperand<Half> a = round_operand<Half>(autograd::saved(a_in));
    const HalfOperand<Half> b = round_operand<Half>(autograd::saved(b_in));
    Tensor y = mixed_product(a, b, batch, M, N, K, alpha, a_in.device());
    const bool need_a = a_in.requires_grad(), need_b = b_in.requires_grad();
    // Each gradient is made in its input's layout, as matmul's are: dAᵀ = α·b̃·dỸᵀ for an a that
    // is a transposed view, so that the view's backward hands its base a contiguous gradient.
    auto backward = [need_a, need_b, batch, M, N, K, alpha, a_shape = a_in.shape(),
                     b_shape = b_in.shape(), a_trans = stored_transposed(a_in),
                     b_trans = stored_transposed(b_in), device = a_in.device(),
                     a_saved = need_b ? a : HalfOperand<Half>{},
                     b_saved = need_a ? b : HalfOperand<Half>{}](const Tensor& dy) {
        const HalfOperand<Half> g = round_operand<Half>(dy);  // dỸ: (batch..., M, N)
        Tensor da, db;
        if (need_a)
            da = a_trans ? mixed_product(b_saved, g.transposed(), batch, K, M, N, alpha, device)
                               .transpose(-2, -1)  // (α·b̃·dỸᵀ)ᵀ
                         : mixed_product(g, b_saved.transposed(), batch, M, K, N, alpha,
                                         device);  // α·dỸ·b̃ᵀ
        if (need_b)
            db = b_trans ? mixed_product(g.transposed(), a_saved, batch, N, K, M, alpha, device)
                               .transpose(-2, -1)  // (α·dỸᵀ·ã)ᵀ
                         : mixed_product(a_saved.transposed(), g, batch, K, N, M, alpha,
                                         device);  // α·ãᵀ·dỸ
        return std::vector<Tensor>{need_a ? sum_to(da, a_shape) : da,
                                   need_b ? sum_to(db, b_shape) : db};
    };
    return autograd::record("matmul", y, {a_in, b_in}, std::move(backward));
}

}  // namespace

Tensor matmul_bf16(const Tensor& a, const Tensor& b, float alpha) {
    return matmul_mixed<bf16>(a, b, alpha);
}
Tensor matmul_fp16(const Tensor& a, const Tensor& b, float alpha) {
    return matmul_mixed<f16>(a, b, alpha);
}

}  // namespace qk::matmul_impl
