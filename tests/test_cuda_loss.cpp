// The `cuda_loss` suite: cuda/loss.cu (cross-entropy) against the cpu kernels of ops/loss.cpp,
// forward (per-row lse and the mean loss) and backward (softmax − onehot, scaled), in float32 and
// float64, under every run order of the emulator (bit-identical across orders), with ragged
// vocabularies (V = 37, 100, 259 > the 256-thread block), ignored rows, targets at the row ends
// and logits of 1e4.
#include <limits>

#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"

using namespace qk::test;
namespace cpu = qk::cpu;
namespace cuda = qk::cuda;

namespace {

// Checks forward and backward on logits x (N, V) and targets t (N). dloss: the upstream scalar.
// x_ld > V: the kernels read the rows x_ld apart from a wider buffer whose other columns are NaN
// (a read of them would show).
template <class T>
void check_cross_entropy(const std::vector<T>& x_rows, const std::vector<int32_t>& t, int64_t V,
                         int32_t ignore_index, T dloss, int64_t x_ld = 0) {
    const int64_t N = int64_t(t.size());
    if (x_ld == 0) x_ld = V;
    std::vector<T> x(size_t(N * x_ld), std::numeric_limits<T>::quiet_NaN());
    for (int64_t i = 0; i < N; ++i) std::copy_n(x_rows.begin() + i * V, V, x.begin() + i * x_ld);
    int64_t n_valid = 0;
    for (int32_t ti : t) n_valid += ti != ignore_index;
    REQUIRE(n_valid > 0);
    CAPTURE(N);
    CAPTURE(V);
    CAPTURE(x_ld);
    std::vector<T> lse_ref(N), dx_ref(N * V);
    const double total =
        cpu::cross_entropy_forward(lse_ref.data(), x.data(), t.data(), N, V, ignore_index, x_ld);
    const T loss_ref = T(total / double(n_valid));
    const T scale = T(double(dloss) / double(n_valid));
    cpu::cross_entropy_backward(dx_ref.data(), x.data(), t.data(), lse_ref.data(), N, V,
                                ignore_index, scale, x_ld);
    REQUIRE(std::isfinite(total));

    DeviceBuffer<T> d_x(x), d_lse(static_cast<size_t>(N)), d_loss(static_cast<size_t>(1));
    DeviceBuffer<T> d_dx(static_cast<size_t>(N * V)), d_dloss(std::vector<T>{dloss});
    DeviceBuffer<T> d_lse_ref(lse_ref);  // the backward reads the cpu's lse: the same inputs
    DeviceBuffer<int32_t> d_t(t);
    std::vector<T> loss_first, lse_first, dx_first;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::cross_entropy_forward(d_loss.ptr, d_lse.ptr, d_x.ptr, d_t.ptr, N, V, ignore_index,
                                    n_valid, x_ld);
        cuda::cross_entropy_backward(d_dx.ptr, d_x.ptr, d_t.ptr, d_lse_ref.ptr, d_dloss.ptr, N, V,
                                     ignore_index, n_valid, x_ld);
        const auto loss = d_loss.download(), lse = d_lse.download(), dx = d_dx.download();
        CHECK(std::isfinite(loss[0]));
        CHECK(max_rel_error(loss, std::vector<T>{loss_ref}) <= tolerance<T>());
        CHECK(max_rel_error(lse, lse_ref) <= tolerance<T>());
        CHECK(max_rel_error(dx, dx_ref) <= tolerance<T>());
        if (loss_first.empty()) {
            loss_first = loss, lse_first = lse, dx_first = dx;
        } else {  // fixed reduction trees: the same bits whatever order the threads ran in
            CHECK(loss == loss_first);
            CHECK(lse == lse_first);
            CHECK(dx == dx_first);
        }
    }
}

// N targets in [0, V): row i gets 0, V − 1, or a pseudo-random class, in turn, so that the row
// ends are always covered.
std::vector<int32_t> targets(int64_t N, int64_t V, uint64_t seed) {
    qk::Generator gen(seed);
    std::vector<int32_t> t(N);
    for (int64_t i = 0; i < N; ++i)
        t[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? int32_t(V - 1) : int32_t(gen.uniform() * double(V));
    return t;
}

}  // namespace

TEST_CASE_TEMPLATE("cuda cross_entropy matches the cpu on ragged vocabularies", T, float, double) {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 40;
    for (int64_t V : {37, 100, 259, 600})
        for (int64_t N : {5, 13}) {
            const auto x = random_values<T>(size_t(N * V), ++seed, 3.0);
            check_cross_entropy<T>(x, targets(N, V, seed), V, -1, T(1));
            check_cross_entropy<T>(x, targets(N, V, seed), V, -1, T(0.37));       // dL != 1
            check_cross_entropy<T>(x, targets(N, V, seed), V, -1, T(1), V + 27);  // wider rows
        }
}

TEST_CASE_TEMPLATE("cuda cross_entropy skips ignored rows", T, float, double) {
    if (!cuda_device_or_skip()) return;
    const int64_t N = 9, V = 100;
    const auto x = random_values<T>(size_t(N * V), 77, 2.0);
    auto t = targets(N, V, 5);
    t[0] = t[4] = t[8] = -100;  // ignored, including the first and the last row
    check_cross_entropy<T>(x, t, V, -100, T(1));
    // An ignore_index that is a real class: rows with target 0 are skipped.
    check_cross_entropy<T>(x, targets(N, V, 6), V, 0, T(1));
}

TEST_CASE_TEMPLATE("cuda cross_entropy stays finite on logits of 1e4", T, float, double) {
    if (!cuda_device_or_skip()) return;
    const int64_t N = 6, V = 259;
    const auto x = random_values<T>(size_t(N * V), 11, 1e4);
    check_cross_entropy<T>(x, targets(N, V, 12), V, -1, T(1));
    // Every row's target is its largest logit: a loss near 0, not a cancellation to garbage.
    std::vector<int32_t> t(N);
    for (int64_t i = 0; i < N; ++i)
        t[i] = int32_t(std::max_element(x.begin() + i * V, x.begin() + (i + 1) * V) -
                       (x.begin() + i * V));
    check_cross_entropy<T>(x, t, V, -1, T(1));
}

// Op level: qk::cross_entropy on cuda logits and targets against the cpu, through autograd.
TEST_CASE("cuda cross_entropy op matches the cpu through autograd") {
    for (qk::DType dtype : {qk::kF32, qk::kF64}) {
        const int64_t N = 13, V = 259;
        const qk::Tensor x = randn_seeded({N, V}, 31, dtype, 3.0);
        const qk::Tensor t = qk::from_ids(targets(N, V, 32));
        check_cuda_parity("cross_entropy",
                          [](const Inputs& in) { return qk::cross_entropy(in[0], in[1]); }, {x, t});
        auto t_ignored = targets(N, V, 33);
        t_ignored[0] = t_ignored[7] = t_ignored[12] = -1;
        check_cuda_parity("cross_entropy with ignored rows",
                          [](const Inputs& in) { return qk::cross_entropy(in[0], in[1], -1); },
                          {x, qk::from_ids(t_ignored)});
        // Rows of a wider buffer (a padded head's logits), read in place.
        check_cuda_parity(
            "cross_entropy on a narrowed view",
            [V](const Inputs& in) { return qk::cross_entropy(in[0].narrow(1, 0, V), in[1]); },
            {randn_seeded({N, V + 13}, 36, dtype, 3.0), t});
        // Huge logits: the loss and its gradient stay finite.
        check_cuda_parity("cross_entropy on logits of 1e4",
                          [](const Inputs& in) { return qk::cross_entropy(in[0], in[1]); },
                          {randn_seeded({N, V}, 34, dtype, 1e4), t});
    }
}

TEST_CASE("cuda cross_entropy op rejects bad targets before any kernel runs") {
    if (!cuda_device_or_skip()) return;
    const qk::Tensor x = randn_seeded({4, 37}, 35, qk::kF32).to(qk::Device::cuda);
    CHECK(throws_with(
        [&] {
            qk::cross_entropy(x, qk::from_ids({0, 37, 1, 2}).to(qk::Device::cuda));
        },
        {"cross_entropy", "target 37 at row 1", "[0, 37)"}));
    CHECK(throws_with(
        [&] {
            qk::cross_entropy(x, qk::from_ids({-1, -1, -1, -1}).to(qk::Device::cuda));
        },
        {"cross_entropy", "all 4 targets equal ignore_index -1"}));
    CHECK(throws_with(
        [&] {
            qk::cross_entropy(x, qk::from_ids({0, 1, 2, 3}));
        },
        {"cross_entropy", "logits [4, 37] are on cuda", "targets [4] on cpu"}));
}

TEST_CASE("cuda cross_entropy rounds the logits' gradient in its backward pass when asked") {
    if (!cuda_runnable()) return;
    // 7 rows of 53 logits, row 3 ignored: its gradient (and the rounding) is 0.
    qk::Tensor logits = randn_seeded({7, 53}, 61, qk::kF32, 3.0).to(qk::Device::cuda);
    std::vector<int32_t> ids = {4, 0, 52, -1, 17, 9, 33};
    const qk::Tensor targets = qk::from_ids(ids, {7}).to(qk::Device::cuda);
    for (qk::Precision precision : {qk::Precision::bf16, qk::Precision::fp16}) {
        CAPTURE(qk::precision_name(precision));
        const qk::DType half = precision == qk::Precision::bf16 ? qk::kBF16 : qk::kF16;
        qk::Tensor x = logits.detach().requires_grad_();
        const qk::Tensor loss = qk::cross_entropy(x, targets, -1, precision);
        qk::Tensor x_plain = logits.detach().requires_grad_();
        const qk::Tensor loss_plain = qk::cross_entropy(x_plain, targets);
        CHECK(max_abs_diff(loss, loss_plain) == 0);
        (loss * 3.0).backward();
        (loss_plain * 3.0).backward();
        CHECK(max_abs_diff(x.grad(), x_plain.grad()) == 0);
        check_kept_rounding(x.grad(), half);  // the leaf keeps the gradient the loss wrote
        // The kernel's rounding, beside the gradient it wrote, ignored row included.
        qk::Tensor dx = qk::Tensor::empty({7, 53}, qk::kF32, qk::Device::cuda);
        qk::Tensor dx_half = qk::Tensor::empty({7, 53}, half, qk::Device::cuda);
        const qk::Tensor lse = qk::logsumexp(logits, {-1});
        const qk::Tensor dloss = qk::full({}, 0.5, qk::kF32, qk::Device::cuda);
        qk::cuda::cross_entropy_backward(
            dx.data<float>(), logits.data<float>(), targets.data<int32_t>(), lse.data<float>(),
            dloss.data<float>(), 7, 53, -1, 6, 53, static_cast<uint16_t*>(dx_half.raw_data()),
            half == qk::kBF16);
        CHECK(max_abs_diff(dx_half.to(qk::kF32), dx.to(half).to(qk::kF32)) == 0);
        CHECK(max_abs_diff(dx.narrow(0, 3, 1), qk::zeros({1, 53})) == 0);
    }
}

namespace {

struct HeadRun {
    qk::Tensor loss, logits, dx, dw;
    std::vector<std::string> forward_launches, backward_launches;
};

// The head and its loss on x (R, K), w (N, K), t (R), the backward given `upstream` (the loss
// times it): fused, linear_cross_entropy announcing `announced`; else the two ops. poison: the
// logits are overwritten with NaN between forward and backward (the fused backward must not read
// them when the announcement was right).
HeadRun run_head(bool fused, const qk::Tensor& x0, const qk::Tensor& w0, const qk::Tensor& t,
                 qk::Precision p, double announced, double upstream, bool poison = false) {
    qk::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    HeadRun run;
    qk::cuda::ledger::open();
    if (fused) {
        const qk::LinearCrossEntropy out = qk::linear_cross_entropy(x, w, t, p, -1, announced);
        run.loss = out.loss, run.logits = out.logits.clone();
        if (poison)
            qk::copy_into(out.logits,
                          qk::full({}, NAN, qk::kF32, x0.device()).expand(out.logits.shape()));
    } else {
        const qk::Tensor logits = qk::linear(x, w, {}, p);
        run.loss = qk::cross_entropy(logits, t, -1, p), run.logits = logits.detach().clone();
    }
    for (const auto& e : qk::cuda::ledger::close()) run.forward_launches.push_back(e.name);
    qk::cuda::ledger::open();
    (upstream == 1.0 ? run.loss : run.loss * upstream).backward();
    for (const auto& e : qk::cuda::ledger::close()) run.backward_launches.push_back(e.name);
    run.dx = x.grad(), run.dw = w.grad();
    return run;
}

bool contains(const std::vector<std::string>& names, const std::string& part) {
    for (const std::string& name : names)
        if (name.find(part) != std::string::npos) return true;
    return false;
}

}  // namespace

TEST_CASE("linear_cross_entropy on cuda: the two ops' bits, the gradient written in the forward") {
    if (!cuda_runnable()) return;
    const qk::Device dev = qk::Device::cuda;
    // 1,024 rows of 37 classes: a padded head (G̃ 64 wide); 150 rows of 53 and of 48: not padded.
    struct Shape3 {
        int64_t R, N, K;
    };
    for (const Shape3 s : {Shape3{1024, 37, 32}, Shape3{150, 53, 40}, Shape3{150, 48, 40}}) {
        CAPTURE(s.R);
        CAPTURE(s.N);
        const qk::Tensor x = randn_seeded({s.R, s.K}, 91, qk::kF32).to(dev),
                         w = randn_seeded({s.N, s.K}, 92, qk::kF32, 0.3).to(dev);
        auto ids = targets(s.R, s.N, 93);
        ids[1] = ids[s.R - 2] = -1;  // ignored rows: a zero gradient row
        const qk::Tensor t = qk::from_ids(ids, {s.R}).to(dev);
        // The padded shape (260k emulated threads a launch) with fewer combinations.
        const bool padded = s.R == 1024;
        std::vector<qk::Precision> precisions = {qk::Precision::bf16};
        if (!padded) precisions.push_back(qk::Precision::fp16);
        std::vector<std::pair<double, double>> upstreams = {{1, 1}, {1, 3}};
        if (!padded) upstreams.insert(upstreams.end(), {{0.25, 0.25}, {1.0 / 3, 1.0 / 3}});
        for (qk::Precision p : precisions)
            for (const auto& [announced, upstream] : upstreams) {
                CAPTURE(qk::precision_name(p));
                CAPTURE(announced);
                CAPTURE(upstream);
                const HeadRun fused = run_head(true, x, w, t, p, announced, upstream),
                              two_ops = run_head(false, x, w, t, p, announced, upstream);
                CHECK(max_abs_diff(fused.loss, two_ops.loss) == 0);
                CHECK(max_abs_diff(fused.logits, two_ops.logits) == 0);
                CHECK(max_abs_diff(fused.dx, two_ops.dx) == 0);
                CHECK(max_abs_diff(fused.dw, two_ops.dw) == 0);
                INFO(fmt::format("forward: {}", fmt::join(fused.forward_launches, ", ")));
                INFO(fmt::format("backward: {}", fmt::join(fused.backward_launches, ", ")));
                // The loss's kernel writes the gradient; the backward reads no logits: the fixup
                // and the two GEMMs, no copy (padded or not).
                CHECK(contains(fused.forward_launches, "cross_entropy_forward_gradient_kernel"));
                CHECK_FALSE(contains(fused.backward_launches, "cross_entropy_backward_kernel"));
                CHECK_FALSE(contains(fused.backward_launches, "copy"));
                const auto& after = fused.backward_launches;  // from the fixup on
                const auto fixup = std::find_if(after.begin(), after.end(), [](const auto& name) {
                    return name.find("gradient_fixup") != std::string::npos;
                });
                CHECK(after.end() - fixup == 3);
                if (announced == upstream) {  // no read of the logits in the backward
                    const HeadRun poisoned = run_head(true, x, w, t, p, announced, upstream, true);
                    CHECK(max_abs_diff(poisoned.dx, two_ops.dx) == 0);
                    CHECK(max_abs_diff(poisoned.dw, two_ops.dw) == 0);
                }
            }
    }
}

TEST_CASE("linear_cross_entropy: the cpu, float64 and full precision run the two ops") {
    // Against the cpu through autograd (the cpu runs linear and cross_entropy).
    qk::test::ParityOptions options;
    options.atol_f32 = 2e-5, options.rtol_f32 = 2e-4;
    check_cuda_parity(
        "bf16 linear_cross_entropy",
        [](const Inputs& in) {
            return qk::linear_cross_entropy(in[0], in[1], in[2], qk::Precision::bf16).loss;
        },
        {randn_seeded({40, 24}, 94, qk::kF32), randn_seeded({29, 24}, 95, qk::kF32, 0.3),
         qk::from_ids(targets(40, 29, 96))},
        options);
    // float64 gradcheck of the composition it stands for (the loss is a scalar: the probe is a
    // scale).
    qk::Tensor x = randn_seeded({6, 5}, 97, qk::kF64).requires_grad_(),
               w = randn_seeded({7, 5}, 98, qk::kF64).requires_grad_();
    const qk::Tensor t = qk::from_ids(targets(6, 7, 99));
    CHECK(qk::gradcheck(
        [&] { return qk::linear_cross_entropy(x, w, t, qk::Precision::full).loss * 1.7; }, {x, w}));
    // Bad input names the op and what it got.
    CHECK(throws_with(
        [&] {
            qk::linear_cross_entropy(x.reshape({2, 3, 5}), w, t, qk::Precision::full);
        },
        {"linear_cross_entropy", "(N, K)", "[2, 3, 5]"}));
    CHECK(throws_with([&] { qk::linear_cross_entropy(x, w, t, qk::Precision::full, -1, NAN); },
                      {"linear_cross_entropy", "loss_gradient must be finite"}));
    CHECK(throws_with([&] { qk::linear_cross_entropy(x, w.t(), t, qk::Precision::full); },
                      {"linear", "expected weight (out_features, 5)"}));
}

TEST_CASE("linear_cross_entropy: a second backward (retain_graph) uses what the first wrote") {
    if (!cuda_runnable()) return;
    // The first backward's upstream gradient (3) is not the announced one (1): the fixup rewrites
    // the gradient for 3. A second backward with 1 must then rewrite it again, not trust the
    // announcement; and a third with 1 finds it right.
    const qk::Device dev = qk::Device::cuda;
    const qk::Tensor x0 = randn_seeded({150, 40}, 101, qk::kF32).to(dev),
                     w0 = randn_seeded({53, 40}, 102, qk::kF32, 0.3).to(dev),
                     t = qk::from_ids(targets(150, 53, 103), {150}).to(dev);
    const HeadRun once = run_head(false, x0, w0, t, qk::Precision::bf16, 1, 1),
                  thrice = run_head(false, x0, w0, t, qk::Precision::bf16, 1, 3);
    qk::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const qk::LinearCrossEntropy out = qk::linear_cross_entropy(x, w, t, qk::Precision::bf16);
    (out.loss * 3.0).backward(true);
    CHECK(max_abs_diff(x.grad(), thrice.dx) == 0);
    for (int pass = 0; pass < 2; ++pass) {
        CAPTURE(pass);
        x.zero_grad(), w.zero_grad();
        out.loss.backward(true);
        CHECK(max_abs_diff(x.grad(), once.dx) == 0);
        CHECK(max_abs_diff(w.grad(), once.dw) == 0);
    }
}

TEST_CASE("linear_cross_entropy with a z-loss: the model's composition, within float32 rounding") {
    if (!cuda_runnable()) return;
    // loss = cross_entropy + z · mean_N(lse²) over every row, ignored ones too. The cross-entropy
    // alone is the plain kernel's to the bit; the total sums in double where the ops add floats
    // (a few float32 ulps); the gradient's float32 values differ by as little, so a value of G̃
    // near a rounding boundary may round one bf16 ulp (2⁻⁸ relative) the other way: dx and dW
    // within 2⁻⁸ of their largest value. Announced right (no read of the poisoned logits) and
    // wrong (the fixup).
    const qk::Device dev = qk::Device::cuda;
    const double z = 0.05;
    const qk::Tensor x0 = randn_seeded({150, 40}, 111, qk::kF32).to(dev),
                     w0 = randn_seeded({53, 40}, 112, qk::kF32, 0.3).to(dev);
    auto ids = targets(150, 53, 113);
    ids[4] = ids[77] = -1;
    const qk::Tensor t = qk::from_ids(ids, {150}).to(dev);
    qk::Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
    const qk::Tensor logits = qk::linear(xr, wr, {}, qk::Precision::bf16);
    const qk::Tensor ce_ref = qk::cross_entropy(logits, t);
    const qk::Tensor lse = qk::logsumexp(logits, {-1});
    const qk::Tensor loss_ref = ce_ref + qk::mean(lse * lse) * z;
    (loss_ref * 2.0).backward();
    for (const auto& [announced, poison] : {std::pair{2.0, true}, std::pair{1.0, false}}) {
        CAPTURE(announced);
        qk::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
        const qk::LinearCrossEntropy out =
            qk::linear_cross_entropy(x, w, t, qk::Precision::bf16, -1, announced, z);
        CHECK(max_abs_diff(out.cross_entropy, ce_ref) == 0);
        CHECK(relative_error(out.loss, loss_ref) < 1e-6);
        CHECK(out.loss.item() > out.cross_entropy.item());
        if (poison)
            qk::copy_into(out.logits, qk::full({}, NAN, qk::kF32, dev).expand(out.logits.shape()));
        (out.loss * 2.0).backward();
        CHECK(relative_error(x.grad(), xr.grad()) < 0.0039);
        CHECK(relative_error(w.grad(), wr.grad()) < 0.0039);
    }
}
