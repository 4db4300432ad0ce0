// Matrix multiplication through OpenBLAS.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/glu.h"

namespace qk {

// a: (..., M, K), b: (..., K, N) -> (..., M, N). float32 or float64, both the same.
// The batch dims broadcast like numpy (a missing or size-1 batch dim is read with stride 0, never
// copied); 2-D inputs are plain GEMMs, and a batched a times a 2-D b (a Linear layer) is one GEMM
// over all of a's rows. Transposed views, e.g. matmul(x, w.t()), are handed to GEMM as transpose
// flags, not copied; only an operand GEMM cannot address (no unit stride in its last two dims) is
// made contiguous first. Differentiable in both inputs.
Tensor matmul(const Tensor& a, const Tensor& b);

// alpha · (a · b) at a precision. Precision::full is matmul(a, b), times alpha. With bf16 or fp16
// (float32 a and b): both operands rounded to the half type, their products summed in float32
// (tensor cores on cuda) and scaled once, the result float32; the backward's GEMMs take the
// upstream gradient rounded likewise (straight through the roundings, as linear's):
//     y = α · ã · b̃        dA = α · dỸ · b̃ᵀ        dB = α · ãᵀ · dỸ
// It saves ã and b̃ (half the bytes of float32). Batch dims broadcast as matmul's. What attention
// at bf16 precision multiplies with (ops/attention.cpp), as autocast does.
Tensor matmul(const Tensor& a, const Tensor& b, Precision precision, double alpha = 1.0);

// A Linear layer as one op: x: (..., in), weight: (out, in), bias: (out) or undefined ->
// (..., out) = x · weightᵀ + bias. Same result as matmul(x, weight.t()) + bias, with the bias
// added inside the GEMM (see ops/matmul.cpp). Differentiable in all three.
// With Precision::bf16 (float32 x and weight): the forward GEMM and both backward GEMMs (dx, dW)
// run on bf16 copies of x, weight and the upstream gradient, which is all the op saves (half
// the bytes of float32); the bias, the result and every gradient stay float32.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              Precision precision = Precision::full);

// The half type a GEMM at this precision multiplies in (bf16, fp16), which the op feeding it can
// round its output to in the same pass; full where the GEMM rounds nothing, or rounds its own
// operands (fp8).
inline Precision rounded_copy_for_gemm(Precision gemm_precision) {
    return gemm_precision == Precision::bf16 || gemm_precision == Precision::fp16 ? gemm_precision
                                                                                  : Precision::full;
}

// gelu(linear(x, weight, bias, precision), rounded_copy): the plain MLP's first half as one op,
// with the same values and gradients as the two. At bf16 or fp16 on cuda it is one node, whose
// backward makes dY = dH ⊙ gelu'(Y), its rounding for the GEMMs and its column sums for db in one
// pass: the two ops write dY in float32 and read it back (ops/matmul_bf16.cpp). Elsewhere (the
// cpu, full precision) it is the two ops; fp8 is refused as linear refuses it.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, Precision precision,
                   Precision rounded_copy = Precision::full);

// linear(linear_gelu(x, w_fc, b_fc, precision), w_proj, b_proj, precision): the plain MLP as one
// op, with the same values and gradients as the two. At bf16 or fp16 on cuda it is one node that
// never writes gelu's float32 output h: c_proj's GEMM reads h only rounded, and h's gradient
// needs y = x̃ W̃_fcᵀ + b_fc, not h. Elsewhere it is the two ops.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                          const Tensor& w_proj, const Tensor& b_proj, Precision precision);

// linear(glu(linear(x, w_gate), linear(x, w_up), activation), w_proj, b_proj): the gated MLP of
// Qwen3 and Llama (SwiGLU) or Gemma (GeGLU), without gate and up biases, as one op. At bf16 or
// fp16 on cuda it is one node that writes neither the product nor the gate's and up's gradients
// in float32 (their Linears' GEMMs read them rounded, and nothing sums them for a bias); x's
// gradient is the two Linears' added, as the engine adds them. Elsewhere it is the ops.
Tensor glu_linear(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_proj,
                  const Tensor& b_proj, GluActivation activation, Precision precision);

// TF32 for float32 GEMMs on CUDA (cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH): tensor cores read the
// inputs rounded to 10 mantissa bits (TF32) and sum in float32, several times faster than float32
// FMA. Off by default (qknorm train --tf32). The cpu's GEMMs never change; bf16 GEMMs neither.
void set_tf32(bool on);
bool tf32_enabled();

namespace detail {
// How many operands matmul has copied because GEMM could not read them as stored (for tests).
int64_t matmul_operand_copies();
// The teaching kernel of cuda/matmul.cu on cuda tensors: a (M, K) or (B, M, K) times b (K, N) or
// (B, K, N), same batch, no broadcasting; not differentiable. Tests compare it with matmul.
Tensor matmul_tiled(const Tensor& a, const Tensor& b);
}  // namespace detail

// Launchers of cuda/matmul.cu (device pointers).
namespace cuda {
// cuBLAS strided-batched GEMM on row-major matrices, for each of `batch` matrices:
//     y = op(a) · op(b) + beta · y
// y: (M, N) with leading dim ldy; op(a): (M, K); op(b): (K, N).
// An operand with trans set is stored transposed (its row-major (K, M) or (N, K) with leading
// dim ld); stride_* steps from one batch matrix to the next (0: shared by every batch).
template <class T>
void gemm(T* y, int64_t ldy, int64_t stride_y, const T* a, bool a_trans, int64_t lda,
          int64_t stride_a, const T* b, bool b_trans, int64_t ldb, int64_t stride_b, int64_t M,
          int64_t N, int64_t K, int64_t batch, T beta);
// Sets cuBLAS's math mode for float32 GEMMs: TF32 tensor ops or the default.
void set_tf32_math(bool on);
// The mixed-precision twin: y float32, a and b bfloat16 or float16 (Half), float32 accumulation,
// the same layouts and batch strides as gemm.    y = alpha · op(a) · op(b) + beta · y
template <class Half>
void gemm_mixed(float* y, int64_t ldy, int64_t stride_y, const Half* a, bool a_trans, int64_t lda,
                int64_t stride_a, const Half* b, bool b_trans, int64_t ldb, int64_t stride_b,
                int64_t M, int64_t N, int64_t K, int64_t batch, float alpha, float beta);
// y: (R, N), x: (R, K), w: (N, K), bias: (N), contiguous.    y = x · wᵀ + b
// One cuBLASLt call, the bias added in its epilogue; false (nothing done) when cuBLASLt has no
// algorithm for the shape, or use_bias_epilogue(false) turned it off (tests compare the two).
template <class Half>
bool linear_bias_mixed(float* y, const Half* x, const Half* w, const float* bias, int64_t R,
                       int64_t N, int64_t K);
bool use_bias_epilogue(bool on);  // returns the previous setting
// y: (batch, M, N), a: (batch, M, K), b: (batch, K, N), contiguous.    y = a · b  (tiled kernel)
template <class T>
void matmul_tiled(T* y, const T* a, const T* b, int64_t batch, int64_t M, int64_t N, int64_t K);
// The mixed linear's passes around its GEMMs, one launch each (cuda/matmul_bf16.cu):
// y: (R, N) out, bias: (N).    y = b in every row (before a GEMM that adds to y, beta = 1)
void fill_bias_rows(float* y, const float* bias, int64_t R, int64_t N);
// dy_half: (R, N) out, db: (N) out or null, dy: (R, N) row stride ldy.
//     dỸ = round(dY), db = Σ_r dY
// gelu_in: null, or (R, N) contiguous, GELU's input Y when dy is dH, the gradient of gelu(Y): then
// dY = dH ⊙ gelu'(Y) in the same pass (linear_gelu's backward).
template <class Half>
void round_and_sum_columns(Half* dy_half, float* db, const float* dy, int64_t ldy, int64_t R,
                           int64_t N, const float* gelu_in = nullptr);
}  // namespace cuda

}  // namespace qk
