// Mixed-precision GEMMs: the bf16 engines (oneDNN and the float32 fallback) against the naive loop
// in every transpose layout and on the threads; linear with Precision::bf16 forward and backward
// against a float64 reference on the rounded operands, and against float32 within bf16's error.
#include <functional>
#include "helpers.h"

#include "ops/gemm.h"

using namespace qk;
using qk::test::max_abs_diff;

namespace {

Tensor randn_seeded(const Shape& shape, uint64_t seed, DType dtype = kF32) {
    Generator gen(seed);
    return randn(shape, dtype, gen);
}

// The engines this machine can run: the fallback always, oneDNN where it is in use.
std::vector<cpu::Bf16GemmEngine> engines() {
    std::vector<cpu::Bf16GemmEngine> all = {cpu::Bf16GemmEngine::float32_sgemm};
    if (cpu::bf16_gemm_engine() == cpu::Bf16GemmEngine::onednn)
        all.push_back(cpu::Bf16GemmEngine::onednn);
    return all;
}

struct EngineScope {  // restores the engine in use, even when a CHECK fails
    cpu::Bf16GemmEngine saved = cpu::bf16_gemm_engine();
    explicit EngineScope(cpu::Bf16GemmEngine e) { cpu::set_bf16_gemm_engine(e); }
    ~EngineScope() { cpu::set_bf16_gemm_engine(saved); }
};

// |got - want| <= float32's rounding of a K-term sum: K · 2^-24 · Σ_k |a_ik| |b_kj|, elementwise.
bool within_float32_sum(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<float>& abs_sum, int64_t K) {
    for (size_t i = 0; i < got.size(); ++i)
        if (std::abs(got[i] - want[i]) > double(K) * 0x1p-24 * abs_sum[i] + 1e-30) return false;
    return true;
}

}  // namespace

TEST_CASE("bf16 GEMM engines match the naive loop in every layout, with beta 0 and 1") {
    struct Case {
        int64_t M, N, K;
    };
    for (auto engine : engines()) {
        EngineScope scope(engine);
        INFO(cpu::bf16_gemm_engine_name());
        for (Case c :
             {Case{37, 29, 45}, Case{1, 70, 3}, Case{1, 7, 101}, Case{65, 1, 130}, Case{17, 33, 1}})
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 1.0f}) {
                        INFO("M ", c.M, " N ", c.N, " K ", c.K, " ta ", ta, " tb ", tb, " beta ",
                             beta);
                        // Stored operands with a leading dimension wider than the rows (+3).
                        const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K;
                        const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N;
                        const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldy = c.N + 2;
                        auto a = randn_seeded({a_rows, lda}, 1).to(kBF16).to_vector<bf16>();
                        auto b = randn_seeded({b_rows, ldb}, 2).to(kBF16).to_vector<bf16>();
                        auto y0 = randn_seeded({c.M, ldy}, 3).to_vector<float>();
                        std::vector<float> got = y0, want = y0, abs_sum(y0.size());
                        std::vector<bf16> a_abs(a.size()), b_abs(b.size());
                        for (size_t i = 0; i < a.size(); ++i)
                            a_abs[i] = bf16(std::abs(a[i].to_float()));
                        for (size_t i = 0; i < b.size(); ++i)
                            b_abs[i] = bf16(std::abs(b[i].to_float()));
                        const cpu::GemmLayout la{ta, lda}, lb{tb, ldb};
                        cpu::gemm_bf16_one_thread(got.data(), ldy, a.data(), la, b.data(), lb, c.M,
                                                  c.N, c.K, beta);
                        cpu::gemm_bf16_reference(want.data(), ldy, a.data(), la, b.data(), lb, c.M,
                                                 c.N, c.K, beta);
                        cpu::gemm_bf16_reference(abs_sum.data(), ldy, a_abs.data(), la,
                                                 b_abs.data(), lb, c.M, c.N, c.K, 0.0f);
                        for (int64_t i = 0; i < c.M; ++i)  // the padding columns are untouched
                            for (int64_t j = c.N; j < ldy; ++j)
                                CHECK(got[i * ldy + j] == y0[i * ldy + j]);
                        CHECK(within_float32_sum(got, want, abs_sum, c.K + 1));
                    }
    }
}

TEST_CASE("bf16 GEMMs split over threads, and pairs side by side, match one thread") {
    const int64_t M = 301, N = 97, K = 130;
    auto a = randn_seeded({M, K}, 4).to(kBF16), b = randn_seeded({N, K}, 5).to(kBF16);
    for (auto engine : engines()) {
        EngineScope scope(engine);
        INFO(cpu::bf16_gemm_engine_name());
        std::vector<float> want(M * N), abs_sum(M * N);
        cpu::gemm_bf16_reference(want.data(), N, a.data<bf16>(), {false, K}, b.data<bf16>(),
                                 {true, K}, M, N, K, 0.0f);
        Tensor a_abs = abs(a.to(kF32)).to(kBF16), b_abs = abs(b.to(kF32)).to(kBF16);
        cpu::gemm_bf16_reference(abs_sum.data(), N, a_abs.data<bf16>(), {false, K},
                                 b_abs.data<bf16>(), {true, K}, M, N, K, 0.0f);
        for (int threads : {1, 2, 3, 4}) {
            test::ThreadCount count(threads);
            INFO(threads, " threads");
            std::vector<float> y(M * N), y2(M * N);
            cpu::GemmJob<bf16, float> job{
                y.data(), N, a.data<bf16>(), {false, K}, b.data<bf16>(), {true, K}, M, N, K};
            cpu::gemm(job);
            CHECK(within_float32_sum(y, want, abs_sum, K));
            cpu::GemmJob<bf16, float> second = job;
            second.y = y2.data();
            cpu::gemm_pair(job, second);
            CHECK(within_float32_sum(y2, want, abs_sum, K));
        }
    }
}

TEST_CASE("linear in bf16: forward and gradients are the float64 products of the rounded values") {
    Tensor x = randn_seeded({3, 41, 70}, 6).requires_grad_();
    Tensor w = randn_seeded({53, 70}, 7).requires_grad_();
    Tensor b = randn_seeded({53}, 8).requires_grad_();
    Tensor dy = randn_seeded({3, 41, 53}, 9);
    auto rounded = [](const Tensor& t) { return t.detach().to(kBF16).to(kF64); };
    const Tensor x64 = rounded(x).reshape({123, 70}), w64 = rounded(w), dy64 = rounded(dy);
    const Tensor y_ref = matmul(x64, w64.t()) + b.detach().to(kF64);
    const Tensor dx_ref = matmul(dy64.reshape({123, 53}), w64).reshape(x.shape());
    const Tensor dw_ref = matmul(dy64.reshape({123, 53}).t(), x64);
    const Tensor db_ref = sum(dy.to(kF64), {0, 1});
    for (auto engine : engines()) {
        EngineScope scope(engine);
        INFO(cpu::bf16_gemm_engine_name());
        x.zero_grad(), w.zero_grad(), b.zero_grad();
        Tensor y = linear(x, w, b, Precision::bf16);
        CHECK(y.dtype() == kF32);
        y.backward(dy);
        // float32 sums of ~70 (forward, dx) or 123 (dW) exact products of |value| ~ 1: ≤ 1e-4.
        CHECK(max_abs_diff(y.reshape({123, 53}).to(kF64), y_ref) < 1e-4);
        CHECK(max_abs_diff(x.grad().to(kF64), dx_ref) < 1e-4);
        CHECK(max_abs_diff(w.grad().to(kF64), dw_ref) < 2e-4);
        CHECK(max_abs_diff(b.grad().to(kF64), db_ref) < 1e-5);  // the bias gradient: float32 dY
        CHECK(x.grad().dtype() == kF32);
    }
    // Against the float32 op: bf16's input rounding (2^-9 relative) over ~70 terms of size 1.
    Tensor y32 = linear(x.detach(), w.detach(), b.detach());
    Tensor y16 = linear(x.detach(), w.detach(), b.detach(), Precision::bf16);
    const double diff = max_abs_diff(y32, y16);
    CHECK(diff > 0);  // the rounding is real
    CHECK(diff < 0.15);
}

TEST_CASE("linear in bf16: no bias, an input without grad, empty sizes, bad dtypes") {
    Tensor x = randn_seeded({5, 9}, 10), w = randn_seeded({4, 9}, 11).requires_grad_();
    Tensor y = linear(x, w, {}, Precision::bf16);
    sum(y * randn_seeded({5, 4}, 12)).backward();
    CHECK(w.grad().shape() == Shape{4, 9});
    CHECK(!x.grad().defined());
    CHECK(linear(zeros({0, 9}), w.detach(), {}, Precision::bf16).shape() == Shape{0, 4});
    CHECK(linear(zeros({2, 0}), zeros({4, 0}), ones({4}), Precision::bf16).to_vector<float>() ==
          std::vector<float>(8, 1.0f));
    CHECK(test::throws_with(
        [&] { (void)linear(x.to(kF64), w.detach().to(kF64), {}, Precision::bf16); },
        {"linear", "bf16", "float32", "float64"}));
}

namespace {

Tensor rounded_f64(const Tensor& t, DType half) { return t.detach().to(half).to(kF64); }

// The op matmul(a, b, precision, alpha) against float64 products of the rounded values, forward
// and both gradients: y = α·ã·b̃, dA = α·dỸ·b̃ᵀ, dB = α·ãᵀ·dỸ, summed over broadcast batch dims.
// a and b are the op's inputs (views included), given as float32 leaves and the views of them.
void check_mixed_matmul(Tensor a_leaf, Tensor b_leaf,
                        const std::function<Tensor(const Tensor&)>& a_view,
                        const std::function<Tensor(const Tensor&)>& b_view, Precision precision,
                        double alpha, uint64_t seed) {
    const DType half = precision == Precision::bf16 ? kBF16 : kF16;
    a_leaf.zero_grad(), b_leaf.zero_grad();
    Tensor y = matmul(a_view(a_leaf), b_view(b_leaf), precision, alpha);
    const Tensor dy = randn_seeded(y.shape(), seed);
    y.backward(dy);
    const Tensor a64 = rounded_f64(a_view(a_leaf), half).requires_grad_();
    const Tensor b64 = rounded_f64(b_view(b_leaf), half).requires_grad_();
    const Tensor y_ref = matmul(a64, b64) * alpha;
    y_ref.backward(rounded_f64(dy, half));
    const Tensor da_ref = a64.grad(), db_ref = b64.grad();
    // float32 sums of K (or M·batch) exact products of |value| ~ 1 (|α| ≤ 1): ≤ 1e-4.
    CHECK(y.dtype() == kF32);
    CHECK(y.shape() == y_ref.shape());
    CHECK(max_abs_diff(y.to(kF64), y_ref) < 1e-4);
    // The leaves' gradients are the views' gradients carried back through the views.
    Tensor da_leaf = a_leaf.detach().to(kF64).requires_grad_();
    Tensor db_leaf = b_leaf.detach().to(kF64).requires_grad_();
    sum(a_view(da_leaf) * da_ref).backward();
    sum(b_view(db_leaf) * db_ref).backward();
    CHECK(max_abs_diff(a_leaf.grad().to(kF64), da_leaf.grad()) < 2e-4);
    CHECK(max_abs_diff(b_leaf.grad().to(kF64), db_leaf.grad()) < 2e-4);
}

}  // namespace

TEST_CASE("matmul at bf16 and fp16: rounded operands, float32 sums, alpha, batches, views") {
    auto same = [](const Tensor& t) { return t; };
    auto transposed = [](const Tensor& t) { return t.transpose(-2, -1); };
    for (auto engine : engines()) {
        EngineScope scope(engine);
        for (Precision p : {Precision::bf16, Precision::fp16}) {
            INFO(cpu::bf16_gemm_engine_name(), " ", precision_name(p));
            // Attention's shapes: (B, H, T, D) · (B, H, D, T) with k read transposed, scaled.
            Tensor q = randn_seeded({2, 3, 13, 8}, 40).requires_grad_();
            Tensor k = randn_seeded({2, 3, 11, 8}, 41).requires_grad_();
            check_mixed_matmul(q, k, same, transposed, p, 0.35, 42);
            // p · v: a plain batched product, alpha 1.
            Tensor probs = randn_seeded({2, 3, 13, 11}, 43).requires_grad_();
            Tensor v = randn_seeded({2, 3, 11, 8}, 44).requires_grad_();
            check_mixed_matmul(probs, v, same, same, p, 1.0, 45);
            // A transposed a; a 2-D b broadcast over the batch; a size-1 batch dim broadcast.
            Tensor at = randn_seeded({2, 9, 5}, 46).requires_grad_();
            Tensor b2 = randn_seeded({9, 7}, 47).requires_grad_();
            check_mixed_matmul(at, b2, transposed, same, p, -2.0, 48);
            Tensor a3 = randn_seeded({4, 1, 6, 5}, 49).requires_grad_();
            Tensor b3 = randn_seeded({3, 5, 7}, 50).requires_grad_();
            check_mixed_matmul(a3, b3, same, same, p, 0.5, 51);
        }
    }
}

TEST_CASE("matmul at a precision: full is matmul times alpha; empty sizes; bad inputs") {
    Tensor a = randn_seeded({2, 4, 6}, 52), b = randn_seeded({2, 6, 3}, 53);
    CHECK(max_abs_diff(matmul(a, b, Precision::full, 0.25), matmul(a, b) * 0.25) == 0);
    CHECK(max_abs_diff(matmul(a, b, Precision::full), matmul(a, b)) == 0);
    const Tensor rounded = matmul(a.to(kBF16).to(kF32), b.to(kBF16).to(kF32));
    const double diff = max_abs_diff(matmul(a, b, Precision::bf16), matmul(a, b));
    CHECK(diff > 0);  // the rounding is real, and no more than bf16's: against the rounded inputs
    CHECK(max_abs_diff(matmul(a, b, Precision::bf16), rounded) < 1e-5);
    CHECK(max_abs_diff(matmul(zeros({2, 4, 0}), zeros({2, 0, 3}), Precision::bf16),
                       zeros({2, 4, 3})) == 0);
    CHECK(matmul(zeros({2, 0, 6}), b, Precision::bf16).shape() == Shape{2, 0, 3});
    CHECK(test::throws_with([&] { (void)matmul(a.to(kF64), b.to(kF64), Precision::bf16); },
                            {"matmul", "bf16", "float32", "float64"}));
    CHECK(test::throws_with([&] { (void)matmul(a, b, Precision::fp8); }, {"matmul", "fp8"}));
    CHECK(test::throws_with([&] { (void)matmul(a, b, Precision::bf16, NAN); },
                            {"matmul", "alpha", "nan"}));
    CHECK(test::throws_with([&] { (void)matmul(a, a, Precision::bf16); },
                            {"matmul", "inner dimensions"}));
}
