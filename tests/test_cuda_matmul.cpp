// matmul and linear on cuda (cuBLAS through the row-major/column-major trick, cuda/matmul.cu)
// against the cpu (OpenBLAS), forward and both gradients: every transpose combination, batched,
// broadcast batch, the Linear case as one GEMM, float32 and float64; and the tiled teaching
// kernel against cuBLAS and the cpu. Sizes are ragged (not multiples of 16 or 32).
#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::max_abs_diff;
using qk::test::randn_seeded;
using qk::test::throws_with;

namespace {

constexpr int64_t M = 37, K = 29, N = 45;

// A (rows, cols) operand stored as given, or stored transposed and read through .t() (strides
// (1, rows): cuBLAS gets CUBLAS_OP_T, the cpu CblasTrans).
Tensor operand(int64_t rows, int64_t cols, bool transposed, uint64_t seed, DType dt) {
    return transposed ? randn_seeded({cols, rows}, seed, dt) : randn_seeded({rows, cols}, seed, dt);
}
Tensor as_stored(const Tensor& t, bool transposed) { return transposed ? t.t() : t; }

}  // namespace

TEST_CASE("matmul on cuda matches the cpu for every transpose combination, f32 and f64") {
    for (DType dt : {kF32, kF64})
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                check_cuda_parity(
                    fmt::format("matmul {} a{} b{}", dtype_name(dt), ta ? "ᵀ" : "", tb ? "ᵀ" : ""),
                    [ta, tb](const Inputs& in) {
                        return matmul(as_stored(in[0], ta), as_stored(in[1], tb));
                    },
                    {operand(M, K, ta, 1, dt), operand(K, N, tb, 2, dt)});
            }
}

TEST_CASE("batched and broadcast-batch matmul on cuda match the cpu") {
    for (DType dt : {kF32, kF64}) {
        // same batch on both sides: one strided-batched call
        check_cuda_parity("batched", [](const Inputs& in) { return matmul(in[0], in[1]); },
                          {randn_seeded({3, M, K}, 3, dt), randn_seeded({3, K, N}, 4, dt)});
        // a's batch broadcast against b's, over two batch dims (a host loop of strided calls)
        check_cuda_parity("broadcast batch", [](const Inputs& in) { return matmul(in[0], in[1]); },
                          {randn_seeded({2, 1, M, K}, 5, dt), randn_seeded({3, K, N}, 6, dt)});
        // attention's q · kᵀ: both batched, b a transposed view
        check_cuda_parity(
            "q kT", [](const Inputs& in) { return matmul(in[0], in[1].transpose(-2, -1)); },
            {randn_seeded({2, 3, 19, 13}, 7, dt), randn_seeded({2, 3, 21, 13}, 8, dt)});
        // the same with a broadcast inner batch dim: b's heads (2, 1, ...) expanded, no merge
        check_cuda_parity(
            "q kT, b broadcast over heads",
            [](const Inputs& in) {
                return matmul(in[0], in[1].expand({2, 3, 21, 13}).transpose(-2, -1));
            },
            {randn_seeded({2, 3, 19, 13}, 7, dt), randn_seeded({2, 1, 21, 13}, 8, dt)});
        // the Linear case: (B, T, C) times a shared 2-D matrix, one GEMM over all rows
        check_cuda_parity("rows times shared",
                          [](const Inputs& in) { return matmul(in[0], in[1].t()); },
                          {randn_seeded({2, 17, K}, 9, dt), randn_seeded({N, K}, 10, dt)});
        // an operand GEMM cannot read as stored (expanded rows): copied first
        check_cuda_parity("expanded operand",
                          [](const Inputs& in) {
                              return matmul(in[0].expand({M, K}), in[1]);
                          },
                          {randn_seeded({1, K}, 11, dt), randn_seeded({K, N}, 12, dt)});
    }
}

TEST_CASE("batch dims that step evenly merge into one cuBLAS call; a broadcast one does not") {
    if (!cuda_runnable()) return;
    auto calls = [](const Tensor& a, const Tensor& b) {
        std::vector<std::string> names;
        for (const auto& e : qk::test::launches_of([&] { (void)matmul(a, b); }))
            names.push_back(e.name);
        return names;
    };
    const Tensor q = randn_seeded({2, 3, 19, 13}, 7, kF32).to(Device::cuda);
    const Tensor k = randn_seeded({2, 3, 21, 13}, 8, kF32).to(Device::cuda);
    const auto merged = calls(q, k.transpose(-2, -1));  // (2, 3) heads: one call of 6 matrices
    REQUIRE(merged.size() == 1);
    CHECK(merged[0] == "cublas:SgemmStridedBatched 19x21x13 x6");
    const Tensor k1 = randn_seeded({2, 1, 21, 13}, 8, kF32).to(Device::cuda);
    const auto split = calls(q, k1.expand({2, 3, 21, 13}).transpose(-2, -1));
    CHECK(split.size() == 2);  // stride 0 over heads: a call per batch of 3
}

TEST_CASE("linear on cuda matches the cpu, with and without bias") {
    for (DType dt : {kF32, kF64}) {
        check_cuda_parity("linear with bias",
                          [](const Inputs& in) { return linear(in[0], in[1], in[2]); },
                          {randn_seeded({2, 17, K}, 13, dt), randn_seeded({N, K}, 14, dt),
                           randn_seeded({N}, 15, dt)});
        check_cuda_parity("linear without bias",
                          [](const Inputs& in) { return linear(in[0], in[1]); },
                          {randn_seeded({3, 11, K}, 16, dt), randn_seeded({N, K}, 17, dt)});
        check_cuda_parity(
            "linear of a transposed x",
            [](const Inputs& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
            {randn_seeded({19, 3, K}, 18, dt), randn_seeded({N, K}, 19, dt),
             randn_seeded({N}, 20, dt)});
    }
}

TEST_CASE("linear in bf16 on cuda (cublasGemmStridedBatchedEx) matches the cpu's bf16 linear") {
    // Both round the same operands to bf16 and sum exact products in float32, in different
    // orders: float32 tolerance over K terms, forward and all three gradients.
    qk::test::ParityOptions options;
    options.atol_f32 = 2e-5, options.rtol_f32 = 2e-4;
    // With a bias: cuBLASLt's epilogue adds it (cuda/matmul.cu), or, turned off, the bias rows
    // are written first and the GEMM adds to them.
    for (bool epilogue : {true, false}) {
        CAPTURE(epilogue);
        const bool was = cuda::use_bias_epilogue(epilogue);
        check_cuda_parity(
            "bf16 linear with bias",
            [](const Inputs& in) { return linear(in[0], in[1], in[2], Precision::bf16); },
            {randn_seeded({2, 17, K}, 21, kF32), randn_seeded({N, K}, 22, kF32),
             randn_seeded({N}, 23, kF32)},
            options);
        cuda::use_bias_epilogue(was);
    }
    check_cuda_parity(
        "bf16 linear without bias",
        [](const Inputs& in) { return linear(in[0], in[1], {}, Precision::bf16); },
        {randn_seeded({3, 11, K}, 24, kF32), randn_seeded({N, K}, 25, kF32)}, options);
    // 450 rows: the bias gradient's column sums in 7 chunks of rows (cuda/matmul_bf16.cu), and
    // x read through a row stride of K + 3 (a narrowed view rounds without a copy first).
    check_cuda_parity(
        "bf16 linear, many rows, x strided",
        [](const Inputs& in) {
            return linear(in[0].narrow(2, 1, K), in[1], in[2], Precision::bf16);
        },
        {randn_seeded({3, 150, K + 3}, 31, kF32), randn_seeded({N, K}, 32, kF32),
         randn_seeded({N}, 33, kF32)},
        options);
    // 1,024 rows or more and a width that is not a multiple of 8 (a vocabulary head): the GEMMs
    // run 64 wide against zero rows of the weight and zero columns of dỸ (ops/matmul_bf16.cpp).
    check_cuda_parity(
        "bf16 linear, padded width",
        [](const Inputs& in) { return linear(in[0], in[1], {}, Precision::bf16); },
        {randn_seeded({2, 512, K}, 37, kF32), randn_seeded({N, K}, 38, kF32)}, options);
    check_cuda_parity(  // widths that are multiples of 4: x and the bias rows four at a time
        "bf16 linear, vector widths",
        [](const Inputs& in) { return linear(in[0], in[1], in[2], Precision::bf16); },
        {randn_seeded({2, 70, 32}, 34, kF32), randn_seeded({20, 32}, 35, kF32),
         randn_seeded({20}, 36, kF32)},
        options);
}

namespace {

// y = x̃ · W̃ᵀ + b in float64 from the same bf16 values: x (R, K), w (N, K), b (N).
std::vector<double> linear_reference(const Tensor& x, const Tensor& w, const Tensor& b) {
    const auto xv = x.to(kF64).to_vector<double>(), wv = w.to(kF64).to_vector<double>(),
               bv = b.to_vector<double>();
    const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
    std::vector<double> y(size_t(R * N));
    for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n) {
            double sum = bv[size_t(n)];
            for (int64_t k = 0; k < K; ++k) sum += xv[size_t(r * K + k)] * wv[size_t(n * K + k)];
            y[size_t(r * N + n)] = sum;
        }
    return y;
}

}  // namespace

TEST_CASE("cuBLASLt's bias epilogue: y = x̃ · W̃ᵀ + b, the bias added to each row's sums") {
    if (!cuda_runnable()) return;
    // Aligned sizes (cuBLASLt has algorithms for them on every GPU) and ragged ones, where
    // cuBLASLt may decline (false: nothing written, the caller's two-step path runs).
    for (auto [R, N_, K_] : {std::tuple<int64_t, int64_t, int64_t>{70, 24, 32}, {37, 45, 29}}) {
        CAPTURE(R);
        CAPTURE(N_);
        CAPTURE(K_);
        const Tensor x = randn_seeded({R, K_}, 51, kF32).to(kBF16),
                     w = randn_seeded({N_, K_}, 52, kF32).to(kBF16),
                     b = randn_seeded({N_}, 53, kF32);
        const Tensor xd = x.to(Device::cuda), wd = w.to(Device::cuda), bd = b.to(Device::cuda);
        const Tensor y = full({R, N_}, std::nan(""), kF32).to(Device::cuda);
        const bool done = cuda::linear_bias_mixed(y.data<float>(), xd.data<bf16>(), wd.data<bf16>(),
                                                  bd.data<float>(), R, N_, K_);
        if (N_ % 8 == 0 && K_ % 8 == 0) CHECK(done);
        if (!done) continue;
        const auto want = linear_reference(x, w, b);
        const auto got = y.to(Device::cpu).to_vector<float>();
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i)
            worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1 + std::abs(want[i])));
        CHECK(worst < 1e-5);  // float32 sums of exact products: every value written
    }
    // Turned off, nothing is done and nothing written.
    const bool was = cuda::use_bias_epilogue(false);
    const Tensor one = ones({8, 8}, kBF16).to(Device::cuda),
                 bias = zeros({8}, kF32).to(Device::cuda);
    const Tensor y = full({8, 8}, 3.0, kF32).to(Device::cuda);
    CHECK_FALSE(cuda::linear_bias_mixed(y.data<float>(), one.data<bf16>(), one.data<bf16>(),
                                        bias.data<float>(), 8, 8, 8));
    CHECK(y.to(Device::cpu).to_vector<float>()[0] == 3.0f);
    cuda::use_bias_epilogue(was);
}

TEST_CASE("a bf16 linear with a bias is one cuBLASLt call after its input's rounding") {
    if (!cuda_runnable()) return;
    const Tensor w = randn_seeded({24, 32}, 62, kF32).to(Device::cuda),
                 b = randn_seeded({24}, 63, kF32).to(Device::cuda);
    for (bool epilogue : {true, false}) {
        CAPTURE(epilogue);
        const Tensor x = randn_seeded({64, 32}, 61, kF32).to(Device::cuda);  // not rounded yet
        const bool was = cuda::use_bias_epilogue(epilogue);
        (void)cast_once(w, kBF16);  // the weight's rounding, kept as an optimizer keeps it
        cuda::ledger::open();
        (void)linear(x, w, b, Precision::bf16);
        std::vector<std::string> names;
        for (const cuda::ledger::Entry& e : cuda::ledger::close()) names.push_back(e.name);
        cuda::use_bias_epilogue(was);
        INFO(fmt::format("{}", fmt::join(names, ", ")));
        // x's rounding, then the GEMM that adds the bias, or the bias rows and a GEMM adding to
        // them
        REQUIRE(names.size() == (epilogue ? 2 : 3));
        if (epilogue) CHECK(names[1] == "cublas:LtMatmul bf16 64x24x32 bias aligned");
        if (!epilogue) CHECK(names[1] == "(fill_bias_rows_kernel<4>)");
        if (!epilogue) CHECK(names[2] == "cublas:GemmEx bf16 64x24x32 aligned");
    }
}

TEST_CASE("a padded head's logits are a view of the GEMM's wider rows, read in place by the loss") {
    if (!cuda_runnable()) return;
    // 1,024 rows of width 37 (not a multiple of 8): the GEMM writes rows 64 wide and the linear's
    // result views their first 37 values; cross_entropy reads those rows where they are.
    const int64_t R = 1024, N = 37;
    Tensor w = randn_seeded({N, 32}, 71, kF32).to(Device::cuda).requires_grad_();
    const Tensor x = randn_seeded({2, R / 2, 32}, 72, kF32).to(Device::cuda);
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) ids[size_t(r)] = int32_t((r * 7) % N);
    const Tensor targets = from_ids(ids, {R}).to(Device::cuda);
    const Tensor y = linear(x, w, {}, Precision::bf16);
    CHECK(y.shape() == Shape{2, R / 2, N});
    CHECK(y.strides()[1] == 64);
    const Tensor rows = y.reshape({R, N});  // still a view: no copy of the logits
    CHECK(rows.strides()[0] == 64);
    cuda::ledger::open();
    const Tensor loss = cross_entropy(rows, targets, -1, Precision::bf16);
    std::vector<std::string> names;
    for (const cuda::ledger::Entry& e : cuda::ledger::close()) names.push_back(e.name);
    INFO(fmt::format("{}", fmt::join(names, ", ")));
    for (const std::string& name : names) CHECK(name.find("copy") == std::string::npos);
    // The same loss and gradients as from the logits copied out first.
    Tensor w_copy = w.detach().clone().requires_grad_();
    const Tensor loss_copy =
        cross_entropy(linear(x, w_copy, {}, Precision::bf16).contiguous().reshape({R, N}), targets,
                      -1, Precision::bf16);
    CHECK(max_abs_diff(loss, loss_copy) == 0);
    loss.backward();
    loss_copy.backward();
    CHECK(max_abs_diff(w.grad(), w_copy.grad()) == 0);
}

TEST_CASE("linear_gelu on cuda: the two ops' bits, with GELU's backward in dY's rounding pass") {
    if (!cuda_runnable()) return;
    // 150 rows (the column sums in chunks) of a ragged width; with and without a bias.
    const Tensor x0 = randn_seeded({3, 50, K}, 81, kF32).to(Device::cuda),
                 w0 = randn_seeded({N, K}, 82, kF32).to(Device::cuda),
                 b0 = randn_seeded({N}, 83, kF32).to(Device::cuda),
                 probe = randn_seeded({3, 50, N}, 84, kF32).to(Device::cuda);
    for (Precision p : {Precision::bf16, Precision::fp16})
        for (bool with_bias : {true, false}) {
            CAPTURE(precision_name(p));
            CAPTURE(with_bias);
            struct Run {
                Tensor h, h_rounded, dx, dw, db;
                std::vector<std::string> backward_launches;
            };
            const auto run = [&](bool fused) {
                Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
                Tensor b = with_bias ? b0.clone().requires_grad_() : Tensor();
                const Tensor h = fused ? linear_gelu(x, w, b, p, p) : gelu(linear(x, w, b, p), p);
                const Tensor loss = sum(h * probe);  // dH = the probe
                cuda::ledger::open();
                loss.backward();
                std::vector<std::string> names;
                for (const cuda::ledger::Entry& e : cuda::ledger::close()) names.push_back(e.name);
                const DType half = p == Precision::bf16 ? kBF16 : kF16;
                return Run{h,        cast_once(h, half).to(kF32),     x.grad(),
                           w.grad(), with_bias ? b.grad() : Tensor(), names};
            };
            const Run fused = run(true), two_ops = run(false);
            CHECK(max_abs_diff(fused.h, two_ops.h) == 0);
            CHECK(max_abs_diff(fused.h_rounded, two_ops.h_rounded) == 0);
            CHECK(max_abs_diff(fused.dx, two_ops.dx) == 0);
            CHECK(max_abs_diff(fused.dw, two_ops.dw) == 0);
            if (with_bias) CHECK(max_abs_diff(fused.db, two_ops.db) == 0);
            // The fused backward: no GELU backward of its own, one pass that applies it.
            INFO(fmt::format("{}", fmt::join(fused.backward_launches, ", ")));
            int gelu_passes = 0;
            for (const std::string& name : fused.backward_launches) {
                CHECK(name.find("unary_backward") == std::string::npos);
                gelu_passes += name == "(round_and_sum_columns_kernel<Half, true>)";
            }
            CHECK(gelu_passes == 1);
            CHECK(fused.backward_launches.size() + 1 == two_ops.backward_launches.size());
        }
    // Against the cpu, forward and gradients (the cpu runs the two ops).
    qk::test::ParityOptions options;
    options.atol_f32 = 2e-5, options.rtol_f32 = 2e-4;
    check_cuda_parity(
        "bf16 linear_gelu",
        [](const Inputs& in) {
            return linear_gelu(in[0], in[1], in[2], Precision::bf16, Precision::bf16);
        },
        {randn_seeded({2, 17, K}, 85, kF32), randn_seeded({N, K}, 86, kF32),
         randn_seeded({N}, 87, kF32)},
        options);
}

TEST_CASE(
    "linear_gelu_linear on cuda: the two ops' bits, and GELU's float32 output never written") {
    if (!cuda_runnable()) return;
    // 150 rows of a ragged hidden width N; c_proj back to K; with and without biases.
    const Tensor x0 = randn_seeded({3, 50, K}, 91, kF32).to(Device::cuda),
                 w1 = randn_seeded({N, K}, 92, kF32).to(Device::cuda),
                 b1 = randn_seeded({N}, 93, kF32).to(Device::cuda),
                 w2 = randn_seeded({K, N}, 94, kF32).to(Device::cuda),
                 b2 = randn_seeded({K}, 95, kF32).to(Device::cuda),
                 probe = randn_seeded({3, 50, K}, 96, kF32).to(Device::cuda);
    for (Precision p : {Precision::bf16, Precision::fp16})
        for (bool with_bias : {true, false}) {
            CAPTURE(precision_name(p));
            CAPTURE(with_bias);
            struct Run {
                std::vector<Tensor> results;  // out, then the five gradients
                double gelu_bytes = 0;        // GELU's forward pass, from the ledger
            };
            const auto run = [&](bool one_op) {
                std::vector<Tensor> leaves = {x0.clone(), w1.clone(), b1.clone(), w2.clone(),
                                              b2.clone()};
                for (Tensor& t : leaves) t.requires_grad_();
                const Tensor bias1 = with_bias ? leaves[2] : Tensor(),
                             bias2 = with_bias ? leaves[4] : Tensor();
                Run r;
                cuda::ledger::open();
                const Tensor out =
                    one_op ? linear_gelu_linear(leaves[0], leaves[1], bias1, leaves[3], bias2, p)
                           : linear(linear_gelu(leaves[0], leaves[1], bias1, p, p), leaves[3],
                                    bias2, p);
                for (const cuda::ledger::Entry& e : cuda::ledger::close())
                    if (e.name.find("unary_forward") != std::string::npos) r.gelu_bytes += e.bytes;
                sum(out * probe).backward();
                r.results.push_back(out);
                for (size_t i = 0; i < leaves.size(); ++i)
                    if (with_bias || (i != 2 && i != 4)) r.results.push_back(leaves[i].grad());
                return r;
            };
            const Run one_op = run(true), two_ops = run(false);
            REQUIRE(one_op.results.size() == two_ops.results.size());
            for (size_t i = 0; i < one_op.results.size(); ++i) {
                CAPTURE(i);
                CHECK(max_abs_diff(one_op.results[i], two_ops.results[i]) == 0);
            }
            // h: (150, N) read in float32 and written rounded only (6 bytes a value, where the two
            // ops write h in float32 too: 10).
            const double values = 150.0 * double(N);
            CHECK(one_op.gelu_bytes == 6 * values);
            CHECK(two_ops.gelu_bytes == 10 * values);
        }
    // Against the cpu, forward and gradients (the cpu runs the two ops).
    qk::test::ParityOptions options;
    options.atol_f32 = 1e-4, options.rtol_f32 = 1e-3;
    check_cuda_parity(
        "bf16 linear_gelu_linear",
        [](const Inputs& in) {
            return linear_gelu_linear(in[0], in[1], in[2], in[3], in[4], Precision::bf16);
        },
        {randn_seeded({2, 17, K}, 97, kF32), randn_seeded({N, K}, 98, kF32),
         randn_seeded({N}, 99, kF32), randn_seeded({K, N}, 100, kF32),
         randn_seeded({K}, 101, kF32)},
        options);
}

TEST_CASE("glu_linear on cuda: the ops' bits, the product and its gradients only rounded") {
    if (!cuda_runnable()) return;
    const Tensor x0 = randn_seeded({3, 50, K}, 111, kF32).to(Device::cuda),
                 wg = randn_seeded({N, K}, 112, kF32).to(Device::cuda),
                 wu = randn_seeded({N, K}, 113, kF32).to(Device::cuda),
                 w2 = randn_seeded({K, N}, 114, kF32).to(Device::cuda),
                 b2 = randn_seeded({K}, 115, kF32).to(Device::cuda),
                 probe = randn_seeded({3, 50, K}, 116, kF32).to(Device::cuda);
    for (Precision p : {Precision::bf16, Precision::fp16})
        for (GluActivation act : {GluActivation::silu, GluActivation::gelu}) {
            CAPTURE(precision_name(p));
            CAPTURE(int(act));
            struct Run {
                std::vector<Tensor> results;  // out, then the five gradients
                double glu_bytes = 0;         // the product's passes, forward and backward
            };
            const auto run = [&](bool one_op) {
                std::vector<Tensor> leaves = {x0.clone(), wg.clone(), wu.clone(), w2.clone(),
                                              b2.clone()};
                for (Tensor& t : leaves) t.requires_grad_();
                Run r;
                cuda::ledger::open();
                const Tensor out = one_op ? glu_linear(leaves[0], leaves[1], leaves[2], leaves[3],
                                                       leaves[4], act, p)
                                          : linear(glu(linear(leaves[0], leaves[1], {}, p),
                                                       linear(leaves[0], leaves[2], {}, p), act, p),
                                                   leaves[3], leaves[4], p);
                sum(out * probe).backward();
                for (const cuda::ledger::Entry& e : cuda::ledger::close())
                    if (e.name.find("glu_") != std::string::npos) r.glu_bytes += e.bytes;
                r.results.push_back(out);
                for (const Tensor& t : leaves) r.results.push_back(t.grad());
                return r;
            };
            const Run one_op = run(true), two_ops = run(false);
            for (size_t i = 0; i < one_op.results.size(); ++i) {
                CAPTURE(i);
                CHECK(max_abs_diff(one_op.results[i], two_ops.results[i]) == 0);
            }
            // Per value: forward g, u read (8 bytes) and the product written (4 + 2, rounded
            // only: 2); backward dH, g, u read (12) and the two gradients (8 + 4, rounded only: 4).
            const double values = 150.0 * double(N);
            CHECK(one_op.glu_bytes == (10 + 16) * values);
            CHECK(two_ops.glu_bytes == (14 + 24) * values);
        }
}

TEST_CASE("linear in fp16 on cuda (cublasGemmStridedBatchedEx, CUDA_R_16F) matches the cpu's") {
    // The device casts to float16 (the copy kernel, core/float16.h's rounding) and cuBLAS sums
    // exact products in float32, as the cpu's widened sgemm does; an overflow is Inf on both.
    qk::test::ParityOptions options;
    options.atol_f32 = 2e-5, options.rtol_f32 = 2e-4;
    check_cuda_parity(
        "fp16 linear with bias",
        [](const Inputs& in) { return linear(in[0], in[1], in[2], Precision::fp16); },
        {randn_seeded({2, 17, K}, 26, kF32), randn_seeded({N, K}, 27, kF32),
         randn_seeded({N}, 28, kF32)},
        options);
    if (!cuda_runnable()) return;
    const Tensor big = full({1, K}, 7e4, kF32);  // beyond 65,504
    const Tensor w = ones({N, K}, kF32);
    CHECK(std::isinf(linear(big.to(Device::cuda), w.to(Device::cuda), {}, Precision::fp16)
                         .to(Device::cpu)
                         .at({0, 0})));
    const Tensor x = randn_seeded({5, K}, 29, kF32) * 3000.0;
    const auto on_cpu = x.to(kF16).to_vector<f16>(),
               on_device = x.to(Device::cuda).to(kF16).to(Device::cpu).to_vector<f16>();
    bool same = on_cpu.size() == on_device.size();
    for (size_t i = 0; same && i < on_cpu.size(); ++i) same = on_cpu[i].bits == on_device[i].bits;
    CHECK(same);  // the device's cast rounds like the cpu's, bit for bit
}

TEST_CASE("matmul at bf16 and fp16 on cuda (strided-batched tensor-core GEMMs) matches the cpu's") {
    // The same rounded operands and exact products, summed in other orders: float32 tolerance.
    qk::test::ParityOptions options;
    options.atol_f32 = 2e-5, options.rtol_f32 = 2e-4;
    for (Precision p : {Precision::bf16, Precision::fp16}) {
        INFO(precision_name(p));
        check_cuda_parity(  // attention's q · kᵀ: B·H matrices in one call, k read transposed
            "scores",
            [p](const Inputs& in) { return matmul(in[0], in[1].transpose(-2, -1), p, 0.35); },
            {randn_seeded({2, 3, 13, 8}, 60, kF32), randn_seeded({2, 3, 11, 8}, 61, kF32)},
            options);
        check_cuda_parity(  // a size-1 batch dim broadcast: one call per run of the batch
            "broadcast batch", [p](const Inputs& in) { return matmul(in[0], in[1], p); },
            {randn_seeded({4, 1, 6, 5}, 62, kF32), randn_seeded({3, 5, 7}, 63, kF32)}, options);
        check_cuda_parity(  // a transposed a times one b shared by the batch
            "transposed a, 2-D b",
            [p](const Inputs& in) { return matmul(in[0].transpose(-2, -1), in[1], p, -2.0); },
            {randn_seeded({2, 9, 5}, 64, kF32), randn_seeded({9, 7}, 65, kF32)}, options);
    }
}

TEST_CASE(
    "linear in bf16 on cuda reads an x its producer rounded, bias rows copied: the same bits") {
    if (!cuda_runnable()) return;
    const Tensor x0 = randn_seeded({3, 11, K}, 70).to(Device::cuda);
    const Tensor gain = randn_seeded({K}, 71).to(Device::cuda);
    const Tensor x = layer_norm(x0, gain, {}, 1e-5, Precision::bf16);  // rounded beside it
    const Tensor x_plain = x.detach() * 1.0;                           // the same values, no copy
    REQUIRE(has_kept_cast(x, kBF16));
    REQUIRE_FALSE(has_kept_cast(x_plain, kBF16));
    for (bool with_bias : {true, false}) {
        CAPTURE(with_bias);
        Tensor w = randn_seeded({N, K}, 72).to(Device::cuda).requires_grad_();
        Tensor b = with_bias ? randn_seeded({N}, 73).to(Device::cuda).requires_grad_() : Tensor();
        const Tensor r = randn_seeded({3, 11, N}, 74).to(Device::cuda);
        const Tensor y = linear(x.detach(), w, b, Precision::bf16);
        sum(y * r).backward();
        const Tensor dw = w.grad(), db = with_bias ? b.grad() : Tensor();
        w.zero_grad();
        if (with_bias) b.zero_grad();
        const Tensor y_plain = linear(x_plain, w, b, Precision::bf16);
        sum(y_plain * r).backward();
        CHECK(max_abs_diff(y, y_plain) == 0);
        CHECK(max_abs_diff(dw, w.grad()) == 0);
        if (with_bias) CHECK(max_abs_diff(db, b.grad()) == 0);
    }
}

TEST_CASE("TF32 on cuda: float32 GEMMs read 10-bit inputs; switched off, float32 parity again") {
    if (!cuda_runnable()) return;
    struct Off {
        ~Off() { set_tf32(false); }
    } off;
    const Tensor a = randn_seeded({37, 45}, 31, kF32), b = randn_seeded({45, 29}, 32, kF32);
    const Tensor exact = matmul(a.to(kF64), b.to(kF64));
    const Tensor bound = matmul(abs(a.to(kF64)), abs(b.to(kF64)));  // Σ_k |a_ik| |b_kj|
    set_tf32(true);
    CHECK(tf32_enabled());
    const Tensor y_tf32 = matmul(a.to(Device::cuda), b.to(Device::cuda)).to(Device::cpu);
    // Each input within 2^-10 of itself (relative; 2^-11 when rounded to nearest): the products
    // within 2 · 2^-10 of theirs, plus float32 sums.
    const Tensor error = abs(y_tf32.to(kF64) - exact) - bound * (2 * 0x1p-10 + 45 * 0x1p-24);
    CHECK(max(error).item() <= 0);
    CHECK(max_abs_diff(y_tf32, matmul(a, b)) > 1e-4);  // the rounding is real
    set_tf32(false);
    CHECK(max_abs_diff(matmul(a.to(Device::cuda), b.to(Device::cuda)), matmul(a, b)) < 1e-5);
}

TEST_CASE("matmul on cuda: an empty inner dim gives zeros, an empty output nothing") {
    if (!cuda_runnable()) return;
    const Tensor a = Tensor::empty({4, 0}, kF32, Device::cuda);
    const Tensor b = Tensor::empty({0, 5}, kF32, Device::cuda);
    const Tensor y = matmul(a, b);
    CHECK(y.device() == Device::cuda);
    CHECK(max_abs_diff(y, zeros({4, 5})) == 0);
    const Tensor bias = randn_seeded({5}, 21).to(Device::cuda);
    CHECK(max_abs_diff(linear(a, b.t(), bias), bias.expand({4, 5})) == 0);
    CHECK(
        matmul(Tensor::empty({0, 3}, kF32, Device::cuda), randn_seeded({3, 2}, 28).to(Device::cuda))
            .numel() == 0);
}

TEST_CASE("the tiled kernel matches cuBLAS and the cpu, 2-D and batched, f32 and f64") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        const double tol = dt == kF64 ? 1e-12 : 1e-4;
        for (auto [m, k, n] : {std::array<int64_t, 3>{M, K, N}, {1, 1, 1}, {33, 17, 16}}) {
            const Tensor a = randn_seeded({m, k}, 22, dt), b = randn_seeded({k, n}, 23, dt);
            const Tensor tiled = detail::matmul_tiled(a.to(Device::cuda), b.to(Device::cuda));
            CHECK(tiled.device() == Device::cuda);
            CHECK(max_abs_diff(tiled, matmul(a, b)) < tol);
            CHECK(max_abs_diff(tiled, matmul(a.to(Device::cuda), b.to(Device::cuda))) < tol);
        }
        // batched, with transposed views made contiguous on the way in
        const Tensor a = randn_seeded({3, K, M}, 24, dt), b = randn_seeded({3, K, N}, 25, dt);
        const Tensor tiled =
            detail::matmul_tiled(a.to(Device::cuda).transpose(1, 2), b.to(Device::cuda));
        CHECK(max_abs_diff(tiled, matmul(a.transpose(1, 2), b)) < tol);
    }
#ifdef QK_CUDA_EMULATION
    // the tiles' barriers: the same result in every run order
    const Tensor a = randn_seeded({M, K}, 26).to(Device::cuda);
    const Tensor b = randn_seeded({K, N}, 27).to(Device::cuda);
    const Tensor forward = detail::matmul_tiled(a, b);
    qk::test::RunOrderReset reset;
    for (auto order : {qk::emu::RunOrder::reverse, qk::emu::RunOrder::random}) {
        qk::emu::set_run_order(order, 99);
        CHECK(max_abs_diff(detail::matmul_tiled(a, b), forward) == 0);
    }
#endif
}

TEST_CASE("matmul_tiled and matmul refuse bad inputs with the shapes and devices") {
    if (!cuda_runnable()) return;
    const Tensor a = randn_seeded({4, 5}, 29), b = randn_seeded({5, 6}, 30);
    CHECK(throws_with([&] { (void)detail::matmul_tiled(a, b); }, {"matmul_tiled", "cpu"}));
    CHECK(throws_with([&] { (void)detail::matmul_tiled(a.to(Device::cuda), a.to(Device::cuda)); },
                      {"matmul_tiled", "[4, 5]"}));
    CHECK(throws_with([&] { (void)matmul(a.to(Device::cuda), b); },
                      {"matmul", "devices differ", "cuda", "cpu"}));
}
