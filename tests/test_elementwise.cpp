// Elementwise ops: forward against std:: math per element, float64 gradchecks (broadcast,
// non-contiguous), and bad inputs.
#include <functional>
#include <optional>

#include "helpers.h"
#include "ops/elementwise_math.h"  // math::tanh_fast (internal: not in qk.h)
#include "ops/glu.h"

using namespace qk;
using qk::test::leaf;

namespace {

// Checks y = op(x) against ref applied per element (x read through its own strides).
void check_unary(const std::function<Tensor(const Tensor&)>& op, double (*ref)(double), Tensor x) {
    Tensor y = op(x);
    auto xs = x.to_vector<double>(), ys = y.to_vector<double>();
    REQUIRE(y.shape() == x.shape());
    for (size_t i = 0; i < xs.size(); ++i)
        CHECK(ys[i] == doctest::Approx(ref(xs[i])).epsilon(1e-12));
}

// op(NaN) and its gradient stay NaN (not clamped to a number), and op(+inf) is the function's
// limit there: +inf for an unbounded op, its bound for a bounded one (tanh: 1), never the NaN of
// inf / inf; likewise op(-inf) when `at_minus_inf` is given.
void check_nan_and_inf(const std::function<Tensor(const Tensor&)>& op,
                       double at_plus_inf = INFINITY,
                       std::optional<double> at_minus_inf = std::nullopt) {
    Tensor odd = from_vector({std::nan(""), INFINITY, -INFINITY}, {3}, kF32);
    odd.requires_grad_();
    Tensor y = op(odd);
    y.backward(ones({3}));
    CHECK(std::isnan(y.to_vector<double>()[0]));
    CHECK(std::isnan(odd.grad().to_vector<double>()[0]));
    CHECK(y.to_vector<double>()[1] == at_plus_inf);
    if (at_minus_inf) CHECK(y.to_vector<double>()[2] == *at_minus_inf);
}

double gelu_ref(double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double silu_ref(double x) { return x / (1 + std::exp(-x)); }
double relu_ref(double x) { return x > 0 ? x : 0; }
double softcap3_ref(double x) { return 3 * std::tanh(x / 3); }
double neg_ref(double x) { return -x; }
double rsqrt_ref(double x) { return 1 / std::sqrt(x); }
double pow3_ref(double x) { return x * x * x; }

}  // namespace

TEST_CASE("unary forward matches std:: math, on a transposed input") {
    Tensor x = leaf({5, 7}, 1).detach().t();  // non-contiguous
    Tensor pos = abs(x) + 0.1;
    check_unary([](const Tensor& t) { return exp(t); }, std::exp, x);
    check_unary([](const Tensor& t) { return log(t); }, std::log, pos);
    check_unary([](const Tensor& t) { return sqrt(t); }, std::sqrt, pos);
    check_unary([](const Tensor& t) { return rsqrt(t); }, rsqrt_ref, pos);
    check_unary([](const Tensor& t) { return abs(t); }, std::fabs, x);
    check_unary([](const Tensor& t) { return tanh(t); }, std::tanh, x);
    check_unary([](const Tensor& t) { return sigmoid(t); }, sigmoid_ref, x * 20.0);
    check_unary([](const Tensor& t) { return relu(t); }, relu_ref, x);
    check_unary([](const Tensor& t) { return gelu(t); }, gelu_ref, x);
    check_unary([](const Tensor& t) { return silu(t); }, silu_ref, x * 20.0);
    check_unary([](const Tensor& t) { return softcap(t, 3); }, softcap3_ref, x * 10.0);
    check_unary([](const Tensor& t) { return -t; }, neg_ref, x);
    check_unary([](const Tensor& t) { return pow(t, 3); }, pow3_ref, x);
}

TEST_CASE("binary ops broadcast like numpy") {
    Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, kF64);
    Tensor b = from_vector({10, 20, 30}, {3}, kF64);
    Tensor c = from_vector({100, 200}, {2, 1}, kF64);
    CHECK((a + b).to_vector<double>() == std::vector<double>{11, 22, 33, 14, 25, 36});
    CHECK((a - c).to_vector<double>() == std::vector<double>{-99, -98, -97, -196, -195, -194});
    CHECK((b * c).shape() == Shape{2, 3});
    CHECK((b * c).to_vector<double>() == std::vector<double>{1000, 2000, 3000, 2000, 4000, 6000});
    CHECK((a / b).at({1, 2}) == doctest::Approx(0.2));
    CHECK((2.0 - a).at({0, 1}) == 0);
    CHECK((6.0 / a).at({1, 2}) == 1);
    CHECK((a * 0.5).at({1, 1}) == 2.5);
    CHECK((a + scalar_tensor(1, kF64)).at({0, 0}) == 2);
}

TEST_CASE("unary gradients match finite differences") {
    Tensor x = leaf({3, 4}, 2);
    Tensor pos = leaf({3, 4}, 3);
    {
        NoGradGuard g;  // move pos away from 0 for log/sqrt/pow
        Tensor shifted = abs(pos) + 0.5;
        copy_into(pos, shifted);
    }
    CHECK_GRADCHECK([&] { return exp(x); }, {x});
    CHECK_GRADCHECK([&] { return log(pos); }, {pos});
    CHECK_GRADCHECK([&] { return sqrt(pos); }, {pos});
    CHECK_GRADCHECK([&] { return rsqrt(pos); }, {pos});
    CHECK_GRADCHECK([&] { return pow(pos, 2.5); }, {pos});
    CHECK_GRADCHECK([&] { return abs(x); }, {x});
    CHECK_GRADCHECK([&] { return tanh(x); }, {x});
    CHECK_GRADCHECK([&] { return sigmoid(x); }, {x});
    CHECK_GRADCHECK([&] { return relu(x); }, {x});
    CHECK_GRADCHECK([&] { return gelu(x); }, {x});
    CHECK_GRADCHECK([&] { return silu(x * 3.0); }, {x});
    CHECK_GRADCHECK([&] { return softcap(x * 5.0, 2.0); }, {x});
    CHECK_GRADCHECK([&] { return -x; }, {x});
    CHECK_GRADCHECK([&] { return 3.0 / pos + (1.0 - x) * 2.0 - 4.0; }, {x, pos});
    // On a non-contiguous view too (the op makes its input contiguous; its gradient must land
    // back in the view's layout).
    CHECK_GRADCHECK([&] { return tanh(x.t()); }, {x});
    CHECK_GRADCHECK([&] { return gelu(x.t()); }, {x});
    CHECK_GRADCHECK([&] { return softcap(x.t() * 5.0, 2.0); }, {x});
    CHECK_GRADCHECK([&] { return log(pos.t()); }, {pos});
}

TEST_CASE("bounded ops give their limits at ±inf, not NaN; NaN stays NaN") {
    check_nan_and_inf([](const Tensor& x) { return tanh(x); }, 1.0, -1.0);
    check_nan_and_inf([](const Tensor& x) { return sigmoid(x); }, 1.0, 0.0);
    check_nan_and_inf([](const Tensor& x) { return softcap(x, 2.0); }, 2.0, -2.0);
    check_nan_and_inf([](const Tensor& x) { return exp(x); }, INFINITY, 0.0);
}

TEST_CASE("binary gradients with broadcasting and non-contiguous inputs") {
    Tensor a = leaf({4, 3}, 4), row = leaf({3}, 5), col = leaf({4, 1}, 6), at = leaf({3, 4}, 7);
    Tensor den = leaf({3}, 8);
    {
        NoGradGuard g;
        copy_into(den, abs(den) + 0.5);
    }
    CHECK_GRADCHECK([&] { return a + row; }, {a, row});
    CHECK_GRADCHECK([&] { return col - a; }, {col, a});
    CHECK_GRADCHECK([&] { return a * row * col; }, {a, row, col});
    CHECK_GRADCHECK([&] { return a / den; }, {a, den});
    CHECK_GRADCHECK([&] { return at.t() * a + at.t() / den; }, {at, a, den});
    CHECK_GRADCHECK([&] { return a.narrow(0, 1, 2) * col.narrow(0, 0, 2); }, {a, col});
}

TEST_CASE("elementwise bad inputs name the op and the shapes") {
    Tensor a = zeros({2, 3}), b = zeros({4}), d = zeros({2, 3}, kF64);
    CHECK(test::throws_with([&] { add(a, b); }, {"add", "[2, 3]", "[4]"}));
    CHECK(test::throws_with([&] { mul(a, d); }, {"mul", "float32", "float64"}));
    CHECK(test::throws_with([&] { softcap(a, 0); }, {"softcap", "> 0"}));
    // int32 (token ids) is not a dtype these ops compute in: the message names op, dtype, shape.
    const Tensor ids = from_ids({1, 2, 3}, {1, 3});
    CHECK(test::throws_with([&] { exp(ids); },
                            {"exp", "int32", "[1, 3]", "float32 or float64", ".to(kF32)"}));
    CHECK(test::throws_with([&] { ids * 2.0; }, {"mul", "int32 of shape [1, 3]"}));
    CHECK(test::throws_with([&] { -ids; }, {"neg", "int32 of shape [1, 3]"}));
    CHECK(test::throws_with([&] { add(ids, ids); },
                            {"add", "int32 [1, 3] and int32 [1, 3]", "float32 or float64"}));
}

// The float32 fast paths (ops/elementwise_math.h) against the float64 std:: reference (v1):
// tanh_fast over its two branches, and gelu and its slope, written through exp(−2u).
TEST_CASE("math::tanh_fast (float) is within 3 ulp of tanh, and keeps ±1, 0 and NaN") {
    double worst = 0;
    auto probe = [&](float x) {
        const double want = std::tanh(double(x));
        if (want != 0)
            worst = std::max(worst, std::abs(math::tanh_fast(x) - want) / std::abs(want));
    };
    for (float x = -12.0f; x < 12.0f; x += 0.000731f) probe(x);
    for (float x = -1e-3f; x < 1e-3f; x += 3.1e-7f) probe(x);  // the odd polynomial near 0
    CHECK(worst < 3 * 5.96e-8);
    CHECK(math::tanh_fast(0.0f) == 0.0f);
    CHECK(math::tanh_fast(100.0f) == 1.0f);
    CHECK(math::tanh_fast(-std::numeric_limits<float>::infinity()) == -1.0f);
    CHECK(std::isnan(math::tanh_fast(std::numeric_limits<float>::quiet_NaN())));
    CHECK(math::tanh_fast(0.3) == std::tanh(0.3));  // double: std::tanh itself
}

TEST_CASE("float32 gelu, silu, tanh and softcap agree with float64, forward and backward") {
    Tensor x64 = leaf({64, 257}, 9, 4.0);  // |x| up to ~16: both tanh branches, gelu's tails
    Tensor x32 = x64.detach().to(kF32);
    x32.requires_grad_();
    Tensor dy = randn({64, 257}, kF64);
    using Op = Tensor (*)(const Tensor&);
    const Op ops[] = {
        [](const Tensor& t) { return gelu(t); }, [](const Tensor& t) { return silu(t); },
        [](const Tensor& t) { return tanh(t); }, [](const Tensor& t) { return softcap(t, 3.0); }};
    for (Op op : ops) {
        x64.zero_grad(), x32.zero_grad();
        Tensor y64 = op(x64), y32 = op(x32);
        y64.backward(dy);
        y32.backward(dy.to(kF32));
        // Values up to ~16 in float32 (ulp 2e-6 there; measured 7.5e-7), slopes up to ~1.1
        // times dy of a few units (measured 6.2e-7).
        CHECK(test::max_abs_diff(y32, y64) < 2e-6);
        CHECK(test::max_abs_diff(x32.grad(), x64.grad()) < 1.5e-6);
    }
    // Far tails: gelu(x) -> 0 and its slope -> 0 below, gelu(x) = x and slope 1 above; no NaN.
    Tensor tails = from_vector({-1000, -50, -10.5, 10.5, 50, 1000}, {6}, kF32);
    tails.requires_grad_();
    Tensor g = gelu(tails);
    g.backward(ones({6}));
    for (double v : g.to_vector<double>()) CHECK(std::isfinite(v));
    CHECK(g.to_vector<double>()[5] == 1000);
    CHECK(tails.grad().to_vector<double>()[0] == doctest::Approx(0).epsilon(1e-20));
    CHECK(tails.grad().to_vector<double>()[4] == 1);
    // NaN stays NaN both ways (gelu's exp clamps its exponent, so NaN must come through x), and
    // gelu(+inf) = +inf.
    check_nan_and_inf([](const Tensor& x) { return gelu(x); });
}

TEST_CASE("silu's far tails are finite, and NaN stays NaN") {
    // silu(x) -> 0 below (slope -> 0), = x above (slope 1); e = exp(−x) is capped, never inf.
    Tensor tails = from_vector({-1000, -100, -20, 20, 100, 1000}, {6}, kF32);
    tails.requires_grad_();
    Tensor y = silu(tails);
    y.backward(ones({6}));
    const auto values = y.to_vector<double>(), slopes = tails.grad().to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) {
        CHECK(std::isfinite(values[i]));
        CHECK(std::isfinite(slopes[i]));
    }
    CHECK(values[0] == doctest::Approx(0).epsilon(1e-20));
    CHECK(values[5] == 1000);
    CHECK(slopes[0] == doctest::Approx(0).epsilon(1e-20));
    CHECK(slopes[5] == 1);
    // The slope dips below 0 for negative x (its minimum, −0.09984 at x = −2.3994) and overshoots
    // 1 above (1.09984 at x = 2.3994): checked against the closed form in float64.
    Tensor at = from_vector({-2.399357280515467, 2.399357280515467}, {2}, kF64);
    at.requires_grad_();
    silu(at).backward(ones({2}, kF64));
    CHECK(at.grad().to_vector<double>()[0] == doctest::Approx(-0.0998393).epsilon(1e-5));
    CHECK(at.grad().to_vector<double>()[1] == doctest::Approx(1.0998393).epsilon(1e-5));
    check_nan_and_inf(silu);
}

TEST_CASE("binary ops and copies give the same bits on 1 and 2 threads") {
    // Above the threading threshold (2^17 elements): each thread takes a slice of the outer dim.
    Tensor a = randn({700, 300}), row = randn({300}), at = randn({300, 700}).t();
    auto run = [&](int threads) {
        const int saved = num_threads();
        set_num_threads(threads);
        std::vector<float> out = (a + row).to_vector<float>();                // a broadcast operand
        for (float v : (a * at).to_vector<float>()) out.push_back(v);         // a transposed one
        for (float v : at.contiguous().to_vector<float>()) out.push_back(v);  // a strided copy
        Tensor acc = a.clone();
        add_(acc, at);  // the engine's in-place accumulation
        for (float v : acc.to_vector<float>()) out.push_back(v);
        set_num_threads(saved);
        return out;
    };
    const std::vector<float> one = run(1), two = run(2);
    CHECK(one == two);
    CHECK(two[699 * 300 + 299] == float(a.at({699, 299})) + float(row.at({299})));  // last row
}

TEST_CASE("add_ accumulates into any view that does not repeat elements") {
    Tensor acc = zeros({2, 6}, kF64);
    Tensor slice = acc.narrow(1, 2, 3);              // a strided view into acc
    add_(slice, from_vector({1, 2, 3}, {3}, kF64));  // broadcast over the rows
    Tensor t = acc.t();
    add_(t, ones({6, 2}, kF64));  // a transposed destination
    CHECK(acc.to_vector<double>() == std::vector<double>{1, 1, 2, 3, 4, 1, 1, 1, 2, 3, 4, 1});
    Tensor expanded = zeros({1, 3}).expand({2, 3});
    CHECK(test::throws_with([&] { add_(expanded, ones({2, 3})); }, {"add_", "[2, 3]", "stride 0"}));
    Tensor small = zeros({3});
    CHECK(test::throws_with([&] { add_(small, ones({2, 3})); }, {"add_", "[2, 3]", "[3]"}));
}

TEST_CASE("glu: the fused gated product is act(gate) * up, bit for bit, forward and backward") {
    Generator gen(31);
    for (auto [activation, act] :
         {std::pair{GluActivation::silu,
                    std::function<Tensor(const Tensor&)>([](const Tensor& t) { return silu(t); })},
          std::pair{GluActivation::gelu, std::function<Tensor(const Tensor&)>(
                                             [](const Tensor& t) { return gelu(t); })}}) {
        CAPTURE(int(activation));
        // Gates from -12 to 12 (the activations' tails), a probe r: sum(y * r) is the loss.
        const Tensor g0 = randn({3, 7, 20}, kF32, gen) * 4.0, u0 = randn({3, 7, 20}, kF32, gen),
                     r = randn({3, 7, 20}, kF32, gen);
        Tensor g1 = g0.detach().requires_grad_(), u1 = u0.detach().requires_grad_();
        Tensor g2 = g0.detach().requires_grad_(), u2 = u0.detach().requires_grad_();
        const Tensor fused = glu(g1, u1, activation), composed = act(g2) * u2;
        sum(fused * r).backward();
        sum(composed * r).backward();
        CHECK(fused.to_vector<float>() == composed.to_vector<float>());
        CHECK(g1.grad().to_vector<float>() == g2.grad().to_vector<float>());
        CHECK(u1.grad().to_vector<float>() == u2.grad().to_vector<float>());
        // float64 gradients against finite differences (a random probe inside), a strided gate.
        Tensor g = (randn({4, 6}, kF64, gen) * 3.0).detach().requires_grad_();
        Tensor u = randn({6, 4}, kF64, gen).detach().requires_grad_();
        CHECK_GRADCHECK([&] { return glu(g, u.t(), activation); }, {g, u});
    }
    const Tensor a = zeros({2, 3}), b = zeros({3, 2});
    CHECK(test::throws_with([&] { glu(a, b, GluActivation::silu); },
                            {"swiglu", "[2, 3]", "[3, 2]", "same shape"}));
    CHECK(test::throws_with([&] { glu(a, a.to(kF64), GluActivation::gelu); },
                            {"geglu", "float32", "float64", "dtype"}));
    CHECK(test::throws_with([&] { glu(a.to(kBF16), a.to(kBF16), GluActivation::silu); },
                            {"swiglu", "float32 or float64", "bfloat16"}));
}
