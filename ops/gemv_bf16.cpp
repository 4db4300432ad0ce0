// One row of a bf16 GEMM: the matrix-vector product of a decode step, with AVX-512 BF16.
//
//     y[j] = Σ_k x[k] · w[j, k]  (+ beta · y[j])        x: (K) bf16, w: (N, K) bf16, y: float32
//
// A decode step multiplies one row of activations by every weight matrix of the model, so its
// time is the time to read the weights. oneDNN's matmul is built for blocks of rows: with one it
// reached about a third of the bandwidth bound here (7.6 decode tokens/s of Qwen3-0.6B on one
// thread, against 20 that reading 1.2 GB per token at the measured copy bandwidth allows). This
// kernel only streams: four rows of w at a time, 32 bf16 per 64-byte load, one vdpbf16ps each
// (16 float32 lanes, each adding x[2i]·w[2i] + x[2i+1]·w[2i+1]), the x loads shared by the four
// rows, the next four rows prefetched meanwhile; the tail of K under a mask; one horizontal sum
// per row at the end. Now 10.4 decode tokens/s on one thread, 18.3 on two (0.52 and 0.82 of the
// bound; docs/performance.md).
//
// Sums: float32 accumulators, their 16 lanes summed pairwise at the end: another order of the
// same float32 additions as any GEMM (tests bound the difference from the double-precision
// reference as for the other engines). vdpbf16ps treats bf16 subnormals as zero, as oneDNN's
// kernels, which run the same instruction, do.
//
// Dispatch: the function is compiled for AVX-512 BF16 alone (a target attribute), the library
// for baseline x86-64; ops/gemm_bf16.cpp calls it only when the CPU has avx512_bf16, and
// tools/install_check.sh allows 512-bit registers only in functions named *_avx512*.
#include "ops/gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define QK_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace qk::cpu {

namespace {

// 32 bf16 from p, or only the first `count` of them (the rest zero) under a mask.
QK_AVX512_BF16 inline __m512bh load_avx512(const bf16* p) {
    return (__m512bh)_mm512_loadu_si512(p);
}
QK_AVX512_BF16 inline __m512bh load_avx512(const bf16* p, __mmask32 mask) {
    return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// y = the sum of acc's 16 lanes, in pairs (+ beta · y). (Not _mm512_reduce_add_ps: GCC 12 warns
// about an undefined register inside it.)
QK_AVX512_BF16 inline void store_avx512(float* y, __m512 acc, float beta) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (int width = 8; width > 0; width /= 2)
        for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
    const float sum = lanes[0];
    *y = beta == 0 ? sum : sum + beta * *y;
}

// Rows j0 … j0+R−1 of w (R ≤ 4), each dotted with x, while the rows at `next` are prefetched:
// the hardware's prefetchers alone kept one core at 0.46 of the bandwidth bound, against 0.52
// with the next group requested a group ahead (bench/bench_generate, Qwen3-0.6B).
template <int R>
QK_AVX512_BF16 void rows_avx512(float* y, const bf16* x, const bf16* w, const bf16* next,
                                int64_t ldw, int64_t K, float beta) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512bh xv = load_avx512(x + k);
        for (int r = 0; r < R; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(next + r * ldw + k), _MM_HINT_T0);
            acc[r] = _mm512_dpbf16_ps(acc[r], load_avx512(w + r * ldw + k), xv);
        }
    }
    if (k < K) {
        const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
        const __m512bh xv = load_avx512(x + k, mask);
        for (int r = 0; r < R; ++r)
            acc[r] = _mm512_dpbf16_ps(acc[r], load_avx512(w + r * ldw + k, mask), xv);
    }
    for (int r = 0; r < R; ++r) store_avx512(y + r, acc[r], beta);
}

}  // namespace

QK_AVX512_BF16 void gemv_bf16_avx512(float* y, const bf16* x, const bf16* w, int64_t ldw, int64_t N,
                                     int64_t K, float beta) {
    int64_t j = 0;
    for (; j + 4 <= N; j += 4) {
        const bf16* rows = w + j * ldw;
        rows_avx512<4>(y + j, x, rows, j + 8 <= N ? rows + 4 * ldw : rows, ldw, K, beta);
    }
    for (; j < N; ++j) rows_avx512<1>(y + j, x, w + j * ldw, w + j * ldw, ldw, K, beta);
}

}  // namespace qk::cpu

#else

namespace qk::cpu {
void gemv_bf16_avx512(float*, const bf16*, const bf16*, int64_t, int64_t, int64_t, float) {
    QK_CHECK(false, "gemv_bf16: built for a CPU without AVX-512 BF16");
}
}  // namespace qk::cpu

#endif
