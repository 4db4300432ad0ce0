// The mixed-precision GEMM on the cpu: bfloat16 operands, float32 accumulation and result.
//
//     y[i, j] = Σ_k a[i, k] · b[k, j]  (+ beta · y[i, j])      a, b: bf16;  y: float32
//
// Each product of two bf16 values (8 significant bits each) is exact in float32 (24 bits), so the
// only rounding is that of the inputs to bf16 (done by whoever made them) and of the float32
// sums, as in a float32 GEMM. What bf16 buys is speed: AVX-512 BF16's vdpbf16ps does 32
// multiply-adds per instruction (pairs of bf16 along k into 16 float32 lanes) where vfmadd231ps
// does 16, and half the bytes move through the caches.
//
// The ladder:
//   v1  gemm_bf16_reference: the triple loop of the sum above, accumulated in double; tests
//       compare the engines against it.
//   v2  oneDNN's matmul primitive (Debian's libdnnl-dev): brgemm kernels with vdpbf16ps, and
//       AMX tiles on CPUs that have them. Measured at config B's three Linear shapes (2048 x
//       1536 x 384 and its two backward GEMMs) on this machine's AMD EPYC: 2.0-2.2x the GFLOP/s
//       of OpenBLAS's cblas_sgemm on 1 thread, 2.0-2.5x on 2 (bench/bench_matmul.cpp prints the
//       current figures). Chosen over a hand-written vdpbf16ps kernel because it already reaches
//       the instruction's 2x and follows new CPUs (AMX) without code here.
//   v3  one row against a (N, K) weight (a decode step): ops/gemv_bf16.cpp's streaming gemv,
//       since oneDNN's kernels read a single row at a third of the memory bandwidth.
//   fallback  a CPU without avx512_bf16 (or a build without oneDNN): the operands widened to
//       float32 (exactly) and multiplied by cblas_sgemm. Same sums, float32 speed.
//
// Threads. oneDNN's cpu runtime in Debian is OpenMP; here it runs on one thread per call
// (omp_set_num_threads(1) on the calling thread while oneDNN makes or runs a primitive, since a
// primitive fixes its thread count when created), and ops/gemm.cpp splits a GEMM over the
// library's pool exactly as it does for sgemm. A second pool of OpenMP threads next to the
// library's would spin on the same two cores (core/threading.h says why that is ruinous).
//
// Primitives are made once per shape (a few hundred µs each) and kept, keyed by everything that
// enters their descriptor; their scratchpad is the caller's (a per-thread buffer), which is what
// lets two threads run the same primitive at once.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/half_convert.h"
#include "ops/gemm.h"

#ifdef QK_WITH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace qk::cpu {

namespace {

// The stored matrix behind op(x): (rows, cols) = (M, K) as stored, (K, M) when transposed.
struct Stored {
    int64_t rows, cols;
};
Stored stored_shape(int64_t op_rows, int64_t op_cols, GemmLayout l) {
    return l.trans ? Stored{op_cols, op_rows} : Stored{op_rows, op_cols};
}

// ---- fallback: widen to float32, then sgemm ------------------------------------------------

// dst: (rows, cols) contiguous float; src: (rows, cols) bf16 or f16 with leading dim ld.
template <class Half>
void widen(std::vector<float>& dst, const Half* src, Stored s, int64_t ld) {
    dst.resize(static_cast<size_t>(s.rows * s.cols));
    for (int64_t r = 0; r < s.rows; ++r) {
        if constexpr (std::is_same_v<Half, f16>)
            f16_to_floats(dst.data() + r * s.cols, src + r * ld, s.cols);
        else
            for (int64_t c = 0; c < s.cols; ++c) dst[r * s.cols + c] = src[r * ld + c].to_float();
    }
}

template <class Half>
void gemm_widened(float* y, int64_t ldy, const Half* a, GemmLayout la, const Half* b, GemmLayout lb,
                  int64_t M, int64_t N, int64_t K, float beta) {
    thread_local std::vector<float> a_wide, b_wide;
    const Stored sa = stored_shape(M, K, la), sb = stored_shape(K, N, lb);
    widen(a_wide, a, sa, la.ld);
    widen(b_wide, b, sb, lb.ld);
    cblas_sgemm(CblasRowMajor, la.trans ? CblasTrans : CblasNoTrans,
                lb.trans ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, a_wide.data(),
                std::max<int64_t>(sa.cols, 1), b_wide.data(), std::max<int64_t>(sb.cols, 1), beta,
                y, ldy);
}

// ---- oneDNN ---------------------------------------------------------------------------------
#ifdef QK_WITH_ONEDNN

// Everything a primitive's descriptor depends on.
struct ShapeKey {
    int64_t M, N, K, lda, ldb, ldy;
    bool a_trans, b_trans, accumulate;
    auto tie() const { return std::tie(M, N, K, lda, ldb, ldy, a_trans, b_trans, accumulate); }
    bool operator<(const ShapeKey& o) const { return tie() < o.tie(); }
};

struct Primitive {
    dnnl::matmul::primitive_desc desc;
    dnnl::matmul matmul;
};

// oneDNN's OpenMP team on the calling thread: one thread while oneDNN runs here, and the
// caller's own setting (a program's main thread may use OpenMP itself) restored afterwards.
class OneOpenMpThread {
  public:
    OneOpenMpThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
    ~OneOpenMpThread() { omp_set_num_threads(saved_); }
    OneOpenMpThread(const OneOpenMpThread&) = delete;
    OneOpenMpThread& operator=(const OneOpenMpThread&) = delete;

  private:
    int saved_;
};

class OneDnnGemm {
  public:
    void run(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b, GemmLayout lb,
             int64_t M, int64_t N, int64_t K, float beta) {
        OneOpenMpThread one_thread;
        const std::shared_ptr<const Primitive> p =
            primitive({M, N, K, la.ld, lb.ld, ldy, la.trans, lb.trans, beta != 0});
        thread_local dnnl::stream stream(engine_);
        thread_local std::vector<unsigned char> scratchpad;
        const dnnl::memory::desc scratch_desc = p->desc.scratchpad_desc();
        scratchpad.resize(std::max<size_t>(scratch_desc.get_size(), 1));
        using dnnl::memory;
        std::unordered_map<int, memory> args = {
            {DNNL_ARG_SRC, memory(p->desc.src_desc(), engine_, const_cast<bf16*>(a))},
            {DNNL_ARG_WEIGHTS, memory(p->desc.weights_desc(), engine_, const_cast<bf16*>(b))},
            {DNNL_ARG_DST, memory(p->desc.dst_desc(), engine_, y)},
            {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, engine_, scratchpad.data())}};
        p->matmul.execute(stream, args);
    }

  private:
    // Shapes seen in training are few (a dozen per model and thread count), but sampling grows
    // the context token by token and makes new ones: past kMaxPrimitives the cache starts over.
    // Callers hold their primitive by shared_ptr, so one being executed outlives the clearing.
    static constexpr size_t kMaxPrimitives = 256;

    std::shared_ptr<const Primitive> primitive(const ShapeKey& key) {
        std::lock_guard lock(mutex_);
        auto it = cache_.find(key);
        if (it != cache_.end()) return it->second;
        if (cache_.size() >= kMaxPrimitives) cache_.clear();
        using dnnl::memory;
        auto strides = [](bool trans, int64_t ld) {
            return trans ? memory::dims{1, ld} : memory::dims{ld, 1};
        };
        const memory::desc a({key.M, key.K}, memory::data_type::bf16,
                             strides(key.a_trans, key.lda));
        const memory::desc b({key.K, key.N}, memory::data_type::bf16,
                             strides(key.b_trans, key.ldb));
        const memory::desc y({key.M, key.N}, memory::data_type::f32, memory::dims{key.ldy, 1});
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        if (key.accumulate) {  // y += a · b: the "sum" post-op reads y before writing it
            dnnl::post_ops ops;
            ops.append_sum(1.0f);
            attr.set_post_ops(ops);
        }
#if DNNL_VERSION_MAJOR >= 3
        dnnl::matmul::primitive_desc desc(engine_, a, b, y, attr);
#else
        dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b, y), attr, engine_);
#endif
        auto made = std::make_shared<const Primitive>(Primitive{desc, dnnl::matmul(desc)});
        cache_.emplace(key, made);
        return made;
    }

    dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
    std::mutex mutex_;
    std::map<ShapeKey, std::shared_ptr<const Primitive>> cache_;
};

OneDnnGemm& onednn() {
    static OneDnnGemm gemm;
    return gemm;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

#endif  // QK_WITH_ONEDNN

Bf16GemmEngine choose_engine() {
    const char* forced = std::getenv("QK_BF16_GEMM");
    if (forced && std::strcmp(forced, "sgemm") == 0) return Bf16GemmEngine::float32_sgemm;
#ifdef QK_WITH_ONEDNN
    if (cpu_has_avx512_bf16()) return Bf16GemmEngine::onednn;
    std::fprintf(stderr,
                 "qk: this CPU has no AVX-512 BF16: bf16 GEMMs run as float32 sgemm on the bf16 "
                 "values (same results, float32 speed)\n");
#else
    std::fprintf(stderr,
                 "qk: built without oneDNN: bf16 GEMMs run as float32 sgemm on the bf16 values "
                 "(same results, float32 speed)\n");
#endif
    return Bf16GemmEngine::float32_sgemm;
}

Bf16GemmEngine& engine_in_use() {
    static Bf16GemmEngine engine = choose_engine();
    return engine;
}

}  // namespace

Bf16GemmEngine bf16_gemm_engine() { return engine_in_use(); }

std::string bf16_gemm_engine_name() {
    return bf16_gemm_engine() == Bf16GemmEngine::onednn
               ? "oneDNN matmul (AVX-512 BF16)"
               : "float32 sgemm on bf16 values (no AVX-512 BF16 or no oneDNN)";
}

void set_bf16_gemm_engine(Bf16GemmEngine engine) {
#ifndef QK_WITH_ONEDNN
    QK_CHECK(engine != Bf16GemmEngine::onednn,
             "set_bf16_gemm_engine: this build has no oneDNN (install libdnnl-dev and rebuild)");
#else
    QK_CHECK(engine != Bf16GemmEngine::onednn || cpu_has_avx512_bf16(),
             "set_bf16_gemm_engine: oneDNN's bf16 GEMM needs a CPU with avx512_bf16");
#endif
    engine_in_use() = engine;
}

void gemm_bf16_one_thread(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b,
                          GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // an empty sum: y = beta · y
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
                y[i * ldy + j] = beta == 0 ? 0.0f : beta * y[i * ldy + j];
        return;
    }
#ifdef QK_WITH_ONEDNN
    // One row against a weight stored (N, K), a decode step's Linear: the streaming gemv
    // (ops/gemv_bf16.cpp); oneDNN's blocked kernels read such a row at a third of the bandwidth.
    if (bf16_gemm_engine() == Bf16GemmEngine::onednn && M == 1 && lb.trans &&
        (!la.trans || la.ld == 1)) {
        gemv_bf16_avx512(y, a, b, lb.ld, N, K, beta);
        return;
    }
    if (bf16_gemm_engine() == Bf16GemmEngine::onednn) {
        QK_CHECK(beta == 0 || beta == 1, "gemm_bf16: beta must be 0 or 1 on oneDNN, got {}", beta);
        onednn().run(y, ldy, a, la, b, lb, M, N, K, beta);
        return;
    }
#endif
    gemm_widened(y, ldy, a, la, b, lb, M, N, K, beta);
}

// float16 has no engine of its own here: its values (11 significant bits) and their products
// (22) are exact in float32, so the widened sgemm gives what a float16 tensor-core GEMM with
// float32 accumulation gives, at float32 speed.
void gemm_f16_one_thread(float* y, int64_t ldy, const f16* a, GemmLayout la, const f16* b,
                         GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta) {
    if (M == 0 || N == 0) return;
    gemm_widened(y, ldy, a, la, b, lb, M, N, K, beta);
}

void gemm_bf16_reference(float* y, int64_t ldy, const bf16* a, GemmLayout la, const bf16* b,
                         GemmLayout lb, int64_t M, int64_t N, int64_t K, float beta) {
    auto at = [](const bf16* x, GemmLayout l, int64_t r, int64_t c) {  // op(x)[r, c]
        return static_cast<double>(l.trans ? x[c * l.ld + r] : x[r * l.ld + c]);
    };
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double sum = beta == 0 ? 0.0 : double(beta) * y[i * ldy + j];
            for (int64_t k = 0; k < K; ++k) sum += at(a, la, i, k) * at(b, lb, k, j);
            y[i * ldy + j] = static_cast<float>(sum);
        }
}

}  // namespace qk::cpu
