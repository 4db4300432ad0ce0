// Tensors on the device: moving them (to, differentiable), factories, contiguous copies of views,
// copy_into in every direction, item/to_vector/printing, device-mismatch errors, gradient
// accumulation into cuda leaves, and the caching allocator. Runs in the emulation build (or on a
// real GPU); sizes are ragged and span several 256-thread blocks.
#include <algorithm>

#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::max_abs_diff;
using qk::test::randn_seeded;
using qk::test::throws_with;

namespace {

// Exact equality of values, dtype and shape (a copy must not change a bit).
void check_same_values(const Tensor& got, const Tensor& want) {
    REQUIRE(got.shape() == want.shape());
    CHECK(got.dtype() == want.dtype());
    CHECK(got.to_vector<double>() == want.to_vector<double>());
}

}  // namespace

TEST_CASE("to(cuda) and back keeps every value, dtype and shape; to() where it is is a no-op") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        const Tensor x = randn_seeded({37, 45}, 1, dt);
        const Tensor d = x.to(Device::cuda);
        CHECK(d.device() == Device::cuda);
        CHECK(d.is_contiguous());
        check_same_values(d.to(Device::cpu), x);
        CHECK(d.to(Device::cuda).same(d));
        CHECK(x.to(Device::cpu).same(x));
#ifdef QK_CUDA_EMULATION
        CHECK(qk::emu::is_device_pointer(d.raw_data()));  // data<T>() is the device pointer
        CHECK_FALSE(qk::emu::is_device_pointer(x.raw_data()));
#endif
    }
    const Tensor ids = from_ids({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
    check_same_values(ids.to(Device::cuda).to(Device::cpu), ids);
    const Tensor empty = Tensor::empty({0, 3}, kF32, Device::cuda);
    CHECK(empty.to(Device::cpu).numel() == 0);
}

TEST_CASE("to(device) is differentiable: the gradient moves back to the source device") {
    if (!cuda_runnable()) return;
    Tensor x = randn_seeded({5, 67}, 2, kF64).requires_grad_();
    Tensor y = x.to(Device::cuda);
    (sum(y * y) * 0.5).backward();  // d/dx = x
    REQUIRE(x.grad().defined());
    CHECK(x.grad().device() == Device::cpu);
    CHECK(max_abs_diff(x.grad(), x) == 0);

    Tensor w = randn_seeded({67}, 3, kF64).to(Device::cuda).requires_grad_();
    sum(w.to(Device::cpu) * 3.0).backward();
    REQUIRE(w.grad().defined());
    CHECK(w.grad().device() == Device::cuda);
    CHECK(max_abs_diff(w.grad(), full({67}, 3.0, kF64)) == 0);
}

TEST_CASE("factories on cuda give the cpu's values; random ones follow the seed") {
    if (!cuda_runnable()) return;
    for (DType dt : {kF32, kF64}) {
        check_same_values(zeros({3, 97}, dt, Device::cuda), zeros({3, 97}, dt));
        check_same_values(ones({3, 97}, dt, Device::cuda), ones({3, 97}, dt));
        check_same_values(full({3, 97}, -2.5, dt, Device::cuda), full({3, 97}, -2.5, dt));
        check_same_values(full({300}, -0.0, dt, Device::cuda), full({300}, -0.0, dt));
        {
            Generator g1(7), g2(7);
            check_same_values(randn({4, 77}, dt, Device::cuda, g1), randn({4, 77}, dt, g2));
        }
        {
            Generator g1(8), g2(8);
            check_same_values(rand({4, 77}, dt, Device::cuda, g1), rand({4, 77}, dt, g2));
        }
        {
            Generator g1(9), g2(9);
            check_same_values(normal({301}, 1.5, 0.25, dt, Device::cuda, g1),
                              normal({301}, 1.5, 0.25, dt, g2));
        }
        {
            Generator g1(10), g2(10);
            check_same_values(uniform({301}, -3, 2, dt, Device::cuda, g1),
                              uniform({301}, -3, 2, dt, g2));
        }
        const Tensor d = Tensor::empty({5, 6}, dt, Device::cuda);
        CHECK(d.device() == Device::cuda);
        CHECK(zeros_like(d).device() == Device::cuda);
        CHECK(ones_like(d).device() == Device::cuda);
        Generator g(11);
        CHECK(randn_like(d, g).device() == Device::cuda);
    }
    check_same_values(full({33}, 7, kI32, Device::cuda), full({33}, 7, kI32));
}

TEST_CASE("contiguous and clone of transposed, narrowed, permuted and expanded cuda views") {
    if (!cuda_runnable()) return;
    const Tensor x = randn_seeded({6, 37, 45}, 4, kF32);
    const Tensor d = x.to(Device::cuda);
    auto same_view = [&](auto make) {
        const Tensor want = make(x).contiguous(), got = make(d).contiguous();
        CHECK(got.device() == Device::cuda);
        CHECK(got.is_contiguous());
        check_same_values(got, want);
    };
    same_view([](const Tensor& t) { return t.transpose(1, 2); });
    same_view([](const Tensor& t) { return t.narrow(2, 3, 29); });
    same_view([](const Tensor& t) { return t.narrow(1, 5, 20).transpose(0, 2); });
    same_view([](const Tensor& t) { return t.permute({2, 0, 1}); });
    same_view([](const Tensor& t) { return t.select(0, 3).t(); });
    same_view([](const Tensor& t) { return t.narrow(2, 0, 1).expand({6, 37, 50}); });
    // clone always copies, into new device memory
    const Tensor c = d.clone();
    CHECK(c.device() == Device::cuda);
    CHECK(c.raw_data() != d.raw_data());
    check_same_values(c, d);
    // casts on the device
    check_same_values(d.transpose(0, 1).to(kF64), x.transpose(0, 1).to(kF64));
    check_same_values(d.to(kI32), x.to(kI32));
}

TEST_CASE("copy_into between every pair of devices, into strided destinations, with casts") {
    if (!cuda_runnable()) return;
    const Tensor src_cpu = randn_seeded({29, 41}, 5, kF64);
    const Tensor src_dev = src_cpu.to(Device::cuda);
    for (Device dst_device : {Device::cpu, Device::cuda}) {
        for (DType dst_dtype : {kF64, kF32}) {
            for (const Tensor& src : {src_cpu, src_dev, src_dev.t().contiguous().t()}) {
                // dst: the transposed middle of a larger tensor
                Tensor big = zeros({50, 40}, dst_dtype, dst_device);
                Tensor dst = big.narrow(0, 3, 41).narrow(1, 5, 29).t();
                copy_into(dst, src);
                Tensor want_big = zeros({50, 40}, dst_dtype);
                copy_into(want_big.narrow(0, 3, 41).narrow(1, 5, 29).t(), src_cpu);
                check_same_values(big, want_big);
                // contiguous destination
                Tensor flat = Tensor::empty({29, 41}, dst_dtype, dst_device);
                copy_into(flat, src);
                check_same_values(flat, src_cpu.to(dst_dtype));
            }
        }
    }
    CHECK(throws_with(
        [&] {
            copy_into(Tensor::empty({3, 4}, kF32, Device::cuda), src_dev);
        },
        {"copy", "shapes differ"}));
}

TEST_CASE("item, to_vector and printing copy a cuda tensor to the host") {
    if (!cuda_runnable()) return;
    const Tensor s = full({}, 3.25, kF32, Device::cuda);
    CHECK(s.item() == 3.25);
    CHECK(full({1, 1}, -1.5, kF64, Device::cuda).item() == -1.5);
    const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    const Tensor d = x.to(Device::cuda);
    CHECK(d.t().to_vector<float>() == x.t().to_vector<float>());
    const std::string text = to_string(d);
    CHECK(text.find("[[1, 2, 3],") != std::string::npos);
    CHECK(text.find("device=cuda") != std::string::npos);
    CHECK(throws_with([&] { (void)d.at({0, 0}); }, {"cpu tensor", "cuda"}));
}

TEST_CASE("ops refuse inputs on two devices, naming the op and both devices") {
    if (!cuda_runnable()) return;
    const Tensor a = randn_seeded({4, 5}, 6), b = randn_seeded({4, 5}, 7).to(Device::cuda);
    const Tensor w = randn_seeded({5, 5}, 8).to(Device::cuda);
    CHECK(throws_with([&] { (void)(a + b); }, {"add", "cpu", "cuda"}));
    CHECK(throws_with([&] { (void)(b * a); }, {"mul", "cuda", "cpu"}));
    CHECK(throws_with([&] { (void)div(a, b); }, {"div", "cpu", "cuda"}));
    CHECK(throws_with([&] { (void)matmul(a, w); }, {"matmul", "cpu", "cuda"}));
    CHECK(throws_with([&] { (void)linear(a, w); }, {"linear", "cpu", "cuda"}));
    CHECK(throws_with(
        [&] {
            Tensor dst = zeros({4, 5}, kF32, Device::cuda);
            add_(dst, a);
        },
        {"add_", "cuda", "cpu"}));
}

TEST_CASE("gradients accumulate into cuda leaves across backward calls; zero_grad resets") {
    if (!cuda_runnable()) return;
    const Tensor x_cpu = randn_seeded({3, 70}, 9, kF64);
    Tensor x = x_cpu.to(Device::cuda).requires_grad_();
    Tensor b = randn_seeded({70}, 10, kF64).to(Device::cuda).requires_grad_();
    for (int step = 0; step < 2; ++step) sum(tanh(x + b) * x).backward();
    // the same on the cpu
    Tensor xc = x_cpu.clone().requires_grad_();
    Tensor bc = b.detach().to(Device::cpu).requires_grad_();
    for (int step = 0; step < 2; ++step) sum(tanh(xc + bc) * xc).backward();
    CHECK(x.grad().device() == Device::cuda);
    CHECK(max_abs_diff(x.grad(), xc.grad()) < 1e-12);
    CHECK(max_abs_diff(b.grad(), bc.grad()) < 1e-12);
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
    sum(x * 2.0).backward();
    CHECK(max_abs_diff(x.grad(), full({3, 70}, 2.0, kF64)) == 0);
}

TEST_CASE("the caching allocator reuses a freed block: no new cudaMalloc for the same size") {
    if (!cuda_runnable()) return;
    const Shape shape{123, 45};
    { Tensor t = Tensor::empty(shape, kF32, Device::cuda); }  // allocated, then cached
    const cuda::AllocatorStats before = cuda::allocator_stats();
    {
        Tensor t = Tensor::empty(shape, kF32, Device::cuda);
        CHECK(cuda::allocator_stats().device_mallocs == before.device_mallocs);
        CHECK(cuda::allocator_stats().live_bytes > before.live_bytes);
    }
    CHECK(cuda::allocator_stats().live_bytes == before.live_bytes);
    CHECK(cuda::allocator_stats().cached_bytes == before.cached_bytes);
}

TEST_CASE("parity harness: a composite of views and casts matches the cpu in every run order") {
    check_cuda_parity("views",
                      [](const Inputs& in) {
                          return in[0].transpose(0, 1).narrow(0, 2, 30).to(kF64).contiguous() * 2.0;
                      },
                      {randn_seeded({37, 45}, 12, kF32)});
}

// float -> bf16 on the device runs on the device's conversion instruction (cuda/bf16_convert.h):
// the same bits as the cpu's qk::bf16 for every float, NaN included. On a GPU every one of the
// 2^32 patterns is checked; in the emulator (whose __float2bfloat16_rn is cuda/emu/cuda_bf16.h)
// a spread-out sample plus every tie, every NaN/Inf-adjacent pattern and the subnormals' ties.
TEST_CASE("bf16 on the device: the float -> bf16 cast rounds every pattern as the cpu does") {
    if (!cuda_runnable()) return;
    std::vector<uint32_t> patterns;
#ifdef QK_CUDA_EMULATION
    for (uint32_t i = 0; i < (1u << 18); ++i) patterns.push_back(i * 0x9E3779B1u);
    for (uint32_t hi = 0; hi < (1u << 16); ++hi)
        for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) patterns.push_back((hi << 16) | lo);
    const uint64_t total = patterns.size(), chunk = total;
#else
    const uint64_t total = uint64_t{1} << 32, chunk = uint64_t{1} << 26;
#endif
    uint64_t mismatches = 0, first_bad = 0;
    for (uint64_t start = 0; start < total; start += chunk) {
        const int64_t n = static_cast<int64_t>(std::min(chunk, total - start));
        Tensor x = zeros({n}, kF32);
        auto* bits = reinterpret_cast<uint32_t*>(x.data<float>());
        for (int64_t i = 0; i < n; ++i)
            bits[i] = patterns.empty() ? static_cast<uint32_t>(start + i) : patterns[start + i];
        const auto on_cpu = x.to(kBF16).to_vector<bf16>();
        const auto on_dev = x.to(Device::cuda).to(kBF16).to(Device::cpu).to_vector<bf16>();
        for (int64_t i = 0; i < n; ++i)
            if (on_cpu[i].bits != on_dev[i].bits && mismatches++ == 0) first_bad = bits[i];
    }
    INFO("first float pattern rounded differently: " << fmt::format("{:#010x}", first_bad));
    CHECK(mismatches == 0);
}

TEST_CASE("bf16 on the device: copies and casts give the cpu's bits") {
    if (!cuda_runnable()) return;
    Generator gen(9);
    Tensor x = normal({37, 19}, 0, 100, kF32, gen);
    x.set({1, 1}, NAN);
    x.set({2, 2}, -INFINITY);
    x.set({3, 3}, 3e38);
    Tensor on_cpu = x.to(kBF16);
    Tensor on_dev = x.to(Device::cuda).to(kBF16);  // the cast runs in a kernel
    CHECK(on_dev.device() == Device::cuda);
    auto a = on_cpu.to_vector<bf16>(), b = on_dev.to_vector<bf16>();
    bool same = true;
    for (size_t i = 0; i < a.size(); ++i) same &= a[i].bits == b[i].bits;
    CHECK(same);
    Tensor t = x.t().to(Device::cuda).to(kBF16).to(kF32).to(Device::cpu);  // strided, and back
    CHECK(t.to_vector<float>().size() == a.size());
    CHECK(t.at({4, 2}) == on_cpu.at({2, 4}));
    CHECK(full({5}, 1000.5, kBF16, Device::cuda).to(Device::cpu).at({4}) == 1000);
}

TEST_CASE("packed copies: four neighbours at a time where rows allow it, the same values") {
    if (!cuda_runnable()) return;
    auto kernel_of = [](auto make) {  // the one copy kernel that `make` launches
        const auto entries = qk::test::launches_of([&] { (void)make(); });
        REQUIRE(entries.size() == 1);
        return entries[0].name;
    };
    Generator gen(21);
    Tensor x = normal({2, 5, 3, 8}, 0, 100, kF32, gen);  // (B, T, H, D): D = 8 packs twice
    x.set({1, 4, 0, 7}, -INFINITY);
    const Tensor d = x.to(Device::cuda);
    // The heads regrouped, (B, H, T, D): D contiguous on both sides, every other stride 4k.
    CHECK(kernel_of([&] { return d.transpose(1, 2).contiguous(); }).find("copy_packed") !=
          std::string::npos);
    check_same_values(d.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous());
    // Casts: to bf16 (the cpu's bits, NaN and -inf included) and float64, packed too.
    CHECK(kernel_of([&] { return d.to(kBF16); }).find("copy_packed") != std::string::npos);
    Tensor with_nan = x.clone();
    with_nan.set({0, 1, 2, 3}, NAN);
    const auto want = with_nan.to(kBF16).to_vector<bf16>();
    const auto got = with_nan.to(Device::cuda).to(kBF16).to_vector<bf16>();
    bool same_bits = want.size() == got.size();
    for (size_t i = 0; same_bits && i < want.size(); ++i) same_bits = want[i].bits == got[i].bits;
    CHECK(same_bits);
    check_same_values(d.transpose(1, 2).to(kF64), x.transpose(1, 2).to(kF64));
    // Rows that start off a pack boundary, or a width that is not a multiple of 4: one at a time.
    CHECK(kernel_of([&] { return d.narrow(3, 1, 4).contiguous(); }).find("copy_strided") !=
          std::string::npos);
    check_same_values(d.narrow(3, 1, 4).contiguous(), x.narrow(3, 1, 4).contiguous());
    CHECK(kernel_of([&] { return d.narrow(3, 4, 4).contiguous(); }).find("copy_packed") !=
          std::string::npos);
    check_same_values(d.narrow(3, 4, 4).contiguous(), x.narrow(3, 4, 4).contiguous());
    check_same_values(d.narrow(3, 0, 6).contiguous(), x.narrow(3, 0, 6).contiguous());
}

TEST_CASE(
    "copy_into_all: the packed copies of one dtype pair share a launch, the rest copy alone") {
    if (!cuda_runnable()) return;
    // Six (B, H, T, D) heads-first views written into (B, T, H, D) places: five f32 -> bf16 (one
    // more than a launch takes), one f32 -> f32 whose width 6 is not a multiple of 4 (not packed).
    std::vector<Tensor> sources, places, expected;
    for (int i = 0; i < 6; ++i) {
        const int64_t D = i == 5 ? 6 : 8;
        const Tensor x = randn_seeded({2, 3, 5, D}, 40 + uint64_t(i), kF32).to(Device::cuda);
        const DType to = i == 5 ? kF32 : kBF16;
        const Tensor full = zeros({2, 5, 3, D}, to, Device::cuda);
        sources.push_back(x);
        places.push_back(full.transpose(1, 2));
        expected.push_back(x.to(Device::cpu).to(to));
    }
    const auto entries = qk::test::launches_of([&] { copy_into_all(places, sources); });
    for (size_t i = 0; i < places.size(); ++i) {
        CAPTURE(i);
        const Tensor got = places[i].to(Device::cpu).contiguous().to(kF64);
        CHECK(max_abs_diff(got, expected[i].to(kF64)) == 0);
    }
    std::vector<std::string> names;
    for (const auto& e : entries) names.push_back(e.name);
    // Four packed together, the fifth bf16 alone (past a launch's four), the f32 one alone.
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"(copy_packed_all_kernel<D, S>)",
                                            "(copy_packed_kernel<D, S>)",
                                            "(copy_strided_kernel<D, S>)"});
    CHECK(throws_with([&] { copy_into_all({places[0]}, {}); }, {"copy_into_all", "1", "0"}));
}
