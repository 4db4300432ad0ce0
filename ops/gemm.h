// The cpu GEMM layer (ops/gemm.cpp, ops/gemm_bf16.cpp): what matmul, linear and attention call
// to multiply matrices on the cpu, on the library's threads. Internal: not part of the public
// headers that qk.h gathers.
#pragma once

#include <cstdint>
#include <string>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/shape.h"

namespace qk::cpu {

// How GEMM reads one operand: as stored (N) or transposed (T), and its leading dimension.
// A (rows, cols) matrix with strides (ld, 1) is read as stored; one with strides (1, ld), a
// transposed view, as the transpose of a row-major matrix.
struct GemmLayout {
    bool trans = false;
    int64_t ld = 1;
};

// One GEMM's arguments, so that independent GEMMs can share one parallel region:
//     y = alpha · op(a) · op(b) + beta · y,   or  y = bias + op(a) · op(b)  with a bias (N)
// y: (M, N) row-major with leading dim ldy; op(a): (M, K); op(b): (K, N).
// In is the operands' element type, Out y's: float·float -> float and double·double -> double
// run on OpenBLAS; bf16·bf16 -> float and f16·f16 -> float are the mixed-precision GEMMs (float32
// accumulation).
template <class In, class Out>
struct GemmJob {
    Out* y;
    int64_t ldy;
    const In* a;
    GemmLayout la;
    const In* b;
    GemmLayout lb;
    int64_t M, N, K;
    Out beta = Out(0);
    const Out* bias = nullptr;
    // The mixed-precision GEMMs multiply their float32 sums by alpha afterwards (one rounding,
    // as cuBLAS's alpha), so there alpha != 1 takes beta = 0 and no bias.
    Out alpha = Out(1);
};

// One product, split over the pool's threads in one slab of rows (or columns) per thread.
template <class In, class Out>
void gemm(const GemmJob<In, Out>& job);

// Two independent products of equal work (linear's dx and dW) at once, each on half of the
// threads: at 2 threads each runs whole on its own core, where splitting each in turn had both
// threads pack the same shared operand (OpenBLAS's packing was ~11 % of a config-A step). With
// an odd thread count, or when both are small, one after the other.
template <class In, class Out>
void gemm_pair(const GemmJob<In, Out>& first, const GemmJob<In, Out>& second);

// y: (batch..., M, N) contiguous; a, b: one matrix per batch index at the given batch strides
// (0 where broadcast). One GEMM per batch index, each on pointer offsets: nothing is copied.
//     y[β] = alpha · op(a[β]) · op(b[β])
template <class In, class Out>
void batched_gemm(Out* y, const In* a, const Shape& a_batch_strides, GemmLayout la, const In* b,
                  const Shape& b_batch_strides, GemmLayout lb, const Shape& batch, int64_t M,
                  int64_t N, int64_t K, Out alpha = Out(1));

// ---- the mixed-precision GEMM (ops/gemm_bf16.cpp) ------------------------------------------

// y: (M, N) float32 with leading dim ldy; op(a): (M, K), op(b): (K, N) bfloat16.
//     y = op(a) · op(b) + beta · y      products exact in float32, sums accumulated in float32
// On the calling thread, by the engine bf16_gemm_engine() names.
void gemm_bf16_one_thread(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b,
                          GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta);
// The float16 twin: the operands widened to float32 (exact) and cblas_sgemm (ops/gemm_bf16.cpp).
void gemm_f16_one_thread(float* y, int64_t ldy, const f16* a, GemmLayout la, const f16* b,
                         GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta);
// One row with w stored (N, K), on a CPU with avx512_bf16 only (ops/gemv_bf16.cpp):
//     y[j] = Σ_k x[k] · w[j, k] + beta · y[j]
void gemv_bf16_avx512(float* y, const bf16* x, const bf16* w, int64_t ldw, int64_t N, int64_t K,
                      float beta);
// v1 of the ladder: the triple loop that mirrors the sum, in double (tests compare against it).
void gemm_bf16_reference(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b,
                         GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta);

enum class Bf16GemmEngine {
    onednn,         // oneDNN's matmul (brgemm kernels on AVX-512 BF16, AMX where a CPU has it)
    float32_sgemm,  // no AVX-512 BF16 (or no oneDNN): sgemm on the operands widened to float32
};
// The engine in use: oneDNN when the library was built with it and the CPU has avx512_bf16,
// else the float32 fallback, which gives the same sums (bf16 values and their products are exact
// in float32) at float32 speed. QK_BF16_GEMM=sgemm forces the fallback (tests, benchmarks).
Bf16GemmEngine bf16_gemm_engine();
std::string bf16_gemm_engine_name();
// Switches the engine for the whole process (tests and benchmarks compare the two); asking for
// oneDNN where it cannot run is a qk::Error.
void set_bf16_gemm_engine(Bf16GemmEngine engine);

}  // namespace qk::cpu
