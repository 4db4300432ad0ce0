// Normalisations: forward against naive double loops, the fast kernels (v2) against the naive ones
// (v1), float64 gradchecks, float32 against float64, eps on all-zero rows, and bad inputs.
#include <functional>

#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

using Values = std::vector<double>;

// ---- independent references: double loops over row-major values -----------------------------

Values ref_layer_norm(const Values& x, int64_t C, const Values& w, const Values& b, double eps) {
    Values y(x.size());
    for (size_t o = 0; o < x.size(); o += C) {
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C; ++c) mean += x[o + c] / C;
        for (int64_t c = 0; c < C; ++c) var += (x[o + c] - mean) * (x[o + c] - mean) / C;
        for (int64_t c = 0; c < C; ++c)
            y[o + c] = (x[o + c] - mean) / std::sqrt(var + eps) * w[c] + (b.empty() ? 0 : b[c]);
    }
    return y;
}

Values ref_rms_norm(const Values& x, int64_t C, const Values& w, double eps) {
    Values y(x.size());
    for (size_t o = 0; o < x.size(); o += C) {
        double ms = 0;
        for (int64_t c = 0; c < C; ++c) ms += x[o + c] * x[o + c] / C;
        for (int64_t c = 0; c < C; ++c)
            y[o + c] = x[o + c] / std::sqrt(ms + eps) * (w.empty() ? 1 : w[c]);
    }
    return y;
}

// Normalises along dim `d` of a row-major tensor of shape `shape`: (outer, n, inner) walk.
Values ref_lp_normalize(const Values& x, const Shape& shape, double p, int64_t d, double eps) {
    int64_t outer = 1, inner = 1, n = shape[d];
    for (int64_t i = 0; i < d; ++i) outer *= shape[i];
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
    Values y(x.size());
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            double s = 0;
            for (int64_t k = 0; k < n; ++k) s += std::pow(std::abs(x[(o * n + k) * inner + i]), p);
            const double denom = std::max(std::pow(s, 1 / p), eps);
            for (int64_t k = 0; k < n; ++k)
                y[(o * n + k) * inner + i] = x[(o * n + k) * inner + i] / denom;
        }
    return y;
}

double max_diff(const Values& a, const Values& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    return worst;
}

bool all_finite(const Tensor& t) {
    for (double v : t.to_vector<double>())
        if (!std::isfinite(v)) return false;
    return true;
}

// A float64 leaf with every |element| in [0.5, 1.5] and random signs: away from p = 1's kink.
Tensor leaf_away_from_zero(const Shape& shape, uint64_t seed) {
    Tensor t = leaf(shape, seed);
    NoGradGuard no_grad;
    auto v = t.to_vector<double>();
    for (double& e : v) e = (e >= 0 ? 1 : -1) * (0.5 + std::fmod(std::abs(e), 1.0));
    copy_into(t, from_vector(v, shape, kF64));
    return t;
}

// Restores the thread count when a test that changed it ends.
struct ThreadsGuard {
    int saved = num_threads();
    ~ThreadsGuard() { set_num_threads(saved); }
};

}  // namespace

TEST_CASE("layer_norm forward matches double loops, with and without bias, non-contiguous x") {
    Tensor x = leaf({5, 4, 6}, 1).detach().transpose(0, 2);  // (6, 4, 5), not contiguous
    Tensor w = leaf({5}, 2).detach(), b = leaf({5}, 3).detach();
    const Values xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
    Tensor y = layer_norm(x, w, b, 1e-5);
    CHECK(y.shape() == x.shape());
    CHECK(max_diff(y.to_vector<double>(), ref_layer_norm(xv, 5, wv, bv, 1e-5)) < 1e-12);
    CHECK(max_diff(layer_norm(x, w, Tensor(), 0.1).to_vector<double>(),
                   ref_layer_norm(xv, 5, wv, {}, 0.1)) < 1e-12);
}

TEST_CASE("rms_norm forward matches double loops, with and without weight") {
    Tensor x = leaf({7, 9}, 4).detach().narrow(1, 1, 6);  // rows of 6 with a stride of 9
    Tensor w = leaf({6}, 5).detach();
    const Values xv = x.to_vector<double>();
    CHECK(max_diff(rms_norm(x, w, 1e-6).to_vector<double>(),
                   ref_rms_norm(xv, 6, w.to_vector<double>(), 1e-6)) < 1e-12);
    CHECK(max_diff(rms_norm(x, Tensor(), 0.5).to_vector<double>(), ref_rms_norm(xv, 6, {}, 0.5)) <
          1e-12);
}

TEST_CASE(
    "lp_normalize forward matches double loops for p in {1, 1.5, 2, 3, 4, 7}, dims 0, 1, -1") {
    Tensor x = leaf({3, 4, 5}, 6).detach();
    const Values xv = x.to_vector<double>();
    for (double p : {1.0, 1.5, 2.0, 3.0, 4.0, 7.0})
        for (int64_t dim : {0, 1, -1}) {
            CAPTURE(p);
            CAPTURE(dim);
            Tensor y = lp_normalize(x, p, dim);
            CHECK(y.shape() == x.shape());
            const int64_t d = dim < 0 ? dim + 3 : dim;
            CHECK(max_diff(y.to_vector<double>(), ref_lp_normalize(xv, x.shape(), p, d, 1e-12)) <
                  1e-12);
        }
    // The transposed input goes through the same path: normalise dim 0 of x^T = dim 1 of x.
    Tensor xt = x.transpose(0, 1);  // (4, 3, 5)
    CHECK(max_diff(lp_normalize(xt, 3.0, 0).transpose(0, 1).to_vector<double>(),
                   ref_lp_normalize(xv, x.shape(), 3.0, 1, 1e-12)) < 1e-12);
}

// ---- kernel ladder: v2 (what the ops call) against v1 (the formulas) -------------------------

namespace {

template <class T>
std::vector<T> random_values(int64_t n, uint64_t seed) {
    Generator gen(seed);
    return randn({n}, dtype_of<T>(), gen).template to_vector<T>();
}

// max |a - b| / (1 + |b|): absolute near 0, relative for the Σ_rows sums in dweight, dbias.
template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i)
        worst =
            std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1 + std::abs(double(b[i]))));
    return worst;
}

template <class T>
void check_ladder(int64_t rows, int64_t C, double tol) {
    const int64_t n = rows * C;
    const auto x = random_values<T>(n, 10), dy = random_values<T>(n, 11);
    const auto w = random_values<T>(C, 12), b = random_values<T>(C, 13);
    // dweight, dbias are sums over rows, which v2 adds in another order with two threads (two
    // partial sums): their rounding differs by a random walk over the rows, ~sqrt(rows) ulps.
    const double tol_sum = tol * std::sqrt(double(rows));
    std::vector<T> y1(n), y2(n), dx1(n), dx2(n), m1(rows), m2(rows), s1(rows), s2(rows);
    std::vector<T> dw1(C), dw2(C), db1(C), db2(C);
    for (const T* bias : {b.data(), static_cast<const T*>(nullptr)}) {
        cpu::layer_norm_forward_v1(y1.data(), m1.data(), s1.data(), x.data(), w.data(), bias, rows,
                                   C, T(1e-5));
        cpu::layer_norm_forward(y2.data(), m2.data(), s2.data(), x.data(), w.data(), bias, rows, C,
                                T(1e-5));
        CHECK(rel_diff(y2, y1) < tol);
        CHECK(rel_diff(m2, m1) < tol);
        CHECK(rel_diff(s2, s1) < tol);
        T* dbias1 = bias ? db1.data() : nullptr;
        T* dbias2 = bias ? db2.data() : nullptr;
        cpu::layer_norm_backward_v1(dx1.data(), dw1.data(), dbias1, dy.data(), x.data(), m1.data(),
                                    s1.data(), w.data(), rows, C);
        cpu::layer_norm_backward(dx2.data(), dw2.data(), dbias2, dy.data(), x.data(), m1.data(),
                                 s1.data(), w.data(), rows, C);
        CHECK(rel_diff(dx2, dx1) < tol);
        CHECK(rel_diff(dw2, dw1) < tol_sum);
        CHECK(rel_diff(db2, db1) < tol_sum);
    }
    for (const T* weight : {w.data(), static_cast<const T*>(nullptr)}) {
        cpu::rms_norm_forward_v1(y1.data(), s1.data(), x.data(), weight, rows, C, T(1e-6));
        cpu::rms_norm_forward(y2.data(), s2.data(), x.data(), weight, rows, C, T(1e-6));
        CHECK(rel_diff(y2, y1) < tol);
        CHECK(rel_diff(s2, s1) < tol);
        T* dweight1 = weight ? dw1.data() : nullptr;
        T* dweight2 = weight ? dw2.data() : nullptr;
        cpu::rms_norm_backward_v1(dx1.data(), dweight1, dy.data(), x.data(), s1.data(), weight,
                                  rows, C);
        cpu::rms_norm_backward(dx2.data(), dweight2, dy.data(), x.data(), s1.data(), weight, rows,
                               C);
        CHECK(rel_diff(dx2, dx1) < tol);
        if (weight) CHECK(rel_diff(dw2, dw1) < tol_sum);
    }
    for (double p : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 7.0, 8.0, 9.0}) {
        CAPTURE(p);
        cpu::lp_normalize_forward_v1(y1.data(), s1.data(), x.data(), rows, C, T(p), T(1e-12));
        cpu::lp_normalize_forward(y2.data(), s2.data(), x.data(), rows, C, T(p), T(1e-12));
        CHECK(rel_diff(y2, y1) < tol);
        CHECK(rel_diff(s2, s1) < tol);
        cpu::lp_normalize_backward_v1(dx1.data(), dy.data(), x.data(), s1.data(), rows, C, T(p),
                                      T(1e-12));
        cpu::lp_normalize_backward(dx2.data(), dy.data(), x.data(), s1.data(), rows, C, T(p),
                                   T(1e-12));
        CHECK(rel_diff(dx2, dx1) < tol);
    }
}

}  // namespace

TEST_CASE("kernel ladder: v2 matches v1, float64 and float32, one and two threads") {
    ThreadsGuard guard;
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        set_num_threads(threads);
        // Ragged C (not a multiple of the SIMD width); the second shape is above the threading
        // threshold (2^15 elements), so the per-thread dweight buffers are exercised.
        check_ladder<double>(7, 37, 1e-12);
        check_ladder<double>(300, 131, 1e-12);
        // float32: both kernels round differently (v2 sums in SIMD lanes); ~8 ulps of an O(1)
        // value.
        check_ladder<float>(7, 37, 1e-6);
        check_ladder<float>(300, 131, 1e-6);
    }
}

TEST_CASE("parameter gradients are the same run to run with two threads") {
    ThreadsGuard guard;
    set_num_threads(2);
    const int64_t rows = 512, C = 96;
    const auto x = random_values<float>(rows * C, 20), dy = random_values<float>(rows * C, 21);
    const auto w = random_values<float>(C, 22);
    std::vector<float> mean(rows), rstd(rows), y(rows * C), dx(rows * C);
    cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                            static_cast<const float*>(nullptr), rows, C, 1e-5f);
    std::vector<float> dw_first(C), db_first(C), dw(C), db(C);
    cpu::layer_norm_backward(dx.data(), dw_first.data(), db_first.data(), dy.data(), x.data(),
                             mean.data(), rstd.data(), w.data(), rows, C);
    for (int run = 0; run < 5; ++run) {
        cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), mean.data(),
                                 rstd.data(), w.data(), rows, C);
        CHECK(dw == dw_first);
        CHECK(db == db_first);
    }
}

// ---- gradients -------------------------------------------------------------------------------

TEST_CASE("layer_norm gradients match finite differences") {
    Tensor x = leaf({4, 6}, 30), w = leaf({6}, 31), b = leaf({6}, 32), xt = leaf({4, 5}, 33);
    Tensor x3 = leaf({2, 3, 9}, 34);
    CHECK_GRADCHECK([&] { return layer_norm(x, w, b, 1e-5); }, {x, w, b});
    CHECK_GRADCHECK([&] { return layer_norm(x, w, Tensor(), 1e-5); }, {x, w});
    CHECK_GRADCHECK([&] { return layer_norm(xt.t(), w.narrow(0, 1, 4), b.narrow(0, 2, 4)); },
                    {xt, w, b});
    CHECK_GRADCHECK([&] { return layer_norm(x3.narrow(2, 2, 6), w, b, 0.5); }, {x3, w, b});
}

TEST_CASE("rms_norm gradients match finite differences") {
    Tensor x = leaf({4, 6}, 40), w = leaf({6}, 41), xt = leaf({6, 5}, 42), w8 = leaf({8}, 43);
    CHECK_GRADCHECK([&] { return rms_norm(x, w, 1e-6); }, {x, w});
    CHECK_GRADCHECK([&] { return rms_norm(x, Tensor(), 1e-6); }, {x});
    CHECK_GRADCHECK([&] { return rms_norm(xt.t().narrow(0, 1, 4), w8.narrow(0, 2, 6), 0.3); },
                    {xt, w8});
}

// A norm that rotates its output (the QK-norm before RoPE, one op): the cpu runs the two steps,
// so the values are rope's after the norm's to the bit; the gradients through both.
TEST_CASE(
    "a norm that rotates its output is rope after the norm, gradients by finite differences") {
    const RopeTables t = rope_tables(5, 6, 10000.0, kF64);
    Tensor x = leaf({2, 3, 5, 6}, 70), w = leaf({6}, 71), b = leaf({6}, 72);  // (B, H, T, D)
    CHECK(max_abs_diff(layer_norm(x, w, b, 1e-5, Precision::full, t),
                       rope(layer_norm(x, w, b, 1e-5), t.cos, t.sin)) == 0);
    CHECK(max_abs_diff(rms_norm(x, w, 1e-6, Precision::full, t),
                       rope(rms_norm(x, w, 1e-6), t.cos, t.sin)) == 0);
    CHECK_GRADCHECK([&] { return layer_norm(x, w, b, 1e-5, Precision::full, t); }, {x, w, b});
    CHECK_GRADCHECK([&] { return rms_norm(x, w, 1e-6, Precision::full, t); }, {x, w});
    CHECK_GRADCHECK([&] { return rms_norm(x, Tensor(), 1e-6, Precision::full, t); }, {x});
    // Heads seen in c_attn's (B, T, H, D) output, as the attention hands them over.
    Tensor by_time = leaf({2, 5, 3, 6}, 73);
    CHECK_GRADCHECK(
        [&] { return layer_norm(by_time.transpose(1, 2), w, b, 1e-5, Precision::full, t); },
        {by_time, w, b});
}

TEST_CASE("on the cpu a rotating norm's gradients are rope's then the norm's, bit for bit") {
    // The cpu runs the same two kernels in each direction, so training is unchanged by the fusion.
    for (DType dtype : {kF32, kF64}) {
        CAPTURE(dtype);
        const RopeTables t = rope_tables(7, 8, 10000.0, dtype);
        auto grads = [&](bool fused) {
            Generator gen(80);
            Tensor x = normal({2, 7, 3, 8}, 0, 2, dtype, gen).requires_grad_();  // (B, T, H, D)
            Tensor w = normal({8}, 1, 0.1, dtype, gen).requires_grad_();
            Tensor b = normal({8}, 0, 0.1, dtype, gen).requires_grad_();
            const Tensor probe = normal({2, 3, 7, 8}, 0, 1, dtype, gen);
            const Tensor heads = x.transpose(1, 2);
            const Tensor y = fused ? layer_norm(heads, w, b, 1e-5, Precision::full, t)
                                   : rope(layer_norm(heads, w, b, 1e-5), t.cos, t.sin);
            sum(y * probe).backward();
            return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
        };
        const auto fused = grads(true), composed = grads(false);
        for (size_t i = 0; i < fused.size(); ++i) CHECK(max_abs_diff(fused[i], composed[i]) == 0);
    }
}

TEST_CASE("lp_normalize gradients match finite differences: p, dims, transposed input") {
    Tensor x = leaf({3, 4, 5}, 50), xt = leaf({5, 4}, 51);
    for (double p : {1.5, 2.0, 3.0, 4.0, 7.0})
        for (int64_t dim : {0, 1, -1}) {
            CAPTURE(p);
            CAPTURE(dim);
            CHECK_GRADCHECK([&] { return lp_normalize(x, p, dim); }, {x});
        }
    CHECK_GRADCHECK([&] { return lp_normalize(xt.t(), 2.5, -1); }, {xt});
    // p = 1 is smooth away from x_i = 0, where the subgradient sign(x) is the gradient.
    Tensor away = leaf_away_from_zero({3, 4, 5}, 52);
    for (int64_t dim : {0, 1, -1}) {
        CAPTURE(dim);
        CHECK_GRADCHECK([&] { return lp_normalize(away, 1.0, dim); }, {away});
    }
}

TEST_CASE("lp_normalize at p = 1 uses the subgradient sign(0) = 0 at exact zeros") {
    Tensor x = from_vector({0, 1, -2, 0, 3}, {1, 5}, kF64).requires_grad_();
    const Values dy = {0.5, -1, 2, 3, -0.25};
    lp_normalize(x, 1.0).backward(from_vector(dy, {1, 5}, kF64));
    // n = ‖x‖_1 = 6, y = x / 6, s = Σ dy·y; dx = (dy - s·sign(y)) / n with sign(0) = 0, so the
    // zeros get only the direct term dy / n.
    const Values xv = {0, 1, -2, 0, 3};
    double s = 0;
    for (int i = 0; i < 5; ++i) s += dy[i] * xv[i] / 6;
    Values expected(5);
    for (int i = 0; i < 5; ++i) expected[i] = (dy[i] - s * ((xv[i] > 0) - (xv[i] < 0))) / 6;
    CHECK(max_diff(x.grad().to_vector<double>(), expected) < 1e-15);
}

TEST_CASE("lp_normalize below eps divides by eps, and its gradient is dy / eps") {
    // Rows 0 and 2 have ‖x‖_2 ≈ 0.05 < eps = 1 (clamped), rows 1 and 3 have ‖x‖_2 ≈ 5 > eps.
    Tensor x = leaf({4, 3}, 60, 0.03), scale = from_vector({1, 100, 1, 100}, {4, 1}, kF64);
    {
        NoGradGuard no_grad;
        copy_into(x, x * scale);
    }
    const Values xv = x.to_vector<double>();
    Tensor y = lp_normalize(x, 2.0, -1, 1.0);
    CHECK(max_diff(y.to_vector<double>(), ref_lp_normalize(xv, {4, 3}, 2.0, 1, 1.0)) < 1e-14);
    CHECK(y.at({0, 1}) == doctest::Approx(x.at({0, 1})));  // divided by eps = 1
    CHECK_GRADCHECK([&] { return lp_normalize(x, 2.0, -1, 1.0); }, {x});
    CHECK_GRADCHECK([&] { return lp_normalize(x, 3.0, -1, 1.0); }, {x});
}

// ---- float32 against float64 -----------------------------------------------------------------

namespace {

struct Run {
    Values y, dx, dw;
};

// Forward and backward of f at dtype dt on x (and w when defined), with upstream gradient probe.
Run run_at(DType dt, const std::function<Tensor(const Tensor&, const Tensor&)>& f,
           const Tensor& x64, const Tensor& w64, const Tensor& probe64) {
    Tensor x = x64.to(dt).detach().requires_grad_();
    Tensor w = w64.defined() ? w64.to(dt).detach().requires_grad_() : Tensor();
    Tensor y = f(x, w);
    y.backward(probe64.to(dt));
    return {y.to_vector<double>(), x.grad().to_vector<double>(),
            w.defined() ? w.grad().to_vector<double>() : Values{}};
}

// max |lo - hi| / max |hi|: the error in units of the result's own scale.
double scaled_diff(const Values& lo, const Values& hi) {
    double scale = 0;
    for (double v : hi) scale = std::max(scale, std::abs(v));
    return max_diff(lo, hi) / scale;
}

// Runs f in float32 and float64 on the same (float32-representable) inputs and checks that y,
// dx and dweight agree to `tol` of their scale.
void check_f32_close(const std::function<Tensor(const Tensor&, const Tensor&)>& f, Tensor x,
                     Tensor w, double tol) {
    x = x.to(kF32).to(kF64);  // round once, so both runs see identical inputs
    if (w.defined()) w = w.to(kF32).to(kF64);
    Generator gen(99);
    Tensor probe = randn(x.shape(), kF64, gen);
    Run lo = run_at(kF32, f, x, w, probe), hi = run_at(kF64, f, x, w, probe);
    CHECK(scaled_diff(lo.y, hi.y) < tol);
    CHECK(scaled_diff(lo.dx, hi.dx) < tol);
    if (w.defined()) CHECK(scaled_diff(lo.dw, hi.dw) < tol);
}

}  // namespace

TEST_CASE("float32 stays close to float64 (C = 4096, a large mean, extreme magnitudes)") {
    Generator gen(70);
    Tensor x = randn({16, 4096}, kF64, gen), w = randn({4096}, kF64, gen) + 1.0;
    Tensor b = randn({4096}, kF64, gen).to(kF32).to(kF64);
    auto ln = [&](const Tensor& xi, const Tensor& wi) {
        return layer_norm(xi, wi, b.to(xi.dtype()));
    };
    auto rms = [](const Tensor& xi, const Tensor& wi) { return rms_norm(xi, wi); };
    // float32 rounds at 6e-8; over sums of 4096 terms (16 SIMD lanes of 256) the measured error
    // is <= 7e-7 of the result's scale.
    const double tol = 2e-6;
    check_f32_close(ln, x, w, tol);
    check_f32_close(rms, x, w, tol);
    // Mean 100, std 1: the float32 mean itself is only known to ulp(100) = 8e-6 of the unit std,
    // so xhat cannot beat that (measured 5e-6 of the scale); the two-pass variance keeps it
    // there, where Σx²/C - mean² would cancel against mean² = 1e4.
    check_f32_close(ln, x + 100.0, w, 2e-5);
    for (double p : {1.0, 1.5, 2.0, 3.0, 4.0, 7.0}) {
        CAPTURE(p);
        auto lp = [p](const Tensor& xi, const Tensor&) { return lp_normalize(xi, p, -1, 1e-30); };
        check_f32_close(lp, x, Tensor(), tol);
        // |x|^p would overflow float32 at 1e20 (p >= 2) or flush to zero at 1e-25 (eps = 1e-30
        // keeps those rows unclamped): the kernel scales each row by 1/max|x| first.
        check_f32_close(lp, x * 1e20, Tensor(), tol);
        check_f32_close(lp, x * 1e-25, Tensor(), tol);
    }
}

// ---- eps and degenerate rows -----------------------------------------------------------------

TEST_CASE("all-zero and constant rows give finite outputs and gradients (eps), no NaN") {
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        Tensor x = zeros({3, 8}, dt);
        x.set({1, 2}, 1.5);  // row 1 is not degenerate
        {
            NoGradGuard no_grad;
            copy_into(x.narrow(0, 2, 1), full({1, 8}, 7.0, dt));  // a constant row
        }
        x.requires_grad_();
        Tensor w = full({8}, 2.0, dt).requires_grad_(), b = full({8}, 0.5, dt).requires_grad_();
        Tensor probe = randn({3, 8}, dt);
        for (auto f : std::vector<std::function<Tensor()>>{
                 [&] { return layer_norm(x, w, b); }, [&] { return rms_norm(x, w); },
                 [&] { return rms_norm(x, Tensor()); }, [&] { return lp_normalize(x, 2.0); },
                 [&] { return lp_normalize(x, 1.0); }, [&] { return lp_normalize(x, 3.0, 0); }}) {
            x.zero_grad();
            w.zero_grad();
            b.zero_grad();
            Tensor y = f();
            y.backward(probe);
            CHECK(all_finite(y));
            CHECK(all_finite(x.grad()));
        }
        Tensor ln = layer_norm(x, w, b);
        CHECK(ln.at({0, 3}) == 0.5);  // zero row: xhat = 0, y = bias
        CHECK(ln.at({2, 3}) == 0.5);  // constant row: x - mean = 0, y = bias
        CHECK(rms_norm(x, w).at({0, 3}) == 0);
        CHECK(lp_normalize(x, 2.0).at({0, 3}) == 0);
    }
}

// ---- bad inputs ------------------------------------------------------------------------------

TEST_CASE("norm bad inputs name the op and what was wrong") {
    Tensor x = zeros({2, 5}), w = ones({5}), w4 = ones({4}), w64 = ones({5}, kF64);
    Tensor ids = from_ids({1, 2, 3, 4}, {2, 2});
    using test::throws_with;
    CHECK(
        throws_with([&] { layer_norm(x, w4, Tensor()); }, {"layer_norm", "weight", "[4]", "[5]"}));
    CHECK(throws_with([&] { layer_norm(x, w, w4); }, {"layer_norm", "bias", "[4]", "[2, 5]"}));
    CHECK(throws_with([&] { layer_norm(x, Tensor(), Tensor()); },
                      {"layer_norm", "weight", "required"}));
    CHECK(throws_with([&] { layer_norm(x, w64, Tensor()); }, {"layer_norm", "float64", "float32"}));
    CHECK(throws_with([&] { layer_norm(x, w, Tensor(), 0); }, {"layer_norm", "eps", "> 0"}));
    CHECK(throws_with([&] { rms_norm(x, w4); }, {"rms_norm", "weight", "[4]", "[2, 5]"}));
    CHECK(throws_with([&] { rms_norm(x, w64); }, {"rms_norm", "float64", "float32"}));
    CHECK(throws_with([&] { rms_norm(ids, Tensor()); }, {"rms_norm", "int32", "[2, 2]"}));
    CHECK(throws_with([&] { layer_norm(ids, w, Tensor()); }, {"layer_norm", "int32"}));
    CHECK(throws_with([&] { rms_norm(scalar_tensor(1), Tensor()); }, {"rms_norm", "shape []"}));
    CHECK(
        throws_with([&] { lp_normalize(x, 0.5); }, {"lp_normalize", "p", ">= 1", "0.5", "[2, 5]"}));
    CHECK(throws_with([&] { lp_normalize(x, std::nan("")); }, {"lp_normalize", ">= 1", "nan"}));
    CHECK(throws_with([&] { lp_normalize(x, INFINITY); }, {"lp_normalize", "finite", "inf"}));
    CHECK(throws_with([&] { lp_normalize(x, 2.0, 2); }, {"lp_normalize", "dim 2", "rank 2"}));
    CHECK(throws_with([&] { lp_normalize(ids, 2.0); }, {"lp_normalize", "int32"}));
    CHECK(throws_with([&] { lp_normalize(x, 2.0, -1, -1e-3); }, {"lp_normalize", "eps", "-0.001"}));
    // A rotation: the tables must fit x's positions (dim −2) and half its last dim, both given.
    const RopeTables t2 = rope_tables(2, 6, 10000.0), t3 = rope_tables(3, 6, 10000.0);
    const Tensor x6 = zeros({4, 2, 6}), w6 = ones({6});
    CHECK(throws_with([&] { layer_norm(x6, w6, Tensor(), 1e-5, Precision::full, t3); },
                      {"layer_norm", "[4, 2, 6]", "[2, 3]", "[3, 3]"}));
    CHECK(throws_with(
        [&] {
            rms_norm(x6, w6, 1e-6, Precision::full, {t2.cos, Tensor()});
        },
        {"rms_norm", "both", "cos and sin"}));
    CHECK(throws_with([&] { rms_norm(x, w, 1e-6, Precision::full, t2); },
                      {"rms_norm", "D even", "[2, 5]"}));
}

TEST_CASE("NormRows: a row's offset is the walk of its (B, H, T) strides, past 2^32 rows too") {
    // (B, H, T) rows of a head view at three strides, as the per-head norms read q and k.
    const NormRows rows{3, {16, 12, 1024}, {1024 * 2304, 64, 2304}};
    auto walk = [&](int64_t r) {  // the plain split, last dim fastest
        const int64_t t = r % 1024, h = (r / 1024) % 12, b = r / (1024 * 12);
        return b * rows.strides[0] + h * rows.strides[1] + t * rows.strides[2];
    };
    for (int64_t r : {int64_t(0), int64_t(1), int64_t(1023), int64_t(1024), int64_t(12 * 1024 - 1),
                      int64_t(12 * 1024), int64_t(196607), int64_t(0xffffffffLL),
                      int64_t(0x100000000LL), int64_t(0x123456789LL)})
        CHECK(rows.offset(r) == walk(r));
}
