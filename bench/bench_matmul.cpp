// bench_matmul: the matmul op against raw cblas_sgemm with the same transpose flags, in GFLOP/s.
//
//   QK_NUM_THREADS=1 ./build/bench/bench_matmul     (then QK_NUM_THREADS=2)
//
// The op's overhead is everything around the GEMM: argument checks, choosing the layout, and
// allocating its output (raw sgemm writes into a buffer allocated once). The target is op/raw
// >= 0.9 at the transformer shapes. Rows, for a Linear layer in -> out with weight W: (out, in)
// and B·T tokens (x: (B·T, in), dY: (B·T, out)):
//   x·W    (B·T, in)·(in, out)          N,N   the plain shape
//   x·Wᵀ   x (B, T, in) · W.t()         N,T   the forward of every Linear: THE hot call
//   dY·W   (B·T, out)·(out, in)         N,N   the backward dX = dY · (Wᵀ)ᵀ
//   xᵀ·dY  x.t() · dY                   T,N   the backward dWᵀ = xᵀ · dY, inner dim B·T
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/gemm.h"
#include "qk.h"

using namespace qk;

namespace {

struct Row {
    std::string shape;
    std::string flags;
    double raw_gflops, op_gflops;
};

// Best (minimum) seconds of raw() and of op() over calls alternated pair by pair, order flipped
// each pair. This machine's cores are shared: a neighbour only ever adds time, so the minimum of
// many alternated calls is the steadiest estimate of each, and both calls see the same neighbours.
struct Timing {
    double raw_s, op_s;
};
Timing time_pairs(const std::function<void()>& raw, const std::function<void()>& op,
                  double min_seconds = 1.5, size_t min_pairs = 25) {
    using clock = std::chrono::steady_clock;
    auto seconds = [](const std::function<void()>& fn) {
        const auto t0 = clock::now();
        fn();
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    raw();  // warm-up: first-touch page faults, OpenBLAS's buffers
    op();
    Timing best{1e30, 1e30};
    const auto start = clock::now();
    for (size_t pairs = 0;
         pairs < min_pairs ||
         std::chrono::duration<double>(clock::now() - start).count() < min_seconds;
         ++pairs) {
        if (pairs % 2 == 0) {
            best.raw_s = std::min(best.raw_s, seconds(raw));
            best.op_s = std::min(best.op_s, seconds(op));
        } else {
            best.op_s = std::min(best.op_s, seconds(op));
            best.raw_s = std::min(best.raw_s, seconds(raw));
        }
        if (pairs >= 2000) break;
    }
    return best;
}

// One comparison: y = op(a) · op(b) with op(a): (M, K), op(b): (K, N), stored a: (M, K) or (K, M)
// and b: (K, N) or (N, K) as the flags say. `op_call` is the matmul op on the same data.
Row compare(const std::string& shape, const Tensor& a, bool ta, const Tensor& b, bool tb, int64_t M,
            int64_t N, int64_t K, const std::function<Tensor()>& op_call) {
    std::vector<float> y(M * N);
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    auto raw = [&] {
        bench::RawBlasThreads blas_threads;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, 1.0f, pa, lda, pb, ldb, 0.0f, y.data(), N);
    };
    const Timing t = time_pairs(raw, [&] { op_call(); });
    // Same flags, same BLAS: the two results must agree, or the comparison is meaningless.
    raw();
    auto got = op_call().to_vector<float>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, double(std::abs(got[i] - y[i])));
    if (worst > 1e-3) fmt::print(stderr, "MISMATCH at {}: max |op - raw| = {}\n", shape, worst);
    const double gflop = 2.0 * M * N * K / 1e9;
    return {shape, fmt::format("{},{}", ta ? "T" : "N", tb ? "T" : "N"), gflop / t.raw_s,
            gflop / t.op_s};
}

void print_table(const std::string& title, const std::vector<Row>& rows) {
    fmt::print("\n### {}\n\n| shape | flags | raw sgemm GFLOP/s | op GFLOP/s | op/raw |\n", title);
    fmt::print("|---|---|---:|---:|---:|\n");
    for (const Row& r : rows)
        fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.3f} |\n", r.shape, r.flags, r.raw_gflops,
                   r.op_gflops, r.op_gflops / r.raw_gflops);
}

std::vector<Row> square_rows() {
    std::vector<Row> rows;
    for (int64_t n : {256, 512, 1024, 2048}) {
        Tensor a = randn({n, n}), b = randn({n, n});
        rows.push_back(compare(fmt::format("{0}x{0} · {0}x{0}", n), a, false, b, false, n, n, n,
                               [&] { return matmul(a, b); }));
    }
    return rows;
}

// The four GEMMs of one Linear layer in -> out over bt tokens (see the header).
void linear_rows(std::vector<Row>& rows, int64_t bt, int64_t in, int64_t out) {
    const int64_t T = 256, B = bt / T;
    Tensor x = randn({bt, in}), w = randn({out, in}), wt = randn({in, out}), dy = randn({bt, out});
    Tensor x3 = x.view({B, T, in});
    rows.push_back(compare(fmt::format("x·W ({}, {})·({}, {})", bt, in, in, out), x, false, wt,
                           false, bt, out, in, [&] { return matmul(x, wt); }));
    rows.push_back(compare(fmt::format("x·Wᵀ ({}, {}, {})·({}, {})ᵀ", B, T, in, out, in), x, false,
                           w, true, bt, out, in, [&] { return matmul(x3, w.t()); }));
    rows.push_back(compare(fmt::format("dY·W ({}, {})·({}, {})", bt, out, out, in), dy, false, w,
                           false, bt, in, out, [&] { return matmul(dy, w); }));
    rows.push_back(compare(fmt::format("xᵀ·dY ({}, {})ᵀ·({}, {})", bt, in, bt, out), x, true, dy,
                           false, in, out, bt, [&] { return matmul(x.t(), dy); }));
}

// bf16: the mixed-precision GEMM (ops/gemm_bf16.cpp) on operands already in bf16, against raw
// sgemm with the same flags on the same (float32) values; and the bf16 linear op's forward, which
// also rounds x and W to bf16 on the way in, against raw sgemm x·Wᵀ.
struct Bf16Row {
    std::string shape, flags;
    double raw_gflops, gemm_gflops;
};
Bf16Row compare_bf16(const std::string& shape, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
    Tensor a = ta ? randn({K, M}) : randn({M, K}), b = tb ? randn({N, K}) : randn({K, N});
    Tensor a16 = a.to(kBF16), b16 = b.to(kBF16);
    std::vector<float> y(M * N), y16(M * N);
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    auto raw = [&] {
        bench::RawBlasThreads blas_threads;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, 1.0f, a.data<float>(), lda, b.data<float>(), ldb, 0.0f, y.data(), N);
    };
    auto gemm16 = [&] {
        cpu::gemm(cpu::GemmJob<bf16, float>{
            y16.data(), N, a16.data<bf16>(), {ta, lda}, b16.data<bf16>(), {tb, ldb}, M, N, K});
    };
    const Timing t = time_pairs(raw, gemm16);
    double worst = 0;  // bf16's input rounding over K terms of size ~1: well under 0.1 · sqrt(K)
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, double(std::abs(y[i] - y16[i])));
    if (worst > 0.1 * std::sqrt(double(K)))
        fmt::print(stderr, "MISMATCH at {}: max |bf16 - sgemm| = {}\n", shape, worst);
    const double gflop = 2.0 * M * N * K / 1e9;
    return {shape, fmt::format("{},{}", ta ? "T" : "N", tb ? "T" : "N"), gflop / t.raw_s,
            gflop / t.op_s};
}

void bf16_table(int64_t bt, int64_t C) {
    fmt::print("\n### bf16 GEMM ({}) vs raw sgemm, config B's Linear shapes (B·T = {}, C = {})\n\n",
               cpu::bf16_gemm_engine_name(), bt, C);
    fmt::print(
        "| GEMM | flags | raw sgemm GFLOP/s | bf16 GFLOP/s | bf16/sgemm "
        "|\n|---|---|---:|---:|---:|\n");
    std::vector<Bf16Row> rows;
    for (auto [in, out] : {std::pair{C, 3 * C}, std::pair{C, 4 * C}, std::pair{4 * C, C}}) {
        rows.push_back(compare_bf16(fmt::format("x·Wᵀ ({}, {})·({}, {})ᵀ", bt, in, out, in), bt,
                                    out, in, false, true));
        rows.push_back(compare_bf16(fmt::format("dY·W ({}, {})·({}, {})", bt, out, out, in), bt, in,
                                    out, false, false));
        rows.push_back(compare_bf16(fmt::format("dYᵀ·x ({}, {})ᵀ·({}, {})", bt, out, bt, in), out,
                                    in, bt, true, false));
    }
    double sum_log = 0;
    for (const auto& r : rows) {
        fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.2f} |\n", r.shape, r.flags, r.raw_gflops,
                   r.gemm_gflops, r.gemm_gflops / r.raw_gflops);
        sum_log += std::log(r.gemm_gflops / r.raw_gflops);
    }
    fmt::print("\nbf16/sgemm geometric mean {:.2f}\n", std::exp(sum_log / rows.size()));
    // The linear op end to end (forward): rounding x and W to bf16 included.
    Tensor x = randn({bt, C}), w = randn({4 * C, C});
    std::vector<float> y(bt * 4 * C);
    auto raw = [&] {
        bench::RawBlasThreads blas_threads;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bt, 4 * C, C, 1.0f, x.data<float>(), C,
                    w.data<float>(), C, 0.0f, y.data(), 4 * C);
    };
    const Timing t32 = time_pairs(raw, [&] { linear(x, w); });
    const Timing t16 = time_pairs(raw, [&] { linear(x, w, {}, Precision::bf16); });
    fmt::print(
        "linear ({}, {}) -> {} forward, time ÷ raw sgemm: float32 {:.2f}, bf16 {:.2f} "
        "(rounding x and W included)\n",
        bt, C, 4 * C, t32.op_s / t32.raw_s, t16.op_s / t16.raw_s);
}

// The op's fixed cost per call (checks, layout, output allocation), on a GEMM too small to hide it.
double fixed_overhead_us() {
    Tensor a = randn({16, 16}), b = randn({16, 16});
    std::vector<float> y(16 * 16);
    auto raw = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 16, 16, 16, 1.0f, a.data<float>(),
                    16, b.data<float>(), 16, 0.0f, y.data(), 16);
    };
    const Timing t = time_pairs(
        raw, [&] { matmul(a, b); }, 0.3, 1000);
    return (t.op_s - t.raw_s) * 1e6;
}

}  // namespace

int main(int, char** argv) {
    bench::quiet_openblas_threads(argv);
    NoGradGuard no_grad;
    fmt::print("# matmul vs raw cblas_sgemm, float32, {} thread(s) (QK_NUM_THREADS)\n",
               num_threads());
    fmt::print("best of >= 25 alternated raw/op pairs per row; op fixed cost per call: {:.2f} us\n",
               fixed_overhead_us());
    print_table("square", square_rows());

    std::vector<Row> transformer;
    for (int64_t C : {128, 384})
        for (int64_t bt : {1024, 2048}) {
            linear_rows(transformer, bt, C, 3 * C);  // qkv projection
            linear_rows(transformer, bt, C, 4 * C);  // MLP up
            linear_rows(transformer, bt, 4 * C, C);  // MLP down
        }
    print_table("transformer Linear shapes (C = 128, 384; B·T = 1024, 2048; T = 256)", transformer);

    double worst = 1e30, sum_log = 0;
    for (const Row& r : transformer) {
        worst = std::min(worst, r.op_gflops / r.raw_gflops);
        sum_log += std::log(r.op_gflops / r.raw_gflops);
    }
    fmt::print("\ntransformer shapes: op/raw worst {:.3f}, geometric mean {:.3f} (target >= 0.9)\n",
               worst, std::exp(sum_log / transformer.size()));
    bf16_table(2048, 384);
    return 0;
}
