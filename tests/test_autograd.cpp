// The engine: accumulation, diamonds, no_grad, retain_graph, detach, and its error messages.
#include <functional>

#include "helpers.h"

using namespace qk;
using qk::test::max_abs_diff;

TEST_CASE("a tensor used twice gets both gradient contributions") {
    Tensor x = from_vector({3}, {1}, kF64).requires_grad_();
    Tensor y = x * x + x;  // dy/dx = 2x + 1 = 7
    y.backward();
    CHECK(x.grad().item() == 7);
}

TEST_CASE("gradients accumulate across backward calls until zero_grad") {
    Tensor x = from_vector({2}, {1}, kF64).requires_grad_();
    (x * 3.0).backward();
    (x * 3.0).backward();
    CHECK(x.grad().item() == 6);
    x.zero_grad();
    CHECK(!x.grad().defined());
    (x * 3.0).backward();
    CHECK(x.grad().item() == 3);
}

TEST_CASE("diamond graph") {
    // x -> a = exp(x), b = x^2 -> y = a * b: dy/dx = e^x x^2 + 2 x e^x
    Tensor x = from_vector({0.7}, {1}, kF64).requires_grad_();
    Tensor a = exp(x), b = x * x;
    Tensor y = a * b;
    y.backward();
    double v = 0.7;
    CHECK(x.grad().item() ==
          doctest::Approx(std::exp(v) * v * v + 2 * v * std::exp(v)).epsilon(1e-14));
}

TEST_CASE("deep chains do not overflow the stack") {
    Tensor x = from_vector({1}, {1}, kF64).requires_grad_();
    Tensor y = x;
    for (int i = 0; i < 20000; ++i) y = y * 1.0;
    y.backward();
    CHECK(x.grad().item() == 1);
}

TEST_CASE("NoGradGuard records nothing") {
    Tensor x = ones({2}, kF64).requires_grad_();
    Tensor y;
    {
        NoGradGuard guard;
        y = x * 2.0;
        CHECK(!autograd::grad_enabled());
    }
    CHECK(autograd::grad_enabled());
    CHECK(!y.requires_grad());
    CHECK(test::throws_with([&] { sum(y).backward(); }, {"backward", "does not require grad"}));
}

TEST_CASE("retain_graph allows a second backward; without it the error is clear") {
    Tensor x = from_vector({2}, {1}, kF64).requires_grad_();
    Tensor y = exp(x);
    y.backward(/*retain_graph=*/true);
    y.backward();
    CHECK(x.grad().item() == doctest::Approx(2 * std::exp(2.0)));
    CHECK(test::throws_with([&] { y.backward(); }, {"already freed", "retain_graph"}));
}

TEST_CASE("detach cuts the graph") {
    Tensor x = from_vector({2}, {1}, kF64).requires_grad_();
    Tensor y = x * x.detach();  // gradient only through the first factor: dy/dx = x
    y.backward();
    CHECK(x.grad().item() == 2);
    CHECK(!x.detach().requires_grad());
}

TEST_CASE("backward needs a scalar or an explicit gradient") {
    Tensor x = ones({3}, kF64).requires_grad_();
    Tensor y = x * 2.0;
    CHECK(test::throws_with([&] { y.backward(); }, {"backward", "[3]"}));
    y.backward(from_vector({1, 2, 3}, {3}, kF64));
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 4, 6});
}

TEST_CASE("gradcheck itself catches a wrong backward") {
    // A deliberately wrong op: forward x^2, backward claims x (missing the factor 2).
    Tensor x = test::leaf({4}, 3);
    auto wrong_square = [](const Tensor& t) {
        Tensor y = t.detach() * t.detach();
        return autograd::record("wrong_square", y, {t}, [t = t.detach()](const Tensor& dy) {
            return std::vector<Tensor>{dy * t};
        });
    };
    CHECK(!gradcheck([&] { return wrong_square(x); }, {x}).ok);
    CHECK(gradcheck([&] { return x * x; }, {x}).ok);
}

TEST_CASE("a backward returning the wrong shape is reported") {
    Tensor x = ones({3}, kF64).requires_grad_();
    Tensor y = autograd::record("bad_op", x.detach() * 1.0, {x},
                                [](const Tensor&) { return std::vector<Tensor>{ones({2}, kF64)}; });
    CHECK(test::throws_with([&] { sum(y).backward(); }, {"bad_op", "[2]", "[3]"}));
}

TEST_CASE("leaves never share gradient memory, even when one gradient feeds both") {
    // add's backward hands the same dy to both inputs; each leaf must get its own copy.
    Tensor x = ones({3}, kF64).requires_grad_(), z = ones({3}, kF64).requires_grad_();
    sum(x + z).backward();
    CHECK(x.grad().storage() != z.grad().storage());
    sum(x * 2.0 + z).backward();  // accumulation into x must not change z's gradient
    CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 3, 3});
    CHECK(z.grad().to_vector<double>() == std::vector<double>{2, 2, 2});
}

TEST_CASE("narrowed pieces put their gradients in place: tiled, partial, overlapping, mixed") {
    // narrow's backward hands back only its slab; the engine puts slabs into the producer's
    // gradient (copied into a fresh buffer when they tile it, else added onto zeros or onto the
    // full-size contributions of other consumers). Each arrangement against finite differences,
    // narrowing an interior tensor (x * 1.5) and a leaf (x).
    Tensor x = test::leaf({3, 7}, 31);
    auto weighted = [](const Tensor& t, uint64_t seed) {
        return t * test::leaf(t.shape(), seed).detach();
    };
    auto tiled = [&](const Tensor& t) {  // split's pieces, each used once, in a shuffled order
        auto p = split(t, 3, 1);
        return cat({weighted(p[2], 32), weighted(p[0], 33), weighted(p[1], 34)}, 1);
    };
    auto partial = [&](const Tensor& t) { return weighted(t.narrow(1, 2, 3), 35); };
    auto overlapping = [&](const Tensor& t) {
        return cat({weighted(t.narrow(1, 0, 4), 36), weighted(t.narrow(1, 2, 5), 37)}, 1);
    };
    auto mixed = [&](const Tensor& t) {  // slabs along two dims, plus a full-size use
        return sum(weighted(t.narrow(1, 1, 3), 38)) + sum(weighted(t.narrow(0, 1, 2), 39)) +
               sum(t * t);
    };
    auto twice = [&](const Tensor& t) {  // the same piece used by two consumers
        Tensor piece = t.narrow(0, 1, 1);
        return weighted(piece, 40) + weighted(piece, 41);
    };
    const std::vector<std::function<Tensor(const Tensor&)>> arrangements = {
        tiled, partial, overlapping, mixed, twice};
    for (const auto& f : arrangements) {
        CHECK_GRADCHECK([&] { return f(x * 1.5); }, {x});
        CHECK_GRADCHECK([&] { return f(x); }, {x});
    }
    // The tiled case's values are exact: each piece's weight lands in its own columns.
    Tensor r = test::leaf({3, 7}, 42).detach();
    auto pieces = split(x * 2.0, 3, 1), weights = split(r, 3, 1);
    x.zero_grad();
    sum(cat({pieces[1] * weights[1], pieces[0] * weights[0], pieces[2] * weights[2]}, 1))
        .backward();
    CHECK(max_abs_diff(x.grad(), r * 2.0) == 0);
    // narrow's node saves nothing, but a second pass through it is still refused
    CHECK(test::error_message([&] { sum(pieces[1] * 1.0).backward(); }).find("already freed") !=
          std::string::npos);
}

TEST_CASE("grad-ready hooks run once per backward, when the leaf's gradient is complete") {
    // w is used three times (its last use is the first one the reverse walk meets): its hook must
    // see all three contributions. u's only use sits behind an op that returns no gradient, so no
    // gradient flows to it: its hook runs at the end of the pass. v is not in the graph: no call.
    Tensor w = test::leaf({3}, 51), u = test::leaf({3}, 52), v = test::leaf({3}, 53);
    std::vector<std::string> log;
    Tensor w_grad_seen;
    w.on_grad_ready([&] {
        log.push_back("w");
        w_grad_seen = w.grad().clone();
    });
    u.on_grad_ready([&] { log.push_back("u"); });
    v.on_grad_ready([&] { log.push_back("v"); });
    Tensor blocked = autograd::record("blocks_gradient", u.detach() * 1.0, {u * 1.0},
                                      [](const Tensor&) { return std::vector<Tensor>{Tensor()}; });
    Tensor b = exp(w * 2.0) * w;
    sum(b * w + blocked).backward();
    CHECK(log == std::vector<std::string>{"w", "u"});
    CHECK(max_abs_diff(w_grad_seen, w.grad()) == 0);
    CHECK(!u.grad().defined());
    sum(w).backward();  // a root that is the leaf itself
    CHECK(log.back() == "w");
    CHECK(log.size() == 3);
    CHECK(test::error_message([&] { (w * 1.0).on_grad_ready([] {}); }).find("on_grad_ready") !=
          std::string::npos);
}

TEST_CASE("a norm after a residual add adds its gradient into the residual's: the same values") {
    // s feeds a residual path and a norm, as a block's stream feeds ln_2 and the next add. When the
    // norm's backward runs, the engine holds s's gradient from the residual path alone (the Linear
    // between made a fresh one), and hands it to the norm (Node::adds_into_input_gradient), which
    // adds dx into it. A clone between s and the norm takes the plain path: the engine's addition.
    const Tensor a = qk::test::leaf({4, 6}, 701), g = qk::test::leaf({6}, 702),
                 b = qk::test::leaf({6}, 703), w = qk::test::leaf({6, 6}, 704),
                 r = qk::test::leaf({4, 6}, 705).detach();
    for (bool rms : {false, true}) {
        CAPTURE(rms);
        auto gradients = [&](bool junction) {
            Tensor a2 = a.detach().requires_grad_(), g2 = g.detach().requires_grad_();
            const Tensor s = a2 * 2.0;
            const Tensor normed_in = junction ? s : s.clone();
            const Tensor n = rms ? rms_norm(normed_in, g2) : layer_norm(normed_in, g2, b);
            sum((s + linear(n, w)) * r).backward();
            return std::pair{a2.grad(), g2.grad()};
        };
        const auto [da, dg] = gradients(true);
        const auto [da_plain, dg_plain] = gradients(false);
        CHECK(max_abs_diff(da, da_plain) == 0);
        CHECK(max_abs_diff(dg, dg_plain) == 0);
        CHECK_GRADCHECK(
            [&] {
                const Tensor s = a * 2.0;
                return s + linear(rms ? rms_norm(s, g) : layer_norm(s, g, b), w);
            },
            {a, g, w});
    }
}
