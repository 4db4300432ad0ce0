// The cpu GEMM layer under matmul and linear (ops/matmul.cpp) and the mixed-precision ones: one
// product split over the pool's threads, two independent products side by side, and batches.
//
// Threads: OpenBLAS runs single-threaded, and a large GEMM is split here into one slab of rows
// (or of columns, when the output is wider than tall) per thread of the pool (core/threading.h),
// not more: each slab packs the shared operand again, and 4 slabs per thread made a step of the
// default model 7-9 % slower when all the slabs ran on one thread (as they do while the pool's
// workers rest, core/help_meter.h);
// many small GEMMs (the attention products, one per batch and head) go to the threads whole, and
// linear's dx and dW, independent products of equal size, run side by side (gemm_pair). One
// pool then serves every op: OpenBLAS's own workers yield in a loop while they wait (sched_yield),
// and next to a second pool of threads that cost 19 % of a 2-thread training step here.
// OpenBLAS picks its kernels by matrix size, so a slab's rows can round differently (in the last
// bits) from the same rows of the whole product: results depend on the thread count.
//
// The element types: float and double products go to OpenBLAS (cblas_sgemm, cblas_dgemm); bf16
// operands with a float32 result go to gemm_bf16_one_thread (ops/gemm_bf16.cpp). The splitting
// below is the same for all three.
#include "ops/gemm.h"

#include <cblas.h>

#include <algorithm>

#include "core/threading.h"

namespace qk {

namespace cpu {

namespace {

// One row of output (M = 1: a decode step's Linear layers) is a matrix-vector product,
//     y[j] = Σ_k a[k] · op(b)[k, j]      i.e.  y = B · a (b stored (N, K), transposed)
//                                             or  y = Bᵀ · a (b stored (K, N)),
// which gemv streams through b once. sgemm would first pack b, a copy of the whole matrix, for
// one use: decode read each weight about twice (2.3 decode tokens/s of Qwen3-0.6B on one thread
// here, against 4.9 with gemv, docs/performance.md). a's elements are la.ld apart when a is
// stored transposed ((K, 1)), adjacent otherwise.
template <class T, class Gemv>
bool gemv_row(Gemv gemv, T* y, const T* a, GemmLayout la, const T* b, GemmLayout lb, int64_t M,
              int64_t N, int64_t K, T alpha, T beta) {
    if (M != 1) return false;
    const int64_t inc_a = la.trans ? la.ld : 1;
    if (lb.trans)
        gemv(CblasRowMajor, CblasNoTrans, N, K, alpha, b, lb.ld, a, inc_a, beta, y, 1);
    else
        gemv(CblasRowMajor, CblasTrans, K, N, alpha, b, lb.ld, a, inc_a, beta, y, 1);
    return true;
}

// y: (M, N) row-major with leading dim ldy; op(a): (M, K); op(b): (K, N).
//     y = op(a) · op(b) + beta · y          (beta 0: y's old contents are ignored)
void gemm_one_thread(float* y, int64_t ldy, const float* a, GemmLayout la, const float* b,
                     GemmLayout lb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    if (gemv_row(cblas_sgemv, y, a, la, b, lb, M, N, K, alpha, beta)) return;
    cblas_sgemm(CblasRowMajor, la.trans ? CblasTrans : CblasNoTrans,
                lb.trans ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, la.ld, b, lb.ld, beta, y,
                ldy);
}
void gemm_one_thread(double* y, int64_t ldy, const double* a, GemmLayout la, const double* b,
                     GemmLayout lb, int64_t M, int64_t N, int64_t K, double alpha, double beta) {
    if (gemv_row(cblas_dgemv, y, a, la, b, lb, M, N, K, alpha, beta)) return;
    cblas_dgemm(CblasRowMajor, la.trans ? CblasTrans : CblasNoTrans,
                lb.trans ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, la.ld, b, lb.ld, beta, y,
                ldy);
}
// y: (M, N) with leading dim ldy.    y *= alpha, the one rounding cuBLAS's alpha makes of a sum
// (called on a slab just written, still in cache).
void scale_block(float* y, int64_t ldy, int64_t M, int64_t N, float alpha) {
    if (alpha == 1.0f) return;
    for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) y[r * ldy + c] *= alpha;
}
void gemm_one_thread(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b,
                     GemmLayout lb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    gemm_bf16_one_thread(y, ldy, a, la, b, lb, M, N, K, beta);
    scale_block(y, ldy, M, N, alpha);
}
void gemm_one_thread(float* y, int64_t ldy, const f16* a, GemmLayout la, const f16* b,
                     GemmLayout lb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    gemm_f16_one_thread(y, ldy, a, la, b, lb, M, N, K, beta);
    scale_block(y, ldy, M, N, alpha);
}

// Below this many multiply-adds (~40 µs) a GEMM stays on one thread: split in slabs, each
// thread's smaller product runs further from OpenBLAS's peak, which costs more than it saves.
constexpr int64_t kParallelGemmWork = int64_t{1} << 20;

// y: (M, N) with leading dim ldy; bias: (N).    y[r, :] = bias, the starting value of linear's GEMM
template <class T>
void fill_rows(T* y, int64_t ldy, const T* bias, int64_t M, int64_t N) {
    for (int64_t r = 0; r < M; ++r) std::copy_n(bias, N, y + r * ldy);
}

// gemm_one_thread, and with a bias (N) first y = bias in every row, then y += op(a) · op(b).
template <class In, class Out>
void gemm_block(Out* y, int64_t ldy, const In* a, GemmLayout la, const In* b, GemmLayout lb,
                const Out* bias, int64_t M, int64_t N, int64_t K, Out alpha, Out beta) {
    if (bias) {
        fill_rows(y, ldy, bias, M, N);
        beta = Out(1);
    }
    if (K > 0) gemm_one_thread(y, ldy, a, la, b, lb, M, N, K, alpha, beta);
}

// Slab s of `slabs` of a job: whole rows of y (or whole columns when N > M). Row i of op(a) starts
// at a + i·ld when a is stored as is, at a + i when transposed; column j of op(b) at b + j, or
// b + j·ld when transposed. With a bias each slab writes it first (where the GEMM then finds it in
// cache; a separate fill of linear's output was ~1 ms of one thread per MLP layer at config B).
template <class In, class Out>
void gemm_slab(const GemmJob<In, Out>& job, int s, int slabs) {
    const auto& [y, ldy, a, la, b, lb, M, N, K, beta, bias, alpha] = job;
    const bool by_rows = M >= N;
    const int64_t extent = by_rows ? M : N;
    const int64_t slab = (extent + slabs - 1) / slabs;
    const int64_t first = s * slab, count = std::min(slab, extent - first);
    if (count <= 0) return;
    if (by_rows)
        gemm_block(y + first * ldy, ldy, a + first * (la.trans ? 1 : la.ld), la, b, lb, bias, count,
                   N, K, alpha, beta);
    else
        gemm_block(y + first, ldy, a, la, b + first * (lb.trans ? lb.ld : 1), lb,
                   bias ? bias + first : nullptr, M, count, K, alpha, beta);
}

// (With K = 0 there is only the bias to write: M·N elements, counted as K = 1.)
template <class In, class Out>
int64_t gemm_work(const GemmJob<In, Out>& job) {
    return job.M * job.N * std::max<int64_t>(job.K, 1);
}

}  // namespace

template <class In, class Out>
void gemm(const GemmJob<In, Out>& job) {
    const int threads = num_threads();
    if (threads == 1 || in_parallel_region() || gemm_work(job) < kParallelGemmWork) {
        gemm_slab(job, 0, 1);
        return;
    }
    auto slab_of = [&](int s) { gemm_slab(job, s, threads); };
    parallel_run(threads, slab_of);
}

template <class In, class Out>
void gemm_pair(const GemmJob<In, Out>& first, const GemmJob<In, Out>& second) {
    const int threads = num_threads();
    if (threads % 2 != 0 || in_parallel_region() ||
        gemm_work(first) + gemm_work(second) < kParallelGemmWork) {
        gemm(first);
        gemm(second);
        return;
    }
    const int half = threads / 2;
    auto slab_of = [&](int s) {
        if (s < half)
            gemm_slab(first, s, half);
        else
            gemm_slab(second, s - half, half);
    };
    parallel_run(threads, slab_of);
}

template <class In, class Out>
void batched_gemm(Out* y, const In* a, const Shape& a_batch_strides, GemmLayout la, const In* b,
                  const Shape& b_batch_strides, GemmLayout lb, const Shape& batch, int64_t M,
                  int64_t N, int64_t K, Out alpha) {
    Shape y_batch_strides = contiguous_strides(batch);
    for (int64_t& s : y_batch_strides) s *= M * N;
    const int64_t count = numel_of(batch);  // 1 for an empty batch
    // The products go to the threads whole, in one parallel region over the whole batch, when
    // there are at least as many as threads (attention's B·H: 48 at config B, 64 at config A) or
    // they are small; only a few large ones split themselves. Both alternatives cost more:
    // splitting each of 48 (256 x 256 x 64) products was one region apiece (~100 sleeps and
    // wake-ups of the pool per batched matmul), and one region per run of the batch's last dim
    // (q·kᵀ's batch (B, H) is not one run: heads are a view into (B, T, H, D)) left config A's
    // runs of 4 small products on one thread.
    const bool whole = count >= num_threads() || M * N * K < kParallelGemmWork;
    auto products = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            int64_t oy = 0, oa = 0, ob = 0;
            for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rest = i; d >= 0; --d) {
                const int64_t index = rest % batch[d];
                rest /= batch[d];
                oy += index * y_batch_strides[d], oa += index * a_batch_strides[d],
                    ob += index * b_batch_strides[d];
            }
            gemm(GemmJob<In, Out>{y + oy, N, a + oa, la, b + ob, lb, M, N, K, Out(0), nullptr,
                                  alpha});
        }
    };
    parallel_for(count, products, whole && count * M * N * K >= kParallelGemmWork);
}

#define QK_GEMM_INSTANTIATE(In, Out)                                                               \
    template void gemm(const GemmJob<In, Out>&);                                                   \
    template void gemm_pair(const GemmJob<In, Out>&, const GemmJob<In, Out>&);                     \
    template void batched_gemm(Out*, const In*, const Shape&, GemmLayout, const In*, const Shape&, \
                               GemmLayout, const Shape&, int64_t, int64_t, int64_t, Out);
QK_GEMM_INSTANTIATE(float, float)
QK_GEMM_INSTANTIATE(double, double)
QK_GEMM_INSTANTIATE(bf16, float)
QK_GEMM_INSTANTIATE(f16, float)
#undef QK_GEMM_INSTANTIATE

}  // namespace cpu

}  // namespace qk
