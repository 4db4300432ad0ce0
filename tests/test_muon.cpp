// Muon: Newton–Schulz acts on singular values as the scalar quintic φ applied 5 times (checked
// against eigenvalues computed here by Jacobi rotations, float64), and lands them in its band;
// one and two Muon steps against a float64 reference written with plain loops (momentum,
// Nesterov, the q/k/v row blocks of one parameter, weight decay, the RMS scale); bad inputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/muon.h"
#include "nn/train/run_optimizer.h"
#include "ops/gemm.h"
#include "ops/join.h"

using namespace qk;
using namespace qk::nn;
using qk::test::throws_with;

namespace {

using Matrix = std::vector<double>;  // row-major

// Eigenvalues of the symmetric n × n matrix S, by cyclic Jacobi rotations.
std::vector<double> symmetric_eigenvalues(Matrix S, int64_t n) {
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) off += S[p * n + q] * S[p * n + q];
        if (off < 1e-30) break;
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) {
                if (std::abs(S[p * n + q]) < 1e-300) continue;
                const double theta = (S[q * n + q] - S[p * n + p]) / (2 * S[p * n + q]);
                const double t =
                    (theta >= 0 ? 1 : -1) / (std::abs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int64_t k = 0; k < n; ++k) {  // S ← Jᵀ S J, columns then rows
                    const double a = S[k * n + p], b = S[k * n + q];
                    S[k * n + p] = c * a - s * b, S[k * n + q] = s * a + c * b;
                }
                for (int64_t k = 0; k < n; ++k) {
                    const double a = S[p * n + k], b = S[q * n + k];
                    S[p * n + k] = c * a - s * b, S[q * n + k] = s * a + c * b;
                }
            }
    }
    std::vector<double> eig(n);
    for (int64_t i = 0; i < n; ++i) eig[i] = S[i * n + i];
    return eig;
}

// Singular values of the (m, n) matrix t, ascending: sqrt of the eigenvalues of the smaller Gram.
std::vector<double> singular_values(const Tensor& t) {
    const int64_t m = t.size(0), n = t.size(1), k = std::min(m, n);
    const Matrix a = t.to_vector<double>();
    Matrix gram(k * k, 0.0);
    for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t l = 0; l < std::max(m, n); ++l)
                gram[i * k + j] +=
                    m <= n ? a[i * n + l] * a[j * n + l] : a[l * n + i] * a[l * n + j];
    std::vector<double> s = symmetric_eigenvalues(gram, k);
    for (double& v : s) v = std::sqrt(std::max(v, 0.0));
    std::sort(s.begin(), s.end());
    return s;
}

double quintic_5(double x) {
    for (int i = 0; i < 5; ++i) x = 3.4445 * x - 4.7750 * x * x * x + 2.0315 * std::pow(x, 5);
    return x;
}

// C (m, p) = A (m, n) · B (n, p), with the transposes spelled out by the caller.
Matrix mul(const Matrix& A, const Matrix& B, int64_t m, int64_t n, int64_t p) {
    Matrix C(m * p, 0.0);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t k = 0; k < n; ++k)
            for (int64_t j = 0; j < p; ++j) C[i * p + j] += A[i * n + k] * B[k * p + j];
    return C;
}
Matrix transpose(const Matrix& A, int64_t m, int64_t n) {
    Matrix T(n * m);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) T[j * m + i] = A[i * n + j];
    return T;
}

// The reference Newton–Schulz on an (m, n) matrix, in float64 loops.
Matrix newton_schulz_reference(Matrix G, int64_t m, int64_t n) {
    const bool tall = m > n;
    if (tall) G = transpose(G, m, n), std::swap(m, n);
    double f = 0;
    for (double v : G) f += v * v;
    f = std::max(std::sqrt(f), 1e-7);
    for (double& v : G) v /= f;
    for (int i = 0; i < 5; ++i) {
        const Matrix A = mul(G, transpose(G, m, n), m, n, m), AA = mul(A, A, m, m, m);
        Matrix B(m * m);
        for (size_t j = 0; j < B.size(); ++j) B[j] = -4.7750 * A[j] + 2.0315 * AA[j];
        const Matrix BG = mul(B, G, m, m, n);
        for (size_t j = 0; j < G.size(); ++j) G[j] = 3.4445 * G[j] + BG[j];
    }
    return tall ? transpose(G, m, n) : G;
}

}  // namespace

TEST_CASE("Newton-Schulz maps each singular value σ to φ⁵(σ/‖G‖_F), inside the band") {
    for (Shape shape : {Shape{48, 20}, Shape{20, 48}, Shape{16, 16}}) {
        CAPTURE(shape);
        Generator gen(shape[0] * 100 + shape[1]);
        const Tensor G = normal(shape, 0, 3, kF64, gen);
        const Tensor O = newton_schulz5(G);
        CHECK(O.shape() == G.shape());
        const std::vector<double> sigma = singular_values(G), out = singular_values(O);
        const double frobenius = std::sqrt(sum(G * G).item());
        std::vector<double> want;
        for (double s : sigma) want.push_back(quintic_5(s / frobenius));
        std::sort(want.begin(), want.end());
        for (size_t i = 0; i < out.size(); ++i) {
            CHECK(out[i] == doctest::Approx(want[i]).epsilon(1e-9));
            if (sigma[i] / frobenius >= 0.002) {  // the band: φ⁵ of [0.002, 1] is [0.68, 1.21]
                CHECK(out[i] > 0.68);
                CHECK(out[i] < 1.21);
            }
        }
    }
    // float32 on a larger matrix: the same band, to float32's precision.
    Generator gen(5);
    const std::vector<double> s32 = singular_values(newton_schulz5(randn({96, 64}, kF32, gen)));
    CHECK(s32.front() > 0.68 - 1e-3);
    CHECK(s32.back() < 1.21 + 1e-3);
}

TEST_CASE("two Muon steps match a float64 reference: momentum, Nesterov, row blocks, decay") {
    const int64_t m1 = 6, n1 = 10, C = 4;
    Generator gen(7);
    Tensor W1 = normal({m1, n1}, 0, 1, kF64, gen).requires_grad_();
    Tensor W2 = normal({3 * C, C}, 0, 1, kF64, gen).requires_grad_();  // like c_attn: 3 blocks
    Muon opt({{W1, 0, -1, "w1"}, {W2, 0, C, "q"}, {W2, C, C, "k"}, {W2, 2 * C, C, "v"}},
             {.momentum = 0.9, .weight_decay = 0.3});
    struct Ref {
        Matrix w, momentum;
        int64_t rows, cols;
    };
    std::vector<Ref> ref{{W1.to_vector<double>(), Matrix(m1 * n1, 0.0), m1, n1}};
    const Matrix w2 = W2.to_vector<double>();
    for (int b = 0; b < 3; ++b)
        ref.push_back({Matrix(w2.begin() + b * C * C, w2.begin() + (b + 1) * C * C),
                       Matrix(C * C, 0.0), C, C});
    const double lrs[2] = {0.02, 0.05};
    for (int step = 0; step < 2; ++step) {
        const Tensor g1 = normal({m1, n1}, 0, 1, kF64, gen),
                     g2 = normal({3 * C, C}, 0, 1, kF64, gen);
        W1.zero_grad(), W2.zero_grad();
        sum(W1 * g1).backward();  // grads = g1, g2 exactly
        sum(W2 * g2).backward();
        opt.step(lrs[step]);
        const Matrix gv1 = g1.to_vector<double>(), gv2 = g2.to_vector<double>();
        for (size_t r = 0; r < ref.size(); ++r) {
            Ref& R = ref[r];
            const Matrix G =
                r == 0 ? gv1 : Matrix(gv2.begin() + (r - 1) * C * C, gv2.begin() + r * C * C);
            Matrix U(G.size());
            for (size_t i = 0; i < G.size(); ++i) {
                R.momentum[i] = 0.9 * R.momentum[i] + G[i];
                U[i] = G[i] + 0.9 * R.momentum[i];
            }
            const Matrix O = newton_schulz_reference(U, R.rows, R.cols);
            const double scale = 0.2 * std::sqrt(double(std::max(R.rows, R.cols)));
            for (size_t i = 0; i < G.size(); ++i)
                R.w[i] = R.w[i] - lrs[step] * 0.3 * R.w[i] - lrs[step] * scale * O[i];
        }
    }
    Matrix want2;
    for (int b = 1; b <= 3; ++b) want2.insert(want2.end(), ref[b].w.begin(), ref[b].w.end());
    auto close = [](const Matrix& a, const Matrix& b) {
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
        return worst;
    };
    CHECK(close(W1.to_vector<double>(), ref[0].w) < 1e-13);
    CHECK(close(W2.to_vector<double>(), want2) < 1e-13);
    CHECK(opt.steps() == 2);
    // The momentum buffers are the state a checkpoint keeps.
    CHECK(close(opt.state()[2].to_vector<double>(), ref[2].momentum) < 1e-13);
}

TEST_CASE("Newton-Schulz on a batch: each matrix as on its own, its own norm, wide and tall") {
    Generator gen(12);
    for (const Shape& shape : {Shape{5, 6, 9}, Shape{3, 9, 4}}) {
        CAPTURE(shape);
        // Norms that differ by orders of magnitude: each matrix is scaled by its own.
        Tensor G = normal(shape, 0, 1, kF64, gen) *
                   from_vector(std::vector<double>{1e-3, 1.0, 50.0, 1e-6, 3.0}, {5, 1, 1}, kF64)
                       .narrow(0, 0, shape[0]);
        const Tensor batched = newton_schulz5(G);
        CHECK(batched.shape() == shape);
        for (int64_t b = 0; b < shape[0]; ++b)
            CHECK(test::max_abs_diff(batched.select(0, b), newton_schulz5(G.select(0, b))) < 1e-13);
    }
}

TEST_CASE("Newton-Schulz at bf16: every product's operands rounded, float32 sums, band kept") {
    // With the float32 engine the bf16 GEMMs sum the same exact products in sgemm's order, so
    // the iteration written out with each operand rounded by hand must agree bit for bit.
    const cpu::Bf16GemmEngine engine = cpu::bf16_gemm_engine();
    Generator gen(21);
    for (const Shape& shape : {Shape{3, 24, 40}, Shape{2, 40, 24}}) {  // wide and tall
        CAPTURE(shape);
        const Tensor G = randn(shape, kF32, gen) * 0.3;
        cpu::set_bf16_gemm_engine(cpu::Bf16GemmEngine::float32_sgemm);
        const Tensor got = newton_schulz5(G, 5, Precision::bf16);
        cpu::set_bf16_gemm_engine(engine);
        auto r = [](const Tensor& t) { return t.to(kBF16).to(kF32); };
        const bool tall = shape[1] > shape[2];
        const Tensor squares = sum(G * G, {-2, -1}).to(kF64);
        std::vector<Tensor> want;
        for (int64_t b = 0; b < shape[0]; ++b) {
            Tensor X = tall ? G.select(0, b).t() : G.select(0, b);
            X = X * static_cast<float>(1.0 / std::sqrt(squares.data<double>()[b]));
            for (int i = 0; i < 5; ++i) {
                const Tensor A = matmul(r(X), r(X).t());
                const Tensor B = A * -4.7750 + matmul(r(A), r(A)) * 2.0315;
                X = X * 3.4445 + matmul(r(B), r(X));
            }
            want.push_back(tall ? X.t() : X);
        }
        CHECK(test::max_abs_diff(got, stack(want)) == 0);
        CHECK(test::max_abs_diff(got, newton_schulz5(G)) > 1e-3);  // the products were bf16
        // The default engine (oneDNN's, where built) sums in its own order: near-orthogonal too.
        const Tensor fast = newton_schulz5(G, 5, Precision::bf16);
        for (int64_t b = 0; b < shape[0]; ++b) {
            const std::vector<double> s = singular_values(fast.select(0, b));
            CHECK(s.front() > 0.68 - 0.02);
            CHECK(s.back() < 1.21 + 0.02);
        }
    }
    CHECK(throws_with(
        [&] {
            newton_schulz5(randn({3, 4}, kF64), 5, Precision::bf16);
        },
        {"newton_schulz5", "bf16", "float32", "float64"}));
}

TEST_CASE("Muon orthogonalises the matrices of one shape together, in one batch") {
    // Two layers' worth of matrices in three shapes, one of them (the 4 × 4 blocks) from two
    // parameters: the grouped step equals a step per matrix, and the momentum stays per matrix.
    Generator gen(13);
    auto param = [&](int64_t rows, int64_t cols) {
        return normal({rows, cols}, 0, 1, kF64, gen).requires_grad_();
    };
    Tensor a = param(12, 4), b = param(4, 4), c = param(8, 4), d = param(8, 4);
    auto matrices = [&](const std::vector<Tensor>& p) {
        return std::vector<MuonMatrix>{{p[0], 0, 4, "q"},    {p[0], 4, 4, "k"},
                                       {p[0], 8, 4, "v"},    {p[1], 0, -1, "proj"},
                                       {p[2], 0, -1, "fc1"}, {p[3], 0, -1, "fc2"}};
    };
    std::vector<Tensor> copies;
    for (const Tensor& t : {a, b, c, d}) copies.push_back(t.detach().clone().requires_grad_());
    Muon grouped(matrices({a, b, c, d}), {.momentum = 0.9, .weight_decay = 0.1});
    std::vector<Muon> single;
    for (const MuonMatrix& m : matrices(copies))
        single.push_back(Muon({m}, {.momentum = 0.9, .weight_decay = 0.1}));
    for (int step = 0; step < 2; ++step) {
        std::vector<Tensor> ps{a, b, c, d};
        for (int i = 0; i < 4; ++i) {
            const Tensor g = normal(ps[i].shape(), 0, 1, kF64, gen);
            ps[i].zero_grad(), copies[i].zero_grad();
            sum(ps[i] * g).backward();
            sum(copies[i] * g).backward();
        }
        grouped.step(0.05);
        for (Muon& m : single) m.step(0.05);
    }
    for (int i = 0; i < 4; ++i)
        CHECK(test::max_abs_diff(std::vector<Tensor>{a, b, c, d}[i], copies[i]) < 1e-13);
    for (size_t i = 0; i < single.size(); ++i)
        CHECK(test::max_abs_diff(grouped.state()[i], single[i].state()[0]) < 1e-13);
}

TEST_CASE("Muon and Newton-Schulz refuse bad input with the name and shape") {
    Tensor v = randn({5}).requires_grad_(), w = randn({4, 3}).requires_grad_();
    CHECK(throws_with([&] { Muon({{v, 0, -1, "gain"}}, {}); }, {"Muon", "gain", "2-D", "[5]"}));
    CHECK(throws_with([&] { Muon({{w, 2, 3, "q"}}, {}); }, {"Muon", "q", "[2, 5)", "4 rows"}));
    CHECK(throws_with([&] { Muon({{w, 0, -1, "w"}}, {.momentum = 1}); }, {"momentum", "1"}));
    CHECK(throws_with([&] { Muon({{w.t(), 0, -1, "wt"}}, {}); }, {"Muon", "wt", "contiguous"}));
    CHECK(throws_with(
        [&] {
            newton_schulz5(randn({2, 2, 3, 4}));
        },
        {"newton_schulz5", "[2, 2, 3, 4]"}));
    Tensor bad = randn({3, 3});
    bad.set({1, 1}, NAN);
    CHECK(throws_with([&] { newton_schulz5(bad); }, {"newton_schulz5", "not finite"}));
    Tensor bad_batch = randn({4, 3, 3});
    bad_batch.set({2, 0, 1}, INFINITY);
    CHECK(throws_with([&] { newton_schulz5(bad_batch); }, {"not finite", "matrix 2"}));
}

TEST_CASE("split_for_muon: the blocks' matrices to Muon (c_attn as q, k, v), the rest to AdamW") {
    GPTConfig c;
    c.vocab_size = 11, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
    c.tie_embeddings = false;
    GPT model(c, 1);
    const ParameterSplit split = split_for_muon(model.named_parameters());
    std::vector<std::string> muon_names, adamw_2d;
    for (const MuonMatrix& m : split.muon) muon_names.push_back(m.name);
    for (const auto& [name, p] : split.adamw)
        if (p.dim() == 2) adamw_2d.push_back(name);
    CHECK(muon_names ==
          std::vector<std::string>{
              "transformer.h.0.attn.c_attn.weight.q", "transformer.h.0.attn.c_attn.weight.k",
              "transformer.h.0.attn.c_attn.weight.v", "transformer.h.0.attn.c_proj.weight",
              "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight",
              "transformer.h.1.attn.c_attn.weight.q", "transformer.h.1.attn.c_attn.weight.k",
              "transformer.h.1.attn.c_attn.weight.v", "transformer.h.1.attn.c_proj.weight",
              "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"});
    CHECK(split.muon[1].row_begin == 8);
    CHECK(split.muon[1].rows == 8);
    CHECK(adamw_2d == std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight",
                                               "lm_head.weight"});
    // Every parameter lands on exactly one side.
    CHECK(split.adamw.size() + split.muon.size() - 4 == model.named_parameters().size());
    // Grouped-query attention: c_attn is q (8 rows), k (4), v (4), each its own matrix.
    c.n_kv_head = 1;
    GPT gqa(c, 1);
    const ParameterSplit gqa_split = split_for_muon(gqa.named_parameters(), {8, 4});
    CHECK(gqa_split.muon[0].row_begin == 0);
    CHECK(gqa_split.muon[0].rows == 8);
    CHECK(gqa_split.muon[1].row_begin == 8);
    CHECK(gqa_split.muon[1].rows == 4);
    CHECK(gqa_split.muon[2].row_begin == 12);
    CHECK(gqa_split.muon[2].rows == 4);
    CHECK(throws_with(
        [&] {
            split_for_muon(gqa.named_parameters(), {8, 8});
        },
        {"Muon", "c_attn.weight", "8 + 2 · 8", "[16, 8]"}));
}

TEST_CASE("RunOptimizer with Muon: Muon on the matrices and AdamW on the rest, bit for bit") {
    GPTConfig c;
    c.vocab_size = 11, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    GPT a(c, 2), b(c, 2);
    RunOptimizerOptions options;
    options.muon = true;
    options.adamw.weight_decay = 0.2;
    options.muon_options = {.momentum = 0.9, .weight_decay = 0.2};
    RunOptimizer run(a.named_parameters(), options);
    const ParameterSplit split = split_for_muon(b.named_parameters());
    Muon muon(split.muon, options.muon_options);
    std::vector<Tensor> rest;
    for (const auto& [name, p] : split.adamw) rest.push_back(p);
    AdamW adamw(rest, options.adamw);
    const Tensor ids = from_ids({1, 2, 3, 4, 5, 6}, {2, 3}),
                 targets = from_ids({2, 3, 4, 5, 6, 7}, {2, 3});
    for (double lr : {1e-2, 3e-3}) {
        a.forward(ids, targets).loss.backward();
        b.forward(ids, targets).loss.backward();
        run.step(lr), run.zero_grad();
        muon.step(lr), adamw.step(lr), muon.zero_grad(), adamw.zero_grad();
    }
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].first);
        CHECK(pa[i].second.to_vector<double>() == pb[i].second.to_vector<double>());
    }
    // Muon's momentum is in the state, by matrix name, after AdamW's moments.
    const OptimizerState state = run.state();
    CHECK(state.tensors.back().first == "muon_momentum.transformer.h.0.mlp.c_proj.weight");
    CHECK(state.tensors.size() == 2 * split.adamw.size() + split.muon.size());
}
