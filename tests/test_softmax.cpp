// Softmax and log-softmax: the fused kernel (v2, ops/softmax.cpp) against a naive double loop and
// against v1, the same math written with composite ops; float64 gradchecks on 2-D/3-D/4-D and
// transposed inputs, causal (Tq <= Tk) and soft-cap alone and together; stability; bad inputs.
#include <cmath>
#include <limits>
#include <vector>

#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Naive reference, in double, row by row: the math of the header of ops/softmax.cpp.
std::vector<double> naive_softmax(const Tensor& x, const SoftmaxOptions& o, bool log) {
    const auto v = x.to_vector<double>();
    const int64_t Tk = x.size(-1), Tq = x.dim() >= 2 ? x.size(-2) : 1;
    std::vector<double> out(v.size());
    for (int64_t r = 0; r * Tk < int64_t(v.size()); ++r) {
        const int64_t i = r % Tq;
        std::vector<double> z(Tk);
        double m = -kInf;
        for (int64_t j = 0; j < Tk; ++j) {
            const double xj = v[r * Tk + j];
            z[j] = o.softcap > 0 ? o.softcap * std::tanh(xj / o.softcap) : xj;
            if (o.causal && j > i + (Tk - Tq)) z[j] = -kInf;
            m = std::max(m, z[j]);
        }
        double s = 0;
        for (int64_t j = 0; j < Tk; ++j) s += std::exp(z[j] - m);
        for (int64_t j = 0; j < Tk; ++j)
            out[r * Tk + j] = log ? z[j] - m - std::log(s) : std::exp(z[j] - m) / s;
    }
    return out;
}

// 0 where row i of a (Tq, Tk) score matrix sees key j, -inf where the causal mask hides it.
Tensor causal_mask(int64_t Tq, int64_t Tk, DType dtype) {
    Tensor mask = zeros({Tq, Tk}, dtype);
    for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = i + (Tk - Tq) + 1; j < Tk; ++j) mask.set({i, j}, -kInf);
    return mask;
}

// v1: the same op from composite ops (softcap, add, max, exp, sum, log), differentiable through
// them: the reference the fused kernel's forward and backward are checked against.
Tensor softmax_v1(const Tensor& x, const SoftmaxOptions& o, bool log) {
    Tensor z = o.softcap > 0 ? softcap(x, o.softcap) : x;
    if (o.causal) z = z + causal_mask(x.size(-2), x.size(-1), x.dtype());
    Tensor shifted = z - max(z, {-1}, true);
    Tensor s = sum(exp(shifted), {-1}, true);
    return log ? shifted - qk::log(s) : exp(shifted) / s;
}

// tol: on |got - want| / max(1, |want|).
void check_matches_naive(const Tensor& x, const SoftmaxOptions& o, double tol) {
    for (bool log : {false, true}) {
        Tensor y = log ? log_softmax(x, o) : softmax(x, o);
        REQUIRE(y.shape() == x.shape());
        const auto got = y.to_vector<double>(), want = naive_softmax(x, o, log);
        double worst = 0;
        for (size_t k = 0; k < got.size(); ++k) {
            if (want[k] == -kInf) {
                CHECK(got[k] == -kInf);
                continue;
            }
            // relative to the value for large log-probabilities (float32 rounds -2e4 to 1e-3)
            worst = std::max(worst, std::abs(got[k] - want[k]) / std::max(1.0, std::abs(want[k])));
        }
        INFO("log " << log << " causal " << o.causal << " softcap " << o.softcap);
        CHECK(worst <= tol);
    }
}

}  // namespace

TEST_CASE("softmax and log_softmax match a naive loop, with causal (Tq <= Tk) and soft-cap") {
    Tensor x = leaf({2, 3, 5, 7}, 1, 3.0).detach();  // Tq = 5 < Tk = 7
    Tensor sq = leaf({4, 6, 6}, 2, 3.0).detach();
    for (const SoftmaxOptions o : {SoftmaxOptions{}, SoftmaxOptions{true, 0},
                                   SoftmaxOptions{false, 2.5}, SoftmaxOptions{true, 2.5}}) {
        check_matches_naive(x, o, 1e-14);
        check_matches_naive(sq, o, 1e-14);
        check_matches_naive(x.transpose(0, 1), o, 1e-14);  // non-contiguous
        check_matches_naive(sq.transpose(-1, -2), o, 1e-14);
        check_matches_naive(x.to(kF32), o, 2e-6);
    }
    check_matches_naive(leaf({9}, 3).detach(), {}, 1e-15);  // rank 1
}

TEST_CASE("softmax rows sum to one; masked entries are exactly 0 and -inf") {
    Tensor x = leaf({3, 4, 6}, 4, 2.0).detach();
    Tensor y = softmax(x, {.causal = true, .softcap = 1.5});
    Tensor ly = log_softmax(x, {.causal = true, .softcap = 1.5});
    Tensor rows = sum(y, {-1});
    for (double s : rows.to_vector<double>()) CHECK(s == doctest::Approx(1).epsilon(1e-15));
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 6; ++j) {
            const bool masked = j > i + 2;
            CHECK((y.at({1, i, j}) == 0) == masked);
            CHECK((ly.at({1, i, j}) == -kInf) == masked);
        }
    CHECK(max_abs_diff(exp(ly), y) < 1e-15);
}

TEST_CASE("softmax is stable at logits of 1e4 and gives no NaN on rows of -inf") {
    Tensor x = leaf({3, 8}, 5).detach() * 1e4;
    check_matches_naive(x, {}, 1e-14);
    check_matches_naive(x.to(kF32), {}, 1e-6);
    check_matches_naive(x.to(kF32), {.causal = false, .softcap = 30}, 2e-6);
    for (double v : softmax(x.to(kF32)).to_vector<double>()) CHECK(std::isfinite(v));

    // Row 0 has nothing finite: softmax 0, log_softmax -inf, gradient 0. Row 1 has one -inf.
    Tensor z = from_vector({-kInf, -kInf, -kInf, 0.5, -kInf, 1.5}, {2, 3}, kF64);
    z.requires_grad_();
    Tensor y = softmax(z), ly = log_softmax(z);
    for (int64_t j = 0; j < 3; ++j) {
        CHECK(y.at({0, j}) == 0);
        CHECK(ly.at({0, j}) == -kInf);
    }
    CHECK(y.at({1, 1}) == 0);
    CHECK(y.at({1, 2}) == doctest::Approx(1 / (1 + std::exp(-1.0))));
    Tensor g = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, kF64);
    y.backward(g);
    for (double v : z.grad().to_vector<double>()) CHECK(std::isfinite(v));
    CHECK(z.grad().at({0, 0}) == 0);
    z.zero_grad();
    ly.backward(g);
    for (int64_t j = 0; j < 3; ++j) CHECK(z.grad().at({0, j}) == 0);
    for (double v : z.grad().to_vector<double>()) CHECK(std::isfinite(v));
}

TEST_CASE("float32 softmax with Gemma's cap 50: underflowed probabilities get a finite gradient") {
    // capped logits ~ ±50: exp(-100) is below float's normal range, so y = 0 (flushed) there;
    // the soft-cap backward must not take log(0) (see the header of ops/softmax.cpp).
    Tensor x64 = from_vector({200, -200, 0, 10, -300, 40}, {2, 3}, kF64);
    x64.requires_grad_();
    Tensor x32 = x64.detach().to(kF32);
    x32.requires_grad_();
    Tensor g = from_vector({1, -2, 3, 0.5, 2, -1}, {2, 3}, kF64);
    softmax(x32, {.softcap = 50}).backward(g.to(kF32));
    softmax_v1(x64, {.softcap = 50}, false).backward(g);
    for (double v : x32.grad().to_vector<double>()) CHECK(std::isfinite(v));
    CHECK(max_abs_diff(x32.grad().to(kF64), x64.grad()) < 1e-6);
}

TEST_CASE("a float32 row of 50257 logits matches the float64 reference") {
    Tensor x = leaf({2, 50257}, 6, 4.0).detach();
    for (bool log : {false, true}) {
        const auto got = (log ? log_softmax(x.to(kF32)) : softmax(x.to(kF32))).to_vector<double>();
        const auto want = naive_softmax(x, {}, log);
        double worst_rel = 0;
        for (size_t k = 0; k < got.size(); ++k)
            worst_rel = std::max(worst_rel, std::abs(got[k] - want[k]) / std::abs(want[k]));
        CHECK(worst_rel < 1e-5);
    }
}

TEST_CASE("kernel ladder: fused v2 matches composite v1, forward and backward") {
    for (const SoftmaxOptions o : {SoftmaxOptions{}, SoftmaxOptions{true, 0},
                                   SoftmaxOptions{false, 2.0}, SoftmaxOptions{true, 2.0}}) {
        for (bool log : {false, true}) {
            Tensor x = leaf({2, 3, 5, 8}, 7, 3.0);
            Tensor g = leaf({2, 3, 5, 8}, 8).detach();
            // Masked outputs are constants for v2, but x_j + (-inf) for v1, whose gradient
            // would pass dy_j through: compare with dy = 0 there.
            if (o.causal) g = g * exp(causal_mask(5, 8, kF64));
            Tensor y2 = log ? log_softmax(x, o) : softmax(x, o);
            y2.backward(g);
            Tensor dx2 = x.grad();
            x.zero_grad();
            Tensor y1 = softmax_v1(x, o, log);
            y1.backward(g);
            INFO("log " << log << " causal " << o.causal << " softcap " << o.softcap);
            const auto a = y1.to_vector<double>(), b = y2.to_vector<double>();
            for (size_t k = 0; k < a.size(); ++k)
                CHECK((a[k] == b[k] || std::abs(a[k] - b[k]) < 1e-14));  // equal -inf, or close
            CHECK(max_abs_diff(x.grad(), dx2) < 1e-13);
        }
    }
}

TEST_CASE("softmax and log_softmax gradients: 2-D/3-D/4-D, transposed, causal, soft-cap") {
    Tensor a = leaf({4, 6}, 11, 2.0);
    Tensor b = leaf({3, 5, 5}, 12, 2.0);
    Tensor c = leaf({2, 2, 3, 6}, 13, 2.0);  // Tq = 3 < Tk = 6
    Tensor d = leaf({2, 7, 4}, 14, 2.0);     // d.transpose(-1, -2): (2, 4, 7), non-contiguous
    const SoftmaxOptions plain{}, causal{true, 0}, capped{false, 1.5}, both{true, 1.5};
    for (bool log : {false, true}) {
        auto f = [log](const Tensor& x, const SoftmaxOptions& o) {
            return log ? log_softmax(x, o) : softmax(x, o);
        };
        INFO("log " << log);
        CHECK_GRADCHECK([&] { return f(a, plain); }, {a});
        CHECK_GRADCHECK([&] { return f(a, capped); }, {a});
        CHECK_GRADCHECK([&] { return f(b, causal); }, {b});
        CHECK_GRADCHECK([&] { return f(b, both); }, {b});
        CHECK_GRADCHECK([&] { return f(c, causal); }, {c});
        CHECK_GRADCHECK([&] { return f(c, both); }, {c});
        CHECK_GRADCHECK([&] { return f(d.transpose(-1, -2), both); }, {d});
        CHECK_GRADCHECK([&] { return f(d.transpose(0, 1), plain); }, {d});
        CHECK_GRADCHECK([&] { return f(c * 4.0, {true, 3.0}); }, {c});  // the cap saturating
    }
}

TEST_CASE("softmax bad inputs") {
    CHECK(test::throws_with([] { softmax(from_ids({1, 2})); }, {"softmax", "int32", "[2]"}));
    CHECK(test::throws_with([] { log_softmax(scalar_tensor(1)); }, {"log_softmax", "[]"}));
    CHECK(test::throws_with([] { softmax(zeros({5}), {.causal = true}); },
                            {"softmax", "causal", "[5]"}));
    CHECK(test::throws_with(
        [] {
            softmax(zeros({2, 6, 4}), {.causal = true});
        },
        {"softmax", "Tq <= Tk", "[2, 6, 4]", "Tq = 6", "Tk = 4"}));
    CHECK(test::throws_with(
        [] {
            log_softmax(zeros({2, 3}), {.softcap = -1});
        },
        {"log_softmax", "softcap", "-1", "[2, 3]"}));
    CHECK(test::throws_with(
        [] {
            softmax(zeros({2, 3}), {.softcap = NAN});
        },
        {"softmax", "softcap", "nan"}));
}
