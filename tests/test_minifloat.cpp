// float16, FP8 E4M3 and E5M2 (core/minifloat.h, core/float16.h): every code and every tie between
// neighbouring codes against an independent brute-force reference (the nearest of all decoded
// values, ties to the even code), the same against PyTorch's and NumPy's conversions
// (tests/data/minifloat, made by tools/make_minifloat_fixtures.py), overflow (Inf or
// saturation), NaN, subnormals, double -> float16 without double rounding; float16 tensors (casts,
// factories, printing) and F16 safetensors.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/half_convert.h"
#include "core/minifloat.h"
#include "core/safetensors.h"
#include "helpers.h"

using namespace qk;

namespace {

float float_of(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

struct Spec {
    MiniFormat format;
    const char* name;
    int exponent_bits, mantissa_bits;
    bool has_inf;
};
const Spec kSpecs[] = {{MiniFormat::float16, "float16", 5, 10, true},
                       {MiniFormat::e4m3, "e4m3", 4, 3, false},
                       {MiniFormat::e5m2, "e5m2", 5, 2, true}};

// A code's value from the textbook formula with std::ldexp (not the bit assembly the library
// uses); NaN for the NaN codes, ±Inf for the Inf codes.
double reference_value(const Spec& s, uint32_t code) {
    const int width = s.exponent_bits + s.mantissa_bits, bias = (1 << (s.exponent_bits - 1)) - 1;
    const uint32_t e = (code >> s.mantissa_bits) & ((1u << s.exponent_bits) - 1);
    const uint32_t m = code & ((1u << s.mantissa_bits) - 1);
    const double sign = (code >> width) & 1 ? -1.0 : 1.0;
    const uint32_t top = (1u << s.exponent_bits) - 1;
    if (s.has_inf && e == top) return m ? NAN : sign * INFINITY;
    if (!s.has_inf && e == top && m == (1u << s.mantissa_bits) - 1) return NAN;
    const double frac = static_cast<double>(m) / (1 << s.mantissa_bits);
    return sign * (e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1 + frac, int(e) - bias));
}

// The positive finite codes in value order, with their values.
std::vector<std::pair<double, uint32_t>> positive_finite(const Spec& s) {
    std::vector<std::pair<double, uint32_t>> out;
    const uint32_t n = 1u << (s.exponent_bits + s.mantissa_bits);
    for (uint32_t c = 0; c < n; ++c)
        if (const double v = reference_value(s, c); std::isfinite(v)) out.push_back({v, c});
    std::sort(out.begin(), out.end());
    return out;
}

// The brute-force rounding: the code of the nearest value among all of them, the even code on a
// tie; beyond the largest finite value: Inf from half a step past it (IEEE), or that value
// itself (saturation).
uint32_t reference_round(const Spec& s, double x, Overflow overflow,
                         const std::vector<std::pair<double, uint32_t>>& values) {
    const uint32_t sign = std::signbit(x) ? 1u << (s.exponent_bits + s.mantissa_bits) : 0;
    const double a = std::fabs(x);
    const auto& top = values.back();
    const double step = top.first - values[values.size() - 2].first;
    const bool to_inf = s.has_inf && overflow == Overflow::to_inf;
    if (a >= top.first + step / 2 || std::isinf(a))
        return sign | (to_inf ? ((1u << s.exponent_bits) - 1) << s.mantissa_bits : top.second);
    auto hi = std::lower_bound(values.begin(), values.end(), std::make_pair(a, 0u));
    if (hi == values.end()) return sign | top.second;  // (max, max + step/2): rounds down to max
    if (hi->first == a || hi == values.begin()) return sign | hi->second;
    auto lo = hi - 1;
    const double below = a - lo->first, above = hi->first - a;
    if (below != above) return sign | (below < above ? lo->second : hi->second);
    return sign | ((lo->second & 1) ? hi->second : lo->second);
}

bool is_nan_code(const Spec& s, uint32_t code) { return std::isnan(reference_value(s, code)); }

nlohmann::json fixture(const std::string& name) {
    const char* dir = std::getenv("MINIFLOAT_FIXTURES");
    REQUIRE(dir);
    std::ifstream in(std::string(dir) + "/" + name + ".json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("every code decodes to its textbook value") {
    for (const Spec& s : kSpecs) {
        CAPTURE(s.name);
        const uint32_t n = 2u << (s.exponent_bits + s.mantissa_bits);
        int64_t wrong = 0;
        for (uint32_t c = 0; c < n; ++c) {
            const double want = reference_value(s, c), got = minifloat::decode(c, s.format);
            wrong += std::isnan(want) ? !std::isnan(got) : got != want;
        }
        CHECK(wrong == 0);
    }
    CHECK(max_finite(MiniFormat::float16) == reference_value(kSpecs[0], 0x7BFF));
    CHECK(max_finite(MiniFormat::e4m3) == 448.0);
    CHECK(max_finite(MiniFormat::e5m2) == 57344.0);
}

TEST_CASE("rounding equals the brute-force nearest value at every code, tie and neighbour") {
    for (const Spec& s : kSpecs) {
        const auto values = positive_finite(s);
        for (Overflow overflow : {Overflow::to_inf, Overflow::saturate}) {
            CAPTURE(s.name);
            CAPTURE(overflow == Overflow::to_inf);
            int64_t checked = 0, wrong = 0;
            auto check = [&](float x) {
                for (float v : {x, -x}) {
                    ++checked;
                    const uint32_t want = reference_round(s, v, overflow, values);
                    wrong += minifloat::round_float(v, s.format, overflow) != want;
                    wrong += minifloat::round_double(v, s.format, overflow) != want;
                }
            };
            for (size_t i = 0; i + 1 < values.size(); ++i) {
                const float lo = static_cast<float>(values[i].first);
                const float mid = static_cast<float>((values[i].first + values[i + 1].first) / 2);
                REQUIRE(double(mid) == (values[i].first + values[i + 1].first) / 2);  // exact tie
                for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)})
                    check(x);
            }
            const double top = values.back().first, step = top - values[values.size() - 2].first;
            for (double x : {top, top + step / 2, top + step / 4, top + step, 1e30, 3e38})
                check(static_cast<float>(x));
            check(INFINITY);
            for (float tiny : {1e-30f, 0x1p-126f, 0x1p-149f, 0.0f}) check(tiny);
            CHECK(checked > 2 * static_cast<int64_t>(values.size()));
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("NaN stays NaN, with its sign; E4M3 saturates, float16 and E5M2 reach Inf") {
    for (const Spec& s : kSpecs) {
        for (float nan : {NAN, -NAN}) {
            const uint32_t code = minifloat::round_float(nan, s.format, Overflow::to_inf);
            CHECK(is_nan_code(s, code));
            CHECK(std::signbit(minifloat::decode(code, s.format)) == std::signbit(nan));
        }
    }
    CHECK(round_to_format(1e6f, MiniFormat::e4m3, Overflow::to_inf) == 448.0f);  // no Inf: saturate
    CHECK(round_to_format(-INFINITY, MiniFormat::e4m3, Overflow::to_inf) == -448.0f);
    CHECK(std::isinf(round_to_format(61440.0f, MiniFormat::e5m2, Overflow::to_inf)));
    CHECK(round_to_format(61439.0f, MiniFormat::e5m2, Overflow::to_inf) == 57344.0f);
    CHECK(round_to_format(1e6f, MiniFormat::e5m2, Overflow::saturate) == 57344.0f);
    CHECK(std::isinf(round_to_f16(65520.0f)));
    CHECK(round_to_f16(65519.99f) == 65504.0f);
    CHECK(round_to_f16(0x1p-25f) == 0.0f);             // half the smallest subnormal: tie to 0
    CHECK(round_to_f16(0x1.000002p-25f) == 0x1p-24f);  // just above: up to the subnormal
    CHECK(round_to_format(0x1p-10f, MiniFormat::e4m3, Overflow::saturate) == 0.0f);      // tie to 0
    CHECK(round_to_format(0x1.8p-9f, MiniFormat::e4m3, Overflow::saturate) == 0x1p-8f);  // tie up
}

TEST_CASE("the conversions equal PyTorch's (FP8) and NumPy's (float16) on the fixtures") {
    for (const Spec& s : kSpecs) {
        const nlohmann::json f = fixture(s.name);
        CAPTURE(f["source"].get<std::string>());
        int64_t wrong = 0;
        for (const auto& entry : f["values"]) {
            const uint32_t code = entry[0].get<uint32_t>();
            const double got = minifloat::decode(code, s.format);
            if (entry[1].is_string()) {
                const std::string v = entry[1];
                wrong += v == "nan" ? !std::isnan(got) : got != (v == "inf" ? 1 : -1) * INFINITY;
            } else {
                wrong += got != entry[1].get<double>();
            }
        }
        CHECK(wrong == 0);
        // torch's E4M3 conversion saturates like ours; float16 and E5M2 go to Inf like ours.
        const Overflow overflow = Overflow::to_inf;
        for (const auto& entry : f["rounds"]) {
            const float x = float_of(entry[0].get<uint32_t>());
            const uint32_t want = entry[1].get<uint32_t>();
            const uint32_t got = minifloat::round_float(x, s.format, overflow);
            if (std::isnan(x))
                wrong +=
                    !is_nan_code(s, got);  // the NaN codes differ (E5M2: torch 0x7F, ours 0x7E)
            else
                wrong += got != want;
        }
        CHECK(f["rounds"].size() > 1000);
        CHECK(wrong == 0);
    }
}

TEST_CASE("double -> float16 rounds once: a hair above a tie goes up, a hair below goes down") {
    for (double lo : {1.0, 1000.0, 0x1p-20, 65504.0 - 32}) {  // a normal, a big, a subnormal one
        const uint16_t code = f16(lo).bits;
        const double hi = f16::from_bits(static_cast<uint16_t>(code + 1)).to_double();
        const double mid = (lo + hi) / 2, hair = (hi - lo) * 0x1p-30;  // below float's precision
        CHECK(f16(mid + hair).bits == code + 1);
        CHECK(f16(mid - hair).bits == code);
        CHECK(f16(mid).bits == ((code & 1) ? code + 1 : code));
        // Through float the hair is lost and the tie decides: the case a second rounding gets
        // wrong.
        CHECK(static_cast<double>(static_cast<float>(mid + hair)) == mid);
    }
}

TEST_CASE("float16 tensors: casts from every dtype, factories, element access, printing") {
    Generator gen(11);
    Tensor x = randn({4, 9}, kF32, gen) * 3000.0;
    x.set({0, 0}, NAN);
    x.set({0, 1}, 70000.0);  // beyond float16: Inf
    x.set({0, 2}, 1e-6);     // a float16 subnormal
    Tensor h = x.to(kF16);
    CHECK(h.dtype() == kF16);
    CHECK(h.storage()->nbytes() == 36 * 2);
    const auto xs = x.to_vector<float>(), back = h.to(kF32).to_vector<float>();
    int64_t wrong = 0;
    for (size_t i = 0; i < xs.size(); ++i)
        wrong += std::isnan(xs[i]) ? !std::isnan(back[i]) : back[i] != round_to_f16(xs[i]);
    CHECK(wrong == 0);
    CHECK(std::isinf(h.at({0, 1})));
    CHECK(h.at({0, 2}) == static_cast<double>(round_to_f16(1e-6f)));
    CHECK(h.at({0, 2}) != 0.0);
    // A strided view, float64, bfloat16 and int32 sources; bf16 -> f16 rounds once from bf16's
    // exact value.
    CHECK(x.t().to(kF16).at({5, 2}) == h.at({2, 5}));
    CHECK(from_vector({1.0 + 0x1p-11 + 0x1p-40}, {1}, kF64).to(kF16).to_vector<f16>()[0].bits ==
          0x3C01);
    CHECK(full({1}, 1000.3, kBF16).to(kF16).at({0}) == 1000.0);
    CHECK(full({1}, 3.0, kF16).to(kBF16).at({0}) == 3.0);
    Tensor integer = zeros({1}, kI32);
    integer.set({0}, 2049);
    CHECK(integer.to(kF16).at({0}) == 2048.0);  // a tie between 2048 and 2050: to the even code
    CHECK(full({2, 2}, 0.1, kF16).at({1, 1}) == static_cast<double>(round_to_f16(0.1f)));
    CHECK(zeros({3}, kF16).at({2}) == 0.0);
    CHECK(to_string(full({2}, 0.5, kF16)).find("dtype=float16") != std::string::npos);
    CHECK(dtype_size(kF16) == 2);
    CHECK(test::throws_with([&] { (void)exp(ones({2}, kF16)); }, {"float16", "to(kF32)"}));
}

TEST_CASE("the vectorised casts (F16C where the CPU has it) round like the scalar rule") {
    MESSAGE(std::string(cpu::has_f16c() ? "F16C: vcvtps2ph / vcvtph2ps" : "no F16C: scalar"));
    const Spec& s = kSpecs[0];
    std::vector<float> xs;
    const auto values = positive_finite(s);
    for (size_t i = 0; i + 1 < values.size(); ++i) {
        const float lo = static_cast<float>(values[i].first);
        const float mid = static_cast<float>((values[i].first + values[i + 1].first) / 2);
        for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)})
            xs.insert(xs.end(), {x, -x});
    }
    xs.insert(xs.end(), {65519.0f, 65520.0f, 1e30f, INFINITY, -INFINITY, 0x1p-126f, -0.0f});
    const int64_t n = static_cast<int64_t>(xs.size());
    const auto rounded = from_vector(std::vector<double>(xs.begin(), xs.end()), {n}, kF64)
                             .to(kF32)
                             .to(kF16)
                             .to_vector<f16>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += rounded[i].bits != f16(xs[i]).bits;
    CHECK(wrong == 0);
    // Back to float: every one of the 65,536 codes, through the tensor cast.
    Tensor codes = Tensor::empty({65536}, kF16);
    for (int c = 0; c < 65536; ++c) codes.data<f16>()[c] = f16::from_bits(static_cast<uint16_t>(c));
    const auto widened = codes.to(kF32).to_vector<float>();
    wrong = 0;
    for (int c = 0; c < 65536; ++c) {
        const float want = float16_to_float(static_cast<uint16_t>(c));
        wrong += std::isnan(want) ? !std::isnan(widened[c]) : bits_of(widened[c]) != bits_of(want);
    }
    CHECK(wrong == 0);
}

TEST_CASE("F16 safetensors: read and written as float16, every bit kept") {
    test::TempDir dir("f16");
    const std::string path = dir / "h.safetensors";
    Tensor h = (randn({17, 5}, kF32) * 100.0).to(kF16);
    save_safetensors(path, {{"h", h}});
    std::ifstream in(path, std::ios::binary);
    const std::string written((std::istreambuf_iterator<char>(in)), {});
    CHECK(written.find(R"("dtype":"F16")") != std::string::npos);
    const Tensor loaded = load_safetensors(path).get("h");
    REQUIRE(loaded.dtype() == kF16);
    const auto a = h.to_vector<f16>(), b = loaded.to_vector<f16>();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = a[i].bits == b[i].bits;
    CHECK(same);
}
