// Elementwise ops on cuda (cuda/elementwise.cu) against the cpu, forward and backward, float32 and
// float64, under every run order of the emulator: binary arithmetic with broadcasting (whose
// backward sums over the broadcast dims with the reduction kernels), strided inputs, every unary
// op and scalar form, and the in-place add_ behind gradient accumulation.
#include "cuda_parity.h"
#include "ops/glu.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::max_abs_diff;
using qk::test::randn_seeded;
using qk::test::throws_with;

namespace {

// Values in ±[0.5, 2]: a divisor (and the gradient of div, −dy·a/b²) far from 0.
Tensor away_from_zero(const Shape& shape, uint64_t seed, DType dt) {
    Generator gen(seed);
    const Tensor u = uniform(shape, 0.5, 2.0, kF64, gen);
    std::vector<double> v = u.to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i)
        if (i % 3 == 1) v[i] = -v[i];
    return from_vector(v, shape, dt);
}

// Positive values in [0.2, 3], for log, sqrt, rsqrt, pow and rdiv.
Tensor positive(const Shape& shape, uint64_t seed, DType dt) {
    Generator gen(seed);
    return uniform(shape, 0.2, 3.0, dt, gen);
}

struct BinaryCase {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
};
const BinaryCase kBinary[] = {{"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};

// (a shape, b shape): same shape, a bias row, a column, a scalar-like, both sides broadcast, and
// a rank difference; each broadcast size is ragged and spans several blocks.
const std::pair<Shape, Shape> kShapes[] = {
    {{3, 37, 45}, {3, 37, 45}}, {{3, 37, 45}, {45}},   {{3, 37, 45}, {37, 1}},
    {{3, 37, 45}, {1}},         {{3, 1, 45}, {37, 1}}, {{45}, {2, 37, 45}},
};

}  // namespace

TEST_CASE("binary ops with broadcasting: cuda matches the cpu, values and both gradients") {
    for (DType dt : {kF32, kF64})
        for (const auto& c : kBinary)
            for (const auto& [sa, sb] : kShapes) {
                const bool is_div = std::string(c.name) == "div";
                check_cuda_parity(fmt::format("{} {} {} {}", c.name, dtype_name(dt), sa, sb),
                                  [op = c.op](const Inputs& in) { return op(in[0], in[1]); },
                                  {randn_seeded(sa, 1, dt),
                                   is_div ? away_from_zero(sb, 2, dt) : randn_seeded(sb, 2, dt)});
            }
}

TEST_CASE("binary ops read strided inputs (transposed, narrowed, expanded) on cuda") {
    for (DType dt : {kF32, kF64}) {
        check_cuda_parity("mul of transposes",
                          [](const Inputs& in) { return in[0].t() * in[1].narrow(1, 3, 41); },
                          {randn_seeded({41, 37}, 3, dt), randn_seeded({37, 50}, 4, dt)});
        check_cuda_parity("sub of a permuted and an expanded",
                          [](const Inputs& in) {
                              return in[0].permute({2, 0, 1}) -
                                     in[1].expand({5, 33, 7}).permute({1, 2, 0}).permute({2, 0, 1});
                          },
                          {randn_seeded({33, 7, 5}, 5, dt), randn_seeded({1, 33, 7}, 6, dt)});
    }
}

TEST_CASE("unary ops and scalar forms: cuda matches the cpu, forward and backward") {
    struct UnaryCase {
        const char* name;
        std::function<Tensor(const Tensor&)> f;
        bool positive_only;
    };
    const std::vector<UnaryCase> cases = {
        {"neg", [](const Tensor& x) { return -x; }, false},
        {"add scalar", [](const Tensor& x) { return x + 1.75; }, false},
        {"mul scalar", [](const Tensor& x) { return x * -0.3; }, false},
        {"rsub scalar", [](const Tensor& x) { return 2.0 - x; }, false},
        {"rdiv scalar", [](const Tensor& x) { return 1.5 / x; }, true},
        {"pow", [](const Tensor& x) { return pow(x, 1.7); }, true},
        {"exp", [](const Tensor& x) { return exp(x); }, false},
        {"log", [](const Tensor& x) { return log(x); }, true},
        {"sqrt", [](const Tensor& x) { return sqrt(x); }, true},
        {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true},
        {"abs", [](const Tensor& x) { return abs(x); }, false},
        {"tanh", [](const Tensor& x) { return tanh(x); }, false},
        {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false},
        {"relu", [](const Tensor& x) { return relu(x); }, false},
        {"gelu", [](const Tensor& x) { return gelu(x); }, false},
        {"silu", [](const Tensor& x) { return silu(x); }, false},
        {"softcap", [](const Tensor& x) { return softcap(x, 1.3); }, false},
    };
    for (DType dt : {kF32, kF64})
        for (const auto& c : cases) {
            // a transposed input: the op makes it contiguous on the device first
            const Tensor x =
                c.positive_only ? positive({45, 37}, 7, dt) : randn_seeded({45, 37}, 7, dt, 2.0);
            check_cuda_parity(fmt::format("{} {}", c.name, dtype_name(dt)),
                              [f = c.f](const Inputs& in) { return f(in[0].t()); }, {x});
        }
}

TEST_CASE("a composite of elementwise ops (a GPT-2 MLP activation path) matches the cpu") {
    for (DType dt : {kF32, kF64})
        check_cuda_parity("composite",
                          [](const Inputs& in) {
                              const Tensor h = gelu(in[0] * in[1] + in[2]);
                              return tanh(h) / (sigmoid(h) + 1.0) - exp(-abs(h)) * 0.5;
                          },
                          {randn_seeded({2, 19, 67}, 8, dt), randn_seeded({67}, 9, dt),
                           randn_seeded({19, 1}, 10, dt)});
}

TEST_CASE("add_ on cuda: broadcast source, strided destination, same as the cpu") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        const Tensor base = randn_seeded({40, 70}, 11, dt), src = randn_seeded({33}, 12, dt);
        Tensor want = base.clone();
        Tensor want_view = want.narrow(1, 4, 33).narrow(0, 2, 30);
        add_(want_view, src);
        Tensor got = base.to(Device::cuda);
        Tensor got_view = got.narrow(1, 4, 33).narrow(0, 2, 30);
        add_(got_view, src.to(Device::cuda));
        CHECK(max_abs_diff(got, want) == 0);
        // into a transposed destination
        Tensor t_want = base.clone().t(), t_got = base.to(Device::cuda).t();
        const Tensor full_src = randn_seeded({70, 40}, 13, dt);
        add_(t_want, full_src);
        add_(t_got, full_src.to(Device::cuda));
        CHECK(max_abs_diff(t_got, t_want) == 0);
    }
    Tensor expanded = zeros({1, 5}, kF32, Device::cuda).expand({4, 5});
    CHECK(throws_with(
        [&] {
            add_(expanded, ones({4, 5}, kF32, Device::cuda));
        },
        {"add_", "expanded"}));
}

TEST_CASE("elementwise ops on cuda keep NaN and inf where the cpu does") {
    const Tensor x = from_vector(
        {0.0,  -1.0, 1e30,  -1e30, std::nan(""), INFINITY, -INFINITY, 2.0,  0.5,  -0.5,  3.0,
         -3.0, 40.0, -40.0, 1e-30, 7.0,          -7.0,     0.25,      9.0,  -9.0, 100.0, -100.0,
         1.0,  4.0,  5.0,   -5.0,  6.0,          -6.0,     8.0,       -8.0, 10.0, -10.0, 11.0},
        {33});
    qk::test::ParityOptions no_grad;
    no_grad.check_grads = false;
    for (auto f :
         {+[](const Tensor& t) { return tanh(t); }, +[](const Tensor& t) { return exp(t); },
          +[](const Tensor& t) { return gelu(t); }, +[](const Tensor& t) { return sigmoid(t); }})
        check_cuda_parity(
            "specials", [f](const Inputs& in) { return f(in[0]); }, {x}, no_grad);
}

TEST_CASE("glu on cuda matches the cpu, forward and both gradients, SwiGLU and GeGLU") {
    for (DType dt : {kF32, kF64})
        for (GluActivation activation : {GluActivation::silu, GluActivation::gelu}) {
            const auto op = [activation](const Inputs& in) {
                return glu(in[0], in[1], activation);
            };
            // 3 x 37 x 45 (ragged, several blocks), gates spread over the activations' tails.
            check_cuda_parity(
                fmt::format("glu {} {}", int(activation), dtype_name(dt)), op,
                {randn_seeded({3, 37, 45}, 70, dt, 4.0), randn_seeded({3, 37, 45}, 71, dt)});
        }
}

TEST_CASE(
    "glu on cuda rounds its result and gradients in the same pass when asked, no value changed") {
    if (!cuda_runnable()) return;
    for (GluActivation activation : {GluActivation::silu, GluActivation::gelu})
        for (Precision precision : {Precision::bf16, Precision::fp16}) {
            CAPTURE(int(activation));
            CAPTURE(precision_name(precision));
            const DType half = precision == Precision::bf16 ? kBF16 : kF16;
            const Tensor gate = randn_seeded({3, 37, 21}, 31).to(Device::cuda);
            const Tensor up = randn_seeded({3, 37, 21}, 32).to(Device::cuda);
            const Tensor plain = glu(gate, up, activation);
            const Tensor y = glu(gate, up, activation, precision);
            CHECK(max_abs_diff(y, plain) == 0);
            qk::test::check_kept_rounding(y, half);
            CHECK_FALSE(has_kept_cast(plain, half));
            // The backward kernel: both gradients, and their roundings beside them.
            const int64_t n = gate.numel();
            const Tensor dy = randn_seeded({3, 37, 21}, 33).to(Device::cuda);
            Tensor dgate = Tensor::empty(gate.shape(), kF32, Device::cuda);
            Tensor dup = Tensor::empty(gate.shape(), kF32, Device::cuda);
            Tensor dgate_plain = Tensor::empty(gate.shape(), kF32, Device::cuda);
            Tensor dup_plain = Tensor::empty(gate.shape(), kF32, Device::cuda);
            Tensor dgate_half = Tensor::empty(gate.shape(), half, Device::cuda);
            Tensor dup_half = Tensor::empty(gate.shape(), half, Device::cuda);
            cuda::glu_backward(dgate_plain.data<float>(), dup_plain.data<float>(), dy.data<float>(),
                               gate.data<float>(), up.data<float>(), n, activation);
            cuda::glu_backward(dgate.data<float>(), dup.data<float>(), dy.data<float>(),
                               gate.data<float>(), up.data<float>(), n, activation,
                               static_cast<uint16_t*>(dgate_half.raw_data()),
                               static_cast<uint16_t*>(dup_half.raw_data()), half == kBF16);
            CHECK(max_abs_diff(dgate, dgate_plain) == 0);
            CHECK(max_abs_diff(dup, dup_plain) == 0);
            CHECK(max_abs_diff(dgate_half.to(kF32), dgate.to(half).to(kF32)) == 0);
            CHECK(max_abs_diff(dup_half.to(kF32), dup.to(half).to(kF32)) == 0);
        }
}

TEST_CASE("gelu on cuda rounds its result in the same pass when asked, no value changed") {
    if (!cuda_runnable()) return;
    for (Precision precision : {Precision::bf16, Precision::fp16}) {
        CAPTURE(precision_name(precision));
        const DType half = precision == Precision::bf16 ? kBF16 : kF16;
        const Tensor x = randn_seeded({3, 37, 21}, 41, kF32, 3.0).to(Device::cuda);
        const Tensor plain = gelu(x);
        const Tensor y = gelu(x, precision);
        CHECK(max_abs_diff(y, plain) == 0);
        qk::test::check_kept_rounding(y, half);
        CHECK_FALSE(has_kept_cast(plain, half));
        // The gradient is the plain op's (the copy is the forward's alone).
        Tensor leaf = x.detach();
        leaf.requires_grad_();
        const Tensor probe = randn_seeded({3, 37, 21}, 42).to(Device::cuda);
        sum(gelu(leaf, precision) * probe).backward();
        const Tensor rounded_grad = leaf.grad().detach();
        leaf.impl().grad.reset();
        sum(gelu(leaf) * probe).backward();
        CHECK(max_abs_diff(rounded_grad, leaf.grad()) == 0);
    }
    // float64 and the cpu write no copy: the Linear rounds for itself.
    CHECK_FALSE(has_kept_cast(gelu(randn_seeded({5, 7}, 43), Precision::bf16), kBF16));
    CHECK_FALSE(has_kept_cast(
        gelu(randn_seeded({5, 7}, 44, kF64).to(Device::cuda), Precision::bf16), kBF16));
}
