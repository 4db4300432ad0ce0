// bfloat16: the rounding against an independent reference (the two bf16 neighbours of a value,
// compared in long double), ties, NaN, Inf and subnormals; tensors of bf16 (casts, views,
// factories, printing; the cuda copy is in test_cuda_core.cpp), and bf16 safetensors read and
// written as the format says.
#include <cfloat>
#include <cstring>
#include <random>

#include "core/safetensors.h"
#include "helpers.h"

using namespace qk;

namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }
float bf16_value(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

// The bf16 nearest to x, ties to the even one, found by comparing x with its two bf16
// neighbours (lo: x truncated towards zero; hi: one step further out), in long double, where
// the differences are exact. x: finite, not NaN. Returns bits.
uint16_t nearest_bf16(long double x, uint16_t lo) {
    const uint16_t hi = static_cast<uint16_t>(lo + 1);  // one step further from zero
    const long double below = std::fabs(x - static_cast<long double>(bf16_value(lo)));
    // hi may be Inf (lo the largest finite): then the overflow threshold is where the next
    // step of the last binade would be, 2^128 · (1 − 2^-9) for the half-way point.
    const long double hi_value = (hi & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0L, 128), x)
                                                         : static_cast<long double>(bf16_value(hi));
    const long double above = std::fabs(hi_value - x);
    if (below < above) return lo;
    if (above < below) return hi;
    return (lo & 1) ? hi : lo;
}

uint16_t reference_from_float(float f) {
    return nearest_bf16(f, static_cast<uint16_t>(bits_of(f) >> 16));
}

// Truncation found by a binary search over the positive patterns (ordered like their values),
// with no float arithmetic that flush-to-zero could change.
uint16_t reference_from_double(double d) {
    const long double magnitude = std::fabs(static_cast<long double>(d));
    uint16_t below = 0, above = 0x7F80;  // bf16_value(below) <= |d| < bf16_value(above)
    if (magnitude >= bf16_value(0x7F7F)) below = 0x7F7F;
    while (above - below > 1 && below != 0x7F7F) {
        const uint16_t mid = static_cast<uint16_t>((below + above) / 2);
        (static_cast<long double>(bf16_value(mid)) <= magnitude ? below : above) = mid;
    }
    const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
    return nearest_bf16(d, static_cast<uint16_t>(sign | below));
}

}  // namespace

TEST_CASE("float -> bf16 rounds to nearest even, on 2 million random floats and the edges") {
    std::mt19937 gen(7);
    std::uniform_int_distribution<uint32_t> any;
    int checked = 0;
    for (int i = 0; i < 2'000'000; ++i) {
        const uint32_t u = any(gen);
        const float f = float_of(u);
        if (std::isnan(f) || std::isinf(f)) continue;
        const uint16_t want = reference_from_float(f);
        if (bf16(f).bits != want) {
            FAIL_CHECK(fmt::format("float bits {:#010x}: got {:#06x}, want {:#06x}", u,
                                   bf16(f).bits, want));
            break;
        }
        ++checked;
    }
    CHECK(checked > 1'990'000);
    // Ties go to the even neighbour, up or down.
    CHECK(bf16(float_of(0x3F808000)).bits == 0x3F80);  // 1 + 2^-8: half-way, 1 is even
    CHECK(bf16(float_of(0x3F818000)).bits == 0x3F82);  // half-way above the odd 0x3F81
    CHECK(bf16(float_of(0x3F808001)).bits == 0x3F81);  // just above half-way
    CHECK(bf16(-1.0f + -0x1p-8f).bits == 0xBF80);      // signs round by magnitude
    // Overflow: the largest floats round to Inf, the largest bf16 stays.
    CHECK(bf16(FLT_MAX).bits == 0x7F80);
    CHECK(bf16(-FLT_MAX).bits == 0xFF80);
    CHECK(bf16(float_of(0x7F7F7FFF)).bits == 0x7F7F);
    CHECK(bf16(float_of(0x7F7F8000)).bits == 0x7F80);  // tie above the odd 0x7F7F: to Inf
    // Subnormals round like any other value; zero keeps its sign.
    CHECK(bf16(float_of(0x00000001)).bits == 0x0000);
    CHECK(bf16(float_of(0x00008000)).bits == 0x0000);  // tie, even is zero
    CHECK(bf16(float_of(0x00018000)).bits == 0x0002);
    CHECK(bf16(float_of(0x007FFFFF)).bits == 0x0080);  // largest subnormal: up to FLT_MIN
    CHECK(bf16(-0.0f).bits == 0x8000);
    CHECK(bf16(0.0f).bits == 0x0000);
}

TEST_CASE("NaN stays NaN (never the Inf that the rounding carry would make); Inf stays Inf") {
    for (uint32_t u : {0x7F800001u, 0x7F80FFFFu, 0x7FC00000u, 0xFF800001u, 0x7FFFFFFFu}) {
        CAPTURE(u);
        const bf16 b(float_of(u));
        CHECK(std::isnan(b.to_float()));
        CHECK((b.bits & 0x8000) == (u >> 16 & 0x8000));  // the sign is kept
        CHECK(std::isnan(bf16(static_cast<double>(float_of(u))).to_float()));
    }
    CHECK(bf16(INFINITY).bits == 0x7F80);
    CHECK(bf16(-INFINITY).bits == 0xFF80);
    CHECK(bf16(static_cast<double>(INFINITY)).bits == 0x7F80);
}

TEST_CASE("bf16 -> float and -> double are exact: every one of the 65536 patterns round-trips") {
    enable_flush_to_zero();  // the double conversion must keep subnormals all the same
    for (uint32_t b = 0; b < 65536; ++b) {
        const bf16 h = bf16::from_bits(static_cast<uint16_t>(b));
        const float f = h.to_float();
        if (std::isnan(f)) {
            CHECK(std::isnan(bf16(f).to_float()));
            continue;
        }
        // The value from the fields, in double arithmetic on normal numbers only.
        const int exponent = static_cast<int>(b >> 7 & 0xFF), mantissa = static_cast<int>(b & 0x7F);
        const double magnitude = exponent == 0xFF ? INFINITY
                                 : exponent == 0  ? std::ldexp(mantissa, -133)
                                                  : std::ldexp(128 + mantissa, exponent - 134);
        const double value = (b & 0x8000) ? -magnitude : magnitude;
        if (bf16(f).bits != b || bf16(h.to_double()).bits != b || h.to_double() != value) {
            FAIL_CHECK(fmt::format("pattern {:#06x} did not round-trip", b));
            break;
        }
    }
}

TEST_CASE("double -> bf16 rounds once, subnormals included, under flush-to-zero too") {
    // A plain (float) cast first rounds 1 + 2^-8 + 2^-30 to the tie 1 + 2^-8, then to 1.
    CHECK(bf16(1.0 + 0x1p-8 + 0x1p-30).bits == 0x3F81);
    CHECK(bf16(1.0 + 0x1p-8 - 0x1p-30).bits == 0x3F80);
    CHECK(bf16(1.0 + 0x1p-8).bits == 0x3F80);  // an exact tie still goes to even
    CHECK(bf16(-(1.0 + 0x1p-8 + 0x1p-40)).bits == 0xBF81);
    enable_flush_to_zero();  // as on every thread of the library: it must not change the result
    CHECK(bf16(0x1p-130).bits == 0x0008);
    CHECK(bf16(-0x1.8p-133).bits == 0x8002);  // a subnormal tie, up to the even 2
    CHECK(bf16(0x1p-134).bits == 0x0000);     // half the smallest subnormal: a tie, to 0
    CHECK(bf16(0x1.000001p-134).bits == 0x0001);
    CHECK(bf16(0x1.ffp-127).bits == 0x0080);  // the largest subnormal's neighbour: FLT_MIN
    CHECK(bf16(1e300).bits == 0x7F80);
    CHECK(bf16(1e-300).bits == 0x0000);
    CHECK(bf16(-1e-300).bits == 0x8000);
    std::mt19937_64 gen(11);
    std::uniform_real_distribution<double> mantissa(1.0, 2.0);
    std::uniform_int_distribution<int> exponent(-140, 127);
    for (int i = 0; i < 500'000; ++i) {
        const double d = std::ldexp(mantissa(gen), exponent(gen)) * (i % 2 ? -1 : 1);
        const uint16_t want = reference_from_double(d);
        if (bf16(d).bits != want) {
            FAIL_CHECK(
                fmt::format("double {:a}: got {:#06x}, want {:#06x}", d, bf16(d).bits, want));
            break;
        }
    }
    // Values a few float ulps from a tie, where a double rounding goes wrong most often.
    for (int k = -3; k <= 3; ++k) {
        const double tie = 1.0 + 0x1p-8;
        const double d = tie + k * 0x1p-40;
        CHECK(bf16(d).bits == reference_from_double(d));
    }
}

TEST_CASE("bf16 tensors: casts both ways, strided views, factories, element access, printing") {
    Generator gen(3);
    Tensor x = randn({5, 7}, kF32, gen);
    x.set({0, 0}, NAN);
    x.set({0, 1}, INFINITY);
    x.set({0, 2}, 1.0 + 0x1p-8);
    Tensor h = x.to(kBF16);
    CHECK(h.dtype() == kBF16);
    CHECK(h.storage()->nbytes() == 35 * 2);
    Tensor back = h.to(kF32);
    auto xs = x.to_vector<float>(), bs = back.to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
        if (std::isnan(xs[i])) {
            CHECK(std::isnan(bs[i]));
            continue;
        }
        CHECK(bits_of(bs[i]) == static_cast<uint32_t>(reference_from_float(xs[i])) << 16);
    }
    CHECK(h.at({0, 2}) == 1.0);
    // A transposed (strided) view casts element by element.
    Tensor ht = x.t().to(kBF16);
    CHECK(ht.shape() == Shape{7, 5});
    CHECK(ht.at({3, 4}) == h.at({4, 3}));
    auto contiguous_bits = h.t().contiguous().to_vector<bf16>();
    auto cast_bits = x.t().contiguous().to(kBF16).to_vector<bf16>();
    bool same = contiguous_bits.size() == cast_bits.size();
    for (size_t i = 0; same && i < cast_bits.size(); ++i)
        same = contiguous_bits[i].bits == cast_bits[i].bits;
    CHECK(same);
    // float64 -> bf16 rounds once, through the same rule as the scalar.
    Tensor d = from_vector({1.0 + 0x1p-8 + 0x1p-30, -2.5, 1e-300}, {3}, kF64).to(kBF16);
    CHECK(d.to_vector<bf16>()[0].bits == 0x3F81);
    CHECK(d.at({1}) == -2.5);
    // Factories and element access.
    CHECK(zeros({3}, kBF16).at({2}) == 0);
    CHECK(full({2, 2}, 1000.5, kBF16).at({1, 1}) == 1000);  // 8 bits: 996, 1000, 1004
    Generator g1(5), g2(5);
    CHECK(randn({16}, kBF16, g1).to(kF32).to_vector<float>() ==
          randn({16}, kF32, g2).to(kBF16).to(kF32).to_vector<float>());
    Tensor s = zeros({2}, kBF16);
    s.set({1}, 3.14159);
    CHECK(s.at({1}) == 3.140625);
    CHECK(to_string(full({2}, 0.5, kBF16)).find("dtype=bfloat16") != std::string::npos);
    CHECK(dtype_size(kBF16) == 2);
}

TEST_CASE("ops that compute refuse bf16 with a message that says what to do") {
    Tensor h = ones({4}, kBF16);
    CHECK(test::throws_with([&] { (void)exp(h); }, {"bfloat16", "to(kF32)"}));
    CHECK(test::throws_with([&] { (void)softmax(h.view({2, 2})); }, {"softmax", "bfloat16"}));
    CHECK(test::throws_with([&] { (void)layer_norm(h.view({2, 2}), {}, {}); }, {"bfloat16"}));
}

TEST_CASE("the cast is differentiable: the gradient comes back as float32") {
    Tensor x = randn({6}, kF32).requires_grad_();
    Tensor r = randn({6}, kF32);
    Tensor y = sum(x.to(kBF16).to(kF32) * r);
    y.backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().dtype() == kF32);
    // d/dx of round(x) is taken as 1 (the straight-through rule of every cast): grad = round(r).
    CHECK(x.grad().to_vector<float>() == r.to(kBF16).to(kF32).to_vector<float>());
}

TEST_CASE("bf16 safetensors: the standard format's bytes, read and written") {
    // Written by hand as the format specifies: "BF16", 2 bytes per value, little endian.
    const std::string header = R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";
    std::string bytes;
    for (int i = 0; i < 8; ++i)
        bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
    bytes += header;
    for (uint16_t v : {uint16_t{0x3F80}, uint16_t{0xC020}, uint16_t{0x7F80}})  // 1, -2.5, Inf
        bytes += {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
    SafetensorsFile f = parse_safetensors(bytes, "hand-made");
    const Tensor& w = f.get("w");
    CHECK(w.dtype() == kBF16);
    CHECK(w.at({0}) == 1.0);
    CHECK(w.at({1}) == -2.5);
    CHECK(std::isinf(w.at({2})));
    // Written by us: the same bytes back, and a round trip keeps every bit.
    test::TempDir dir("bf16");
    const std::string path = dir / "w.safetensors";
    save_safetensors(path, {{"w", w}});
    std::ifstream in(path, std::ios::binary);
    const std::string written((std::istreambuf_iterator<char>(in)), {});
    CHECK(written.substr(written.size() - 6) == bytes.substr(bytes.size() - 6));
    CHECK(written.find(R"("dtype":"BF16")") != std::string::npos);
    Tensor big = randn({33, 17}, kF32).to(kBF16);
    save_safetensors(path, {{"big", big}});
    Tensor loaded = load_safetensors(path).get("big");
    REQUIRE(loaded.dtype() == kBF16);
    auto a = big.to_vector<bf16>(), b = loaded.to_vector<bf16>();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = a[i].bits == b[i].bits;
    CHECK(same);
}
