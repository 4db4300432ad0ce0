// rope: the forward against the composite x·cos + rotate_half(x)·sin (written with narrow, cat
// and broadcasting) and against v1; the tables against std::cos/std::sin in float64; a float64
// gradcheck with a random probe (contiguous and strided inputs); scores that depend only on
// relative position; norms preserved; bad inputs.
#include "helpers.h"

using namespace qk;
using qk::test::leaf;
using qk::test::max_abs_diff;
using qk::test::throws_with;

namespace {

// The rotate-half formula with other ops: x (..., T, D), tables (T, D/2).
Tensor rope_reference(const Tensor& x, const RopeTables& tables) {
    const int64_t h = x.size(-1) / 2;
    Tensor lo = x.narrow(-1, 0, h), hi = x.narrow(-1, h, h);
    Tensor cos_full = cat({tables.cos, tables.cos}, -1),
           sin_full = cat({tables.sin, tables.sin}, -1);
    Tensor rotated_half = cat({-hi, lo}, -1);
    return x * cos_full + rotated_half * sin_full;
}

}  // namespace

TEST_CASE("rope tables: the angles t·θ^(−2i/D) in float64, rounded once") {
    const RopeTables t64 = rope_tables(9, 8, 10000.0, kF64);
    CHECK(t64.cos.shape() == Shape{9, 4});
    for (int64_t t : {0, 1, 8})
        for (int64_t i : {0, 1, 3}) {
            const double angle = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / 8);
            CHECK(t64.cos.at({t, i}) == std::cos(angle));
            CHECK(t64.sin.at({t, i}) == std::sin(angle));
        }
    const RopeTables t32 = rope_tables(9, 8, 10000.0, kF32);
    CHECK(t32.cos.dtype() == kF32);
    CHECK(max_abs_diff(t32.sin, t64.sin.to(kF32)) == 0);  // one rounding of the float64 value
    CHECK(rope_tables(0, 8, 500.0).cos.numel() == 0);
}

TEST_CASE("rope forward matches the rotate-half composite and the v1 kernel") {
    const RopeTables tables = rope_tables(7, 10, 10000.0, kF64);
    Tensor x = leaf({2, 3, 7, 10}, 1).detach();
    CHECK(max_abs_diff(rope(x, tables.cos, tables.sin), rope_reference(x, tables)) < 1e-15);
    // A strided view (the heads split from (B, T, H, D) by a transpose), as attention passes it.
    Tensor bthd = leaf({2, 7, 3, 10}, 2).detach(), view = bthd.transpose(1, 2);
    CHECK(max_abs_diff(rope(view, tables.cos, tables.sin), rope_reference(view, tables)) < 1e-15);
    // Position 0 is the identity.
    CHECK(max_abs_diff(rope(x, tables.cos, tables.sin).narrow(2, 0, 1), x.narrow(2, 0, 1)) == 0);

    // v2 (vectorised, threaded) against v1, float32, big enough for the thread pool.
    qk::test::ThreadCount two(2);
    const RopeTables t32 = rope_tables(64, 32, 10000.0, kF32);
    Tensor big = randn({4, 6, 64, 32}, kF32);
    Tensor v1 = Tensor::empty(big.shape(), kF32), v2 = Tensor::empty(big.shape(), kF32);
    for (int direction : {+1, -1}) {
        cpu::rope_rotate_v1(v1.data<float>(), big.data<float>(), t32.cos.data<float>(),
                            t32.sin.data<float>(), 24, 64, 32, direction);
        cpu::rope_rotate(v2.data<float>(), big.data<float>(), t32.cos.data<float>(),
                         t32.sin.data<float>(), 24, 64, 32, direction);
        CHECK(max_abs_diff(v1, v2) < 1e-6);  // same formula; only FMA contraction may differ
    }
}

TEST_CASE("rope backward matches finite differences") {
    const RopeTables tables = rope_tables(5, 6, 10000.0, kF64);
    Tensor x = leaf({2, 2, 5, 6}, 3);
    CHECK_GRADCHECK([&] { return rope(x, tables.cos, tables.sin); }, {x});
    Tensor y = leaf({2, 5, 2, 6}, 4);  // through a strided view, and a nonlinear consumer
    CHECK_GRADCHECK([&] { return tanh(rope(y.transpose(1, 2), tables.cos, tables.sin)); }, {y});
    // Large angles (theta small, positions far apart) exercise every quadrant of the rotation.
    const RopeTables wide = rope_tables(5, 6, 2.0, kF64);
    CHECK_GRADCHECK([&] { return rope(x, wide.cos, wide.sin); }, {x});
}

TEST_CASE("rope: q·k depends only on relative position, and norms are kept") {
    const int64_t T = 12, D = 16, shift_max = 40;
    const RopeTables tables = rope_tables(T + shift_max, D, 10000.0, kF64);
    auto at = [&](const Tensor& x, int64_t first) {  // x rotated as if at positions first…first+T−1
        return rope(x, tables.cos.narrow(0, first, T), tables.sin.narrow(0, first, T));
    };
    Tensor q = leaf({2, 3, T, D}, 5).detach(), k = leaf({2, 3, T, D}, 6).detach();
    Tensor scores = matmul(at(q, 0), at(k, 0).transpose(-2, -1));
    for (int64_t shift : {int64_t{1}, int64_t{7}, shift_max}) {
        CAPTURE(shift);
        CHECK(max_abs_diff(matmul(at(q, shift), at(k, shift).transpose(-2, -1)), scores) < 1e-12);
    }
    // The test can fail: shifting q alone changes the scores.
    CHECK(max_abs_diff(matmul(at(q, 3), at(k, 0).transpose(-2, -1)), scores) > 1e-3);
    // A rotation keeps each head vector's length.
    Tensor norms = sqrt(sum(q * q, {-1})), rotated_norms = sqrt(sum(at(q, 5) * at(q, 5), {-1}));
    CHECK(max_abs_diff(norms, rotated_norms) < 1e-13);
}

TEST_CASE("rope: bad inputs name the op, the shapes and what was expected") {
    const RopeTables tables = rope_tables(4, 6, 10000.0);
    CHECK(throws_with([&] { rope(randn({2, 4, 5}), tables.cos, tables.sin); }, {"rope", "D even"}));
    CHECK(throws_with(
        [&] {
            rope(randn({2, 5, 6}), tables.cos, tables.sin);
        },
        {"rope", "[2, 5, 6]", "[5, 3]"}));
    CHECK(throws_with(
        [&] {
            rope(randn({2, 4, 6}, kF64), tables.cos, tables.sin);
        },
        {"rope", "float64", "float32"}));
    CHECK(throws_with(
        [&] {
            rope(zeros({2, 4, 6}, kI32), tables.cos, tables.sin);
        },
        {"rope", "float32 or float64", "int32"}));
    Tensor cos = tables.cos.clone().requires_grad_();
    CHECK(throws_with([&] { rope(randn({2, 4, 6}), cos, tables.sin); }, {"rope", "constants"}));
    CHECK(throws_with([&] { rope_tables(4, 7, 10000.0); }, {"rope_tables", "D = 7"}));
    CHECK(throws_with([&] { rope_tables(4, 8, 1.0); }, {"rope_tables", "theta", "1"}));
    CHECK(throws_with([&] { rope_tables(4, 8, NAN); }, {"rope_tables", "theta"}));
}
