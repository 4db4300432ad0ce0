// The `cuda_norm` suite: cuda/norm.cu against the cpu kernels of ops/norm.cpp — layer_norm,
// rms_norm (both rungs of its ladder: v1 one thread per row, v2 one warp per row) and lp_normalize
// (p = 1, 2, integer and fractional p), forward and backward with dweight/dbias, in float32 and
// float64, under every run order of the emulator. dweight/dbias come from a two-stage sum over
// rows (no atomics), so every output must be bit-identical across orders. Sizes are ragged
// (C = 37, 100, 259) and span several blocks (4 rows per block; parameter gradients in chunks of
// at least 32 rows, and one case with hundreds of chunks); float32 rows of up to 1,024 values are
// held in registers (cuda/norm_rows.h), float64 ones above 128 are not: both ladders run.
#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"

using namespace qk::test;
namespace cpu = qk::cpu;
namespace cuda = qk::cuda;

namespace {

struct Size {
    int64_t rows, C;
};
constexpr Size kSizes[] = {{10, 37}, {70, 100}, {7, 259}, {33, 64}};

// Compares `got` with `ref` and with the first order's result (bitwise), kept in `first`.
template <class T>
void check_output(const char* what, const std::vector<T>& got, const std::vector<T>& ref,
                  std::vector<T>& first) {
    CAPTURE(what);
    CHECK(max_rel_error(got, ref) <= tolerance<T>());
    if (first.empty())
        first = got;
    else
        CHECK(got == first);
}

template <class T>
void check_layer_norm(Size s, bool has_bias, uint64_t seed, double offset) {
    const auto [rows, C] = s;
    CAPTURE(rows);
    CAPTURE(C);
    CAPTURE(has_bias);
    auto x = random_values<T>(size_t(rows * C), seed, 2.0);
    for (auto& v : x) v += T(offset);  // a large mean: the two-pass variance must not cancel
    const auto w = random_values<T>(size_t(C), seed + 1), b = random_values<T>(size_t(C), seed + 2);
    const auto dy = random_values<T>(size_t(rows * C), seed + 3);
    const T eps = T(1e-5);
    std::vector<T> y_ref(rows * C), mean_ref(rows), rstd_ref(rows), dx_ref(rows * C), dw_ref(C),
        db_ref(C);
    cpu::layer_norm_forward(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), w.data(),
                            has_bias ? b.data() : nullptr, rows, C, eps);
    cpu::layer_norm_backward(dx_ref.data(), dw_ref.data(), has_bias ? db_ref.data() : nullptr,
                             dy.data(), x.data(), mean_ref.data(), rstd_ref.data(), w.data(), rows,
                             C);
    DeviceBuffer<T> d_x(x), d_w(w), d_b(b), d_dy(dy), d_mean_ref(mean_ref), d_rstd_ref(rstd_ref);
    DeviceBuffer<T> d_y(y_ref.size()), d_mean(mean_ref.size()), d_rstd(rstd_ref.size());
    DeviceBuffer<T> d_dx(dx_ref.size()), d_dw(dw_ref.size()), d_db(db_ref.size());
    std::vector<T> f_y, f_mean, f_rstd, f_dx, f_dw, f_db;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        const qk::NormRows x_rows = qk::NormRows::contiguous(rows, C);
        cuda::layer_norm_forward(d_y.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, x_rows, d_w.ptr,
                                 has_bias ? d_b.ptr : nullptr, rows, C, eps);
        // The backward reads the cpu's mean and rstd, so that it is tested on the same inputs.
        cuda::layer_norm_backward(d_dx.ptr, d_dw.ptr, has_bias ? d_db.ptr : nullptr, d_dy.ptr,
                                  d_x.ptr, x_rows, d_mean_ref.ptr, d_rstd_ref.ptr, d_w.ptr, rows,
                                  C);
        check_output("y", d_y.download(), y_ref, f_y);
        check_output("mean", d_mean.download(), mean_ref, f_mean);
        check_output("rstd", d_rstd.download(), rstd_ref, f_rstd);
        check_output("dx", d_dx.download(), dx_ref, f_dx);
        check_output("dweight", d_dw.download(), dw_ref, f_dw);
        if (has_bias) check_output("dbias", d_db.download(), db_ref, f_db);
    }
}

template <class T>
void check_rms_norm(Size s, bool has_weight, uint64_t seed) {
    const auto [rows, C] = s;
    CAPTURE(rows);
    CAPTURE(C);
    CAPTURE(has_weight);
    const auto x = random_values<T>(size_t(rows * C), seed, 3.0);
    const auto w = random_values<T>(size_t(C), seed + 1);
    const auto dy = random_values<T>(size_t(rows * C), seed + 2);
    const T eps = T(1e-6);
    const T* w_host = has_weight ? w.data() : nullptr;
    std::vector<T> y_ref(rows * C), rstd_ref(rows), dx_ref(rows * C), dw_ref(C);
    cpu::rms_norm_forward(y_ref.data(), rstd_ref.data(), x.data(), w_host, rows, C, eps);
    cpu::rms_norm_backward(dx_ref.data(), has_weight ? dw_ref.data() : nullptr, dy.data(), x.data(),
                           rstd_ref.data(), w_host, rows, C);
    DeviceBuffer<T> d_x(x), d_w(w), d_dy(dy), d_rstd_ref(rstd_ref);
    DeviceBuffer<T> d_y(y_ref.size()), d_rstd(rstd_ref.size()), d_dx(dx_ref.size());
    DeviceBuffer<T> d_dw(dw_ref.size());
    T* w_dev = has_weight ? d_w.ptr : nullptr;
    std::vector<T> f_y1, f_rstd1, f_y, f_rstd, f_dx, f_dw;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::rms_norm_forward_v1(d_y.ptr, d_rstd.ptr, d_x.ptr, w_dev, rows, C, eps);
        check_output("y (v1)", d_y.download(), y_ref, f_y1);
        check_output("rstd (v1)", d_rstd.download(), rstd_ref, f_rstd1);
        const qk::NormRows x_rows = qk::NormRows::contiguous(rows, C);
        cuda::rms_norm_forward(d_y.ptr, d_rstd.ptr, d_x.ptr, x_rows, w_dev, rows, C, eps);
        check_output("y (v2)", d_y.download(), y_ref, f_y);
        check_output("rstd (v2)", d_rstd.download(), rstd_ref, f_rstd);
        cuda::rms_norm_backward(d_dx.ptr, has_weight ? d_dw.ptr : nullptr, d_dy.ptr, d_x.ptr,
                                x_rows, d_rstd_ref.ptr, w_dev, rows, C);
        check_output("dx", d_dx.download(), dx_ref, f_dx);
        if (has_weight) check_output("dweight", d_dw.download(), dw_ref, f_dw);
    }
}

// x: (rows, C) given, so that special rows (all zero, tiny, huge) can be planted.
template <class T>
void check_lp_normalize(const std::vector<T>& x, Size s, double p, uint64_t seed) {
    const auto [rows, C] = s;
    CAPTURE(rows);
    CAPTURE(C);
    CAPTURE(p);
    const auto dy = random_values<T>(size_t(rows * C), seed);
    const T eps = T(1e-12);
    std::vector<T> y_ref(rows * C), n_ref(rows), dx_ref(rows * C);
    cpu::lp_normalize_forward(y_ref.data(), n_ref.data(), x.data(), rows, C, T(p), eps);
    cpu::lp_normalize_backward(dx_ref.data(), dy.data(), x.data(), n_ref.data(), rows, C, T(p),
                               eps);
    DeviceBuffer<T> d_x(x), d_dy(dy), d_n_ref(n_ref);
    DeviceBuffer<T> d_y(y_ref.size()), d_n(n_ref.size()), d_dx(dx_ref.size());
    std::vector<T> f_y, f_n, f_dx;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::lp_normalize_forward(d_y.ptr, d_n.ptr, d_x.ptr, rows, C, T(p), eps);
        cuda::lp_normalize_backward(d_dx.ptr, d_dy.ptr, d_x.ptr, d_n_ref.ptr, rows, C, T(p), eps);
        check_output("y", d_y.download(), y_ref, f_y);
        check_output("norm", d_n.download(), n_ref, f_n);
        check_output("dx", d_dx.download(), dx_ref, f_dx);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda layer_norm matches the cpu, forward and backward", T, float, double) {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 300;
    for (Size s : kSizes)
        for (bool has_bias : {true, false}) check_layer_norm<T>(s, has_bias, seed += 10, 0.0);
    check_layer_norm<T>({9, 100}, true, 7, 100.0);  // mean 100, std 2
}

TEST_CASE("cuda norms' parameter gradients over many row chunks") {
    if (!cuda_device_or_skip()) return;
    // 8,500 rows of 3 columns: one column tile wants 1,056 chunks, but none may be under 32 rows:
    // 258 chunks of 33 rows, the last one 14.
    check_layer_norm<float>({8500, 3}, true, 900, 0.0);
    // Heads of 64: dx and the parameter gradients from one kernel, 91 chunks of 33 rows (the last
    // 31), added up by the last block to arrive.
    check_layer_norm<float>({3001, 64}, true, 901, 0.0);
    check_rms_norm<float>({3001, 64}, true, 902);
    // float32 rows of 129 to 1,024 values, held one a warp (8, 24 and 32 values a lane): 2,200
    // rows of GPT-2's 768 in 275 chunks of 8 rows, whose last block adds 3 columns a thread; 600
    // rows of 1,000 (4 columns a thread) and 300 of 200 in chunks of 8.
    check_layer_norm<float>({2200, 768}, true, 903, 0.0);
    check_rms_norm<float>({600, 1000}, true, 904);
    check_rms_norm<float>({300, 200}, false, 905);
    check_layer_norm<float>({300, 200}, false, 906, 50.0);
}

TEST_CASE_TEMPLATE("cuda rms_norm v1 and v2 match the cpu, forward and backward", T, float,
                   double) {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 500;
    for (Size s : kSizes)
        for (bool has_weight : {true, false}) check_rms_norm<T>(s, has_weight, seed += 10);
}

TEST_CASE_TEMPLATE("cuda lp_normalize matches the cpu for p = 1, 2, 3, 2.5, 7", T, float, double) {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 700;
    for (Size s : kSizes)
        for (double p : {1.0, 2.0, 3.0, 2.5, 7.0}) {
            const auto x = random_values<T>(size_t(s.rows * s.C), seed += 10);
            check_lp_normalize<T>(x, s, p, seed + 1);
        }
}

TEST_CASE_TEMPLATE("cuda lp_normalize handles zero, tiny and huge rows like the cpu", T, float,
                   double) {
    if (!cuda_device_or_skip()) return;
    const Size s{9, 37};
    auto x = random_values<T>(size_t(s.rows * s.C), 42);
    for (int64_t c = 0; c < s.C; ++c) {
        x[0 * s.C + c] = 0;                  // all zero: n = 0 <= eps, clamped
        x[4 * s.C + c] *= T(1e-30);          // tiny: |x|^p would underflow without the scaling
        x[8 * s.C + c] *= T(1e15);           // huge: |x|^p would overflow without the scaling
        if (c % 3 == 0) x[5 * s.C + c] = 0;  // exact zeros: sign(0) = 0 at p = 1
    }
    for (double p : {1.0, 2.0, 4.0, 1.5}) check_lp_normalize<T>(x, s, p, 43);
}

// Op level: qk::layer_norm, qk::rms_norm, qk::lp_normalize on cuda tensors against the cpu,
// through autograd (gradients of x and of the parameters).
TEST_CASE("cuda layer_norm, rms_norm and lp_normalize ops match the cpu through autograd") {
    for (qk::DType dtype : {qk::kF32, qk::kF64}) {
        const qk::Tensor x = randn_seeded({5, 7, 37}, 61, dtype, 2.0);
        const qk::Tensor w = randn_seeded({37}, 62, dtype), b = randn_seeded({37}, 63, dtype);
        check_cuda_parity(
            "layer_norm",
            [](const Inputs& in) { return qk::layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b});
        check_cuda_parity(
            "layer_norm without bias",
            [](const Inputs& in) { return qk::layer_norm(in[0], in[1], qk::Tensor(), 1e-5); },
            {x, w});
        check_cuda_parity(
            "rms_norm", [](const Inputs& in) { return qk::rms_norm(in[0], in[1], 1e-6); }, {x, w});
        check_cuda_parity("rms_norm without weight",
                          [](const Inputs& in) { return qk::rms_norm(in[0], qk::Tensor(), 1e-6); },
                          {x});
        // Rows read where they lie: 2 of 4 heads of a (2, 9, 4, 37) tensor, as (B, H, T, D) (three
        // strides); and a permutation whose rows need four (made contiguous first).
        const qk::Tensor heads = randn_seeded({2, 9, 4, 37}, 64, dtype, 2.0);
        const auto per_head = [](const qk::Tensor& t) { return t.narrow(2, 1, 2).transpose(1, 2); };
        check_cuda_parity(
            "layer_norm of a head view",
            [&](const Inputs& in) { return qk::layer_norm(per_head(in[0]), in[1], in[2], 1e-5); },
            {heads, w, b});
        check_cuda_parity(
            "rms_norm of a head view",
            [&](const Inputs& in) { return qk::rms_norm(per_head(in[0]), in[1], 1e-6); },
            {heads, w});
        check_cuda_parity(
            "layer_norm of a permutation",
            [](const Inputs& in) {
                return qk::layer_norm(in[0].permute({3, 1, 0, 2, 4}), in[1], in[2], 1e-5);
            },
            {randn_seeded({2, 3, 4, 5, 37}, 65, dtype), w, b});
        for (double p : {1.0, 2.0, 3.0, 2.5}) {
            CAPTURE(p);
            check_cuda_parity("lp_normalize",
                              [p](const Inputs& in) { return qk::lp_normalize(in[0], p); }, {x});
            // Along dim 1: the op transposes, copies on the device, and transposes back.
            check_cuda_parity("lp_normalize along dim 1",
                              [p](const Inputs& in) { return qk::lp_normalize(in[0], p, 1); }, {x});
        }
    }
}

// The QK-norm before RoPE as one op: heads of 64 and 128 values turn in the kernels' own pass
// (forward, and dy's inverse in the backward, beside the parameter gradients), others (D = 6) by
// rope's kernel after the norm's.
TEST_CASE("cuda norms that rotate their output match the cpu through autograd") {
    for (qk::DType dtype : {qk::kF32, qk::kF64})
        for (int64_t D : {64, 128, 6}) {
            CAPTURE(D);
            // c_attn's output (B, T, H, D) read per head, (B, H, T, D): rows at three strides.
            const qk::Tensor by_time = randn_seeded({2, 9, 3, D}, 80 + D, dtype, 2.0);
            const qk::Tensor w = randn_seeded({D}, 81, dtype), b = randn_seeded({D}, 82, dtype);
            const qk::RopeTables cpu_tables = qk::rope_tables(9, D, 10000.0, dtype);
            const auto tables_on = [&](const qk::Tensor& x) {
                return qk::RopeTables{cpu_tables.cos.to(x.device()), cpu_tables.sin.to(x.device())};
            };
            check_cuda_parity("layer_norm, rotated",
                              [&](const Inputs& in) {
                                  return qk::layer_norm(in[0].transpose(1, 2), in[1], in[2], 1e-5,
                                                        qk::Precision::full, tables_on(in[0]));
                              },
                              {by_time, w, b});
            check_cuda_parity("rms_norm, rotated",
                              [&](const Inputs& in) {
                                  return qk::rms_norm(in[0].transpose(1, 2), in[1], 1e-6,
                                                      qk::Precision::full, tables_on(in[0]));
                              },
                              {by_time, w});
            check_cuda_parity("rms_norm without weight, rotated",
                              [&](const Inputs& in) {
                                  return qk::rms_norm(in[0].transpose(1, 2), qk::Tensor(), 1e-6,
                                                      qk::Precision::full, tables_on(in[0]));
                              },
                              {by_time});
        }
}

TEST_CASE("cuda norms round their output in the same pass when asked, no value changed") {
    if (!cuda_runnable()) return;
    const qk::Tensor x = randn_seeded({2, 37, 48}, 41).to(qk::Device::cuda);
    const qk::Tensor w = randn_seeded({48}, 42).to(qk::Device::cuda);
    const qk::Tensor b = randn_seeded({48}, 43).to(qk::Device::cuda);
    // A head view read in place (NormRows): rows at three strides.
    const qk::Tensor heads = x.view({2, 37, 4, 12}).transpose(1, 2);
    const qk::Tensor w_head = randn_seeded({12}, 44).to(qk::Device::cuda);
    for (qk::Precision precision : {qk::Precision::bf16, qk::Precision::fp16}) {
        CAPTURE(qk::precision_name(precision));
        const qk::DType half = precision == qk::Precision::bf16 ? qk::kBF16 : qk::kF16;
        const qk::Tensor ln = qk::layer_norm(x, w, b, 1e-5, precision);
        CHECK(max_abs_diff(ln, qk::layer_norm(x, w, b, 1e-5)) == 0);
        check_kept_rounding(ln, half);
        const qk::Tensor rms = qk::rms_norm(x, w, 1e-6, precision);
        CHECK(max_abs_diff(rms, qk::rms_norm(x, w, 1e-6)) == 0);
        check_kept_rounding(rms, half);
        const qk::Tensor rms_heads = qk::rms_norm(heads, w_head, 1e-6, precision);
        CHECK(max_abs_diff(rms_heads, qk::rms_norm(heads, w_head, 1e-6)) == 0);
        check_kept_rounding(rms_heads, half);
        // Rotated in the same pass (heads of 64): the copy is of the rotated values.
        const qk::Tensor h64 =
            randn_seeded({2, 37, 2, 64}, 45).to(qk::Device::cuda).transpose(1, 2);
        const qk::Tensor w64 = randn_seeded({64}, 46).to(qk::Device::cuda);
        const qk::RopeTables t = qk::rope_tables(37, 64, 10000.0, qk::kF32, qk::Device::cuda);
        const qk::Tensor turned = qk::layer_norm(h64, w64, {}, 1e-5, precision, t);
        CHECK(max_abs_diff(turned, qk::layer_norm(h64, w64, {}, 1e-5, qk::Precision::full, t)) ==
              0);
        check_kept_rounding(turned, half);
        // On the cpu nothing is written beside the output.
        const qk::Tensor cpu_ln =
            qk::layer_norm(x.to(qk::Device::cpu), w.to(qk::Device::cpu), {}, 1e-5, precision);
        CHECK_FALSE(qk::has_kept_cast(cpu_ln, half));
    }
}

TEST_CASE("cuda norms after a residual add add their dx into the residual's gradient in the pass") {
    if (!cuda_runnable()) return;
    // s feeds a residual path and a norm, as a block's stream does: the norm's backward kernel
    // adds dx into the gradient the engine holds for s (no separate addition launched), and the
    // gradients equal, bit for bit, those of the plain path (a clone between s and the norm).
    // Rows of 64 (four a warp), 200 (one a warp, float32) and 300 in float64 (the loops).
    for (auto [C, dtype] : {std::pair{int64_t(64), qk::kF32}, std::pair{int64_t(200), qk::kF32},
                            std::pair{int64_t(300), qk::kF64}})
        for (bool rms : {false, true}) {
            CAPTURE(C);
            CAPTURE(rms);
            const qk::Tensor a = randn_seeded({3, 37, C}, 71, dtype).to(qk::Device::cuda),
                             g = randn_seeded({C}, 72, dtype).to(qk::Device::cuda),
                             b = randn_seeded({C}, 73, dtype).to(qk::Device::cuda),
                             w = randn_seeded({C, C}, 74, dtype, 0.1).to(qk::Device::cuda),
                             r = randn_seeded({3, 37, C}, 75, dtype).to(qk::Device::cuda);
            auto gradients = [&](bool junction, int64_t& additions) {
                qk::Tensor a2 = a.clone().requires_grad_(), g2 = g.clone().requires_grad_();
                const qk::Tensor s = a2 * 2.0;
                const qk::Tensor in = junction ? s : s.clone();
                const qk::Tensor n = rms ? qk::rms_norm(in, g2) : qk::layer_norm(in, g2, b);
                const qk::Tensor loss = qk::sum((s + qk::linear(n, w)) * r);
                additions = 0;
                for (const auto& e : launches_of([&] { loss.backward(); }))
                    additions += e.name.find("accumulate_kernel") != std::string::npos;
                return std::pair{a2.grad().to(qk::Device::cpu).to(qk::kF64).to_vector<double>(),
                                 g2.grad().to(qk::Device::cpu).to(qk::kF64).to_vector<double>()};
            };
            int64_t added_apart = 0, added_plain = 0;
            const auto [da, dg] = gradients(true, added_apart);
            const auto [da_plain, dg_plain] = gradients(false, added_plain);
            CHECK(da == da_plain);
            CHECK(dg == dg_plain);
            CHECK(added_apart == 0);
            CHECK(added_plain == 1);
        }
}

TEST_CASE("cuda norms make the residual add before them in their forward pass") {
    if (!cuda_runnable()) return;
    // add_layer_norm / add_rms_norm against the two ops: the sum, the normed rows, their kept
    // rounding and the gradients of x, delta and the gains, bit for bit, with the sum read on (a
    // residual stream) and the normed rows read by a Linear; no add kernel where the norm adds.
    // Rows of 64 (four a warp), 200 and 1,000 (one a warp); 1,100 (the loops: the two ops).
    for (int64_t C : {64, 200, 1000, 1100})
        for (bool rms : {false, true}) {
            CAPTURE(C);
            CAPTURE(rms);
            const qk::Device dev = qk::Device::cuda;
            const qk::Tensor x0 = randn_seeded({2, 19, C}, 81, qk::kF32).to(dev),
                             d0 = randn_seeded({2, 19, C}, 82, qk::kF32).to(dev),
                             g0 = randn_seeded({C}, 83, qk::kF32).to(dev),
                             b0 = randn_seeded({C}, 84, qk::kF32).to(dev),
                             w = randn_seeded({24, C}, 85, qk::kF32, 0.1).to(dev),
                             r = randn_seeded({2, 19, C}, 86, qk::kF32).to(dev),
                             r_out = randn_seeded({2, 19, 24}, 94, qk::kF32).to(dev);
            struct Run {
                qk::Tensor sum, normed, rounded, dx, dd, dg, db;
                int64_t add_launches = 0;
            };
            auto run = [&](bool fused) {
                qk::Tensor x = x0.clone().requires_grad_(), d = d0.clone().requires_grad_(),
                           g = g0.clone().requires_grad_(), b = b0.clone().requires_grad_();
                Run out;
                for (const auto& e : launches_of([&] {
                         const qk::Precision p = qk::Precision::bf16;
                         qk::SumAndNorm sn;
                         if (fused)
                             sn = rms ? qk::add_rms_norm(x, d, g, 1e-6, p)
                                      : qk::add_layer_norm(x, d, g, b, 1e-5, p);
                         else
                             sn.sum = x + d,
                             sn.normed = rms ? qk::rms_norm(sn.sum, g, 1e-6, p)
                                             : qk::layer_norm(sn.sum, g, b, 1e-5, p);
                         out.sum = sn.sum, out.normed = sn.normed;
                     }))
                    out.add_launches += e.name.find("binary_forward") != std::string::npos;
                out.rounded = qk::cast_once(out.normed, qk::kBF16).to(qk::kF32);
                const qk::Tensor loss =
                    qk::sum(out.sum * r) +
                    qk::sum(qk::linear(out.normed, w, {}, qk::Precision::bf16) * r_out);
                loss.backward();
                out.dx = x.grad(), out.dd = d.grad(), out.dg = g.grad();
                if (!rms) out.db = b.grad();
                return out;
            };
            const Run fused = run(true), two_ops = run(false);
            CHECK(max_abs_diff(fused.sum, two_ops.sum) == 0);
            CHECK(max_abs_diff(fused.normed, two_ops.normed) == 0);
            CHECK(max_abs_diff(fused.rounded, two_ops.rounded) == 0);
            CHECK(max_abs_diff(fused.dx, two_ops.dx) == 0);
            CHECK(max_abs_diff(fused.dd, two_ops.dd) == 0);
            CHECK(max_abs_diff(fused.dg, two_ops.dg) == 0);
            if (!rms) CHECK(max_abs_diff(fused.db, two_ops.db) == 0);
            CHECK(two_ops.add_launches == 1);
            CHECK(fused.add_launches == (C <= 1024 ? 0 : 1));
        }
    // Against the cpu (the two ops there), and a float64 gradcheck of what it stands for.
    check_cuda_parity(
        "add_layer_norm",
        [](const Inputs& in) {
            const qk::SumAndNorm sn = qk::add_layer_norm(in[0], in[1], in[2], in[3]);
            return sn.sum * 0.5 + sn.normed;
        },
        {randn_seeded({3, 11, 200}, 87, qk::kF32), randn_seeded({3, 11, 200}, 88, qk::kF32),
         randn_seeded({200}, 89, qk::kF32), randn_seeded({200}, 90, qk::kF32)});
    qk::Tensor x = randn_seeded({3, 6}, 91, qk::kF64).requires_grad_(),
               d = randn_seeded({3, 6}, 92, qk::kF64).requires_grad_(),
               g = randn_seeded({6}, 93, qk::kF64).requires_grad_();
    CHECK(qk::gradcheck(
        [&] {
            const qk::SumAndNorm sn = qk::add_rms_norm(x, d, g);
            return sn.sum * 0.5 + sn.normed;
        },
        {x, d, g}));
}

TEST_CASE("add_layer_norm: non-contiguous inputs, a constant delta, and no gradient recorded") {
    if (!cuda_runnable()) return;
    const qk::Device dev = qk::Device::cuda;
    const qk::Tensor x = randn_seeded({40, 3, 96}, 104, qk::kF32).to(dev).transpose(0, 1),
                     d = randn_seeded({3, 40, 96}, 105, qk::kF32).to(dev),
                     g = randn_seeded({96}, 106, qk::kF32).to(dev);
    REQUIRE_FALSE(x.is_contiguous());
    const qk::Tensor sum = x + d, normed = qk::layer_norm(sum, g, {});
    {
        qk::NoGradGuard no_grad;
        const qk::SumAndNorm sn = qk::add_layer_norm(x, d, g, {});
        CHECK(max_abs_diff(sn.sum, sum) == 0);
        CHECK(max_abs_diff(sn.normed, normed) == 0);
        CHECK_FALSE(sn.normed.requires_grad());
    }
    qk::Tensor xg = x.detach().requires_grad_();  // delta a constant: x's gradient only
    const qk::SumAndNorm sn = qk::add_layer_norm(xg, d, g, {});
    qk::sum(sn.normed * d).backward();
    qk::Tensor xr = x.detach().requires_grad_();
    qk::sum(qk::layer_norm(xr + d, g, {}) * d).backward();
    CHECK(max_abs_diff(xg.grad(), xr.grad()) == 0);
}
