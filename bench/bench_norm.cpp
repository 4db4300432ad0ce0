// Normalisation kernels in GB/s, against a memcpy moving the same bytes in the same run.
//
//   ninja -C build && QK_NUM_THREADS=1 ./build/bench/bench_norm
//
// Bytes are counted once per tensor read or written (x, dy, y, dx, mean/rstd/norm, weight,
// bias, dweight, dbias): the least traffic any kernel could make. memcpy_gbps(B / 2) moves the
// same B bytes (B/2 read + B/2 written), so "/ memcpy" is the fraction of the memory speed this
// machine reaches on that working set (small shapes fit in L2/L3; (8192, 384) does not).
// Columns: v1, the naive kernel (plain loops, one thread); v2, the fast kernel the ops call;
// op, the public function (forward only: allocation, contiguity checks, no autograd).
#include <fmt/format.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "bench_util.h"
#include "core/factory.h"
#include "core/threading.h"
#include "ops/norm.h"

using namespace qk;

namespace {

struct Shape2 {
    int64_t rows, C;
};

void row(const std::string& name, Shape2 s, double bytes, const std::function<void()>& v1,
         const std::function<void()>& v2, const std::function<void()>& op) {
    const double gb = bytes / 1e9;
    const double t1 = bench::time_median(v1), t2 = bench::time_median(v2);
    const std::string op_col = op ? fmt::format("{:.1f}", gb / bench::time_median(op)) : "—";
    const double mc = bench::memcpy_gbps(static_cast<size_t>(bytes / 2));
    fmt::print("| {} | {}×{} | {:.2f} | {:.1f} | {:.1f} | {} | {:.1f} | {:.2f} |\n", name, s.rows,
               s.C, bytes / 1e6, gb / t1, gb / t2, op_col, mc, gb / t2 / mc);
}

void bench_shape(Shape2 s) {
    const int64_t n = s.rows * s.C, R = s.rows, C = s.C;
    Generator gen(1);
    Tensor xt = randn({R, C}, kF32, gen), wt = randn({C}, kF32, gen), bt = randn({C}, kF32, gen);
    const float *x = xt.data<float>(), *w = wt.data<float>(), *b = bt.data<float>();
    std::vector<float> dy_v = randn({n}, kF32, gen).to_vector<float>(), y(n), dx(n);
    std::vector<float> mean(R), rstd(R), dw(C), db(C);
    const float* dy = dy_v.data();
    const double f = sizeof(float);
    NoGradGuard no_grad;

    // layer_norm forward: read x, weight, bias; write y, mean, rstd.
    row(
        "layer_norm fwd", s, f * (2 * n + 2 * C + 2 * R),
        [&] {
            cpu::layer_norm_forward_v1(y.data(), mean.data(), rstd.data(), x, w, b, R, C, 1e-5f);
        },
        [&] { cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x, w, b, R, C, 1e-5f); },
        [&] { layer_norm(xt, wt, bt); });
    // layer_norm backward: read dy, x, mean, rstd, weight; write dx, dweight, dbias.
    row(
        "layer_norm bwd", s, f * (3 * n + 3 * C + 2 * R),
        [&] {
            cpu::layer_norm_backward_v1(dx.data(), dw.data(), db.data(), dy, x, mean.data(),
                                        rstd.data(), w, R, C);
        },
        [&] {
            cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dy, x, mean.data(),
                                     rstd.data(), w, R, C);
        },
        nullptr);
    // rms_norm forward: read x, weight; write y, rstd.
    row(
        "rms_norm fwd", s, f * (2 * n + C + R),
        [&] { cpu::rms_norm_forward_v1(y.data(), rstd.data(), x, w, R, C, 1e-6f); },
        [&] { cpu::rms_norm_forward(y.data(), rstd.data(), x, w, R, C, 1e-6f); },
        [&] { rms_norm(xt, wt); });
    // rms_norm backward: read dy, x, rstd, weight; write dx, dweight.
    row(
        "rms_norm bwd", s, f * (3 * n + 2 * C + R),
        [&] { cpu::rms_norm_backward_v1(dx.data(), dw.data(), dy, x, rstd.data(), w, R, C); },
        [&] { cpu::rms_norm_backward(dx.data(), dw.data(), dy, x, rstd.data(), w, R, C); },
        nullptr);
    // lp_normalize forward: read x; write y, norm. p = 2 and integer p in 3..8 have vectorised
    // paths; any other p (here 1.5) calls std::pow per element.
    for (float p : {2.0f, 3.0f, 1.5f})
        row(
            fmt::format("lp_normalize fwd p={}", p), s, f * (2 * n + R),
            [&] { cpu::lp_normalize_forward_v1(y.data(), mean.data(), x, R, C, p, 1e-12f); },
            [&] { cpu::lp_normalize_forward(y.data(), mean.data(), x, R, C, p, 1e-12f); },
            [&] { lp_normalize(xt, p); });
    // lp_normalize backward: read dy, x, norm; write dx.
    for (float p : {2.0f, 3.0f})
        row(
            fmt::format("lp_normalize bwd p={}", p), s, f * (3 * n + R),
            [&] { cpu::lp_normalize_backward_v1(dx.data(), dy, x, mean.data(), R, C, p, 1e-12f); },
            [&] { cpu::lp_normalize_backward(dx.data(), dy, x, mean.data(), R, C, p, 1e-12f); },
            nullptr);
}

}  // namespace

int main() {
    fmt::print("bench_norm: float32, {} thread(s) (QK_NUM_THREADS); GB/s = bytes / median time\n\n",
               num_threads());
    fmt::print(
        "| op | rows×C | MB moved | v1 GB/s | v2 GB/s | op GB/s | memcpy GB/s | v2 / memcpy |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    // (4096, 32): per-head QK-norm rows at config A (B·T·H rows of D = 32), where the cost per row
    // matters more than the bytes.
    for (Shape2 s : {Shape2{4096, 32}, Shape2{2048, 128}, Shape2{2048, 384}, Shape2{8192, 384}})
        bench_shape(s);
    return 0;
}
