// Reductions on cuda (cuda/reduce.cu) against the cpu, forward and backward, float32 and float64,
// under every run order of the emulator, for every rung of the kernel ladder (v1: one thread per
// output; v2: one block per output with shuffle + shared-memory trees; v3: column tiles in row
// chunks; v4: groups split into chunks; both then combined per output) and the automatic choice:
// sum, mean, max (with ties and NaN), logsumexp (with -inf groups), var and sum_to, over first,
// middle, last, several and all dims, of contiguous and strided inputs.
#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::cuda_runnable;
using qk::test::Inputs;
using qk::test::max_abs_diff;
using qk::test::randn_seeded;

namespace {

// Forces a rung of the ladder for one scope (0: automatic).
struct ReduceVersion {
    explicit ReduceVersion(int v) { cuda::set_reduce_version(v); }
    ~ReduceVersion() { cuda::set_reduce_version(0); }
};

const std::vector<Dims> kDims = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}};

// x: (3, 37, 45) and its transpose's view (45, 37, 3) read through strides.
Inputs inputs(uint64_t seed, DType dt) { return {randn_seeded({3, 37, 45}, seed, dt)}; }

// Values on a coarse grid, so that many elements tie for the max.
Tensor with_ties(const Shape& shape, uint64_t seed, DType dt) {
    const Tensor x = randn_seeded(shape, seed, kF64);
    std::vector<double> v = x.to_vector<double>();
    for (double& e : v) e = std::round(e);
    return from_vector(v, shape, dt);
}

}  // namespace

TEST_CASE("sum, mean, max, logsumexp and var over dims: cuda matches the cpu, every rung") {
    for (int version : {0, 1, 2, 3, 4}) {
        ReduceVersion forced(version);
        for (DType dt : {kF32, kF64})
            for (size_t d = 0; d < kDims.size(); ++d) {
                const Dims& dims = kDims[d];
                const bool keepdim = d % 2 == 1;  // both forms, over the dims lists
                {
                    const std::string tag = fmt::format("v{} {} dims {} keepdim {}", version,
                                                        dtype_name(dt), dims, keepdim);
                    check_cuda_parity(
                        "sum " + tag, [&](const Inputs& in) { return sum(in[0], dims, keepdim); },
                        inputs(1, dt));
                    check_cuda_parity(
                        "mean of a transpose " + tag,
                        [&](const Inputs& in) {
                            return mean(in[0].transpose(0, 2), dims, keepdim);
                        },
                        inputs(2, dt));
                    check_cuda_parity("max " + tag,
                                      [&](const Inputs& in) { return max(in[0], dims, keepdim); },
                                      {with_ties({3, 37, 45}, 3, dt)});
                    check_cuda_parity(
                        "logsumexp " + tag,
                        [&](const Inputs& in) { return logsumexp(in[0] * 3.0, dims, keepdim); },
                        inputs(4, dt));
                    check_cuda_parity(
                        "var " + tag, [&](const Inputs& in) { return var(in[0], dims, keepdim); },
                        inputs(5, dt));
                }
            }
    }
}

TEST_CASE("long groups: a row of 300 (v2 with 256 threads, several strides per thread)") {
    for (DType dt : {kF32, kF64}) {
        const Tensor x = randn_seeded({5, 300}, 6, dt, 3.0);
        check_cuda_parity("sum rows", [](const Inputs& in) { return sum(in[0], {1}); }, {x});
        check_cuda_parity("max rows", [](const Inputs& in) { return max(in[0], {1}); }, {x});
        check_cuda_parity("logsumexp rows", [](const Inputs& in) { return logsumexp(in[0], {-1}); },
                          {x});
        check_cuda_parity("sum columns of a transpose",
                          [](const Inputs& in) { return sum(in[0].t(), {0}, true); }, {x});
    }
}

TEST_CASE("sum_to (the backward of broadcasting) matches the cpu") {
    for (int version : {0, 1, 2, 3, 4}) {
        ReduceVersion forced(version);
        for (DType dt : {kF32, kF64}) {
            const Tensor x = randn_seeded({2, 37, 45}, 7, dt);
            for (const Shape& to : {Shape{45}, Shape{37, 1}, Shape{1, 45}, Shape{2, 1, 45},
                                    Shape{1}, Shape{2, 37, 1}})
                check_cuda_parity(fmt::format("sum_to v{} {} {}", version, dtype_name(dt), to),
                                  [to](const Inputs& in) { return sum_to(in[0], to); }, {x});
        }
    }
}

TEST_CASE("max with NaN and logsumexp with -inf groups behave as on the cpu") {
    if (!cuda_runnable()) return;
    for (int version : {1, 2, 3, 4}) {
        ReduceVersion forced(version);
        std::vector<double> v(4 * 35);
        for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(double(i));
        v[40] = std::nan("");                                    // row 1 holds a NaN
        for (int j = 0; j < 35; ++j) v[2 * 35 + j] = -INFINITY;  // row 2 is all -inf
        v[3 * 35 + 7] = INFINITY;                                // row 3 holds +inf
        const Tensor x = from_vector(v, {4, 35}, kF64);
        qk::test::ParityOptions opts;
        check_cuda_parity(
            "max specials", [](const Inputs& in) { return max(in[0], {1}); }, {x}, opts);
        opts.check_grads = false;  // +inf − +inf: NaN gradients on both devices
        check_cuda_parity(
            "logsumexp specials", [](const Inputs& in) { return logsumexp(in[0], {1}); }, {x},
            opts);
        // the -inf row alone has a defined (zero) gradient
        check_cuda_parity("logsumexp of -inf rows",
                          [](const Inputs& in) { return logsumexp(in[0].narrow(0, 0, 3), {1}); },
                          {x});
    }
}

TEST_CASE("the two rungs agree with each other on a long sum (tree vs serial rounding)") {
    if (!cuda_runnable()) return;
    const Tensor x = randn_seeded({7, 1000}, 8, kF64).to(Device::cuda);
    Tensor v1, v2;
    {
        ReduceVersion forced(1);
        v1 = sum(x, {1});
    }
    {
        ReduceVersion forced(2);
        v2 = sum(x, {1});
    }
    CHECK(max_abs_diff(v1, v2) < 1e-11);
    CHECK(max_abs_diff(v2, sum(x.to(Device::cpu), {1})) < 1e-11);
}

TEST_CASE("column sums take v3 and long full sums v4 by themselves, with grids that fill a GPU") {
    if (!cuda_runnable()) return;
    auto kernels = [](const Tensor& x, const Dims& dims) {
        std::vector<std::string> names;
        for (const auto& e : qk::test::launches_of([&] { (void)sum(x, dims); }))
            names.push_back(fmt::format("{} {}", e.name, e.blocks()));
        return names;
    };
    for (DType dt : {kF32, kF64}) {
        // (200, 40) over rows: 40 contiguous columns, rows 40 apart: 2 column tiles x 3 chunks,
        // one launch (the last block of each tile combines its chunks).
        const Tensor columns = randn_seeded({200, 40}, 8, dt);
        const auto v3 = kernels(columns.to(Device::cuda), {0});
        REQUIRE(v3.size() == 1);
        CHECK(v3[0] == "(reduce_columns_kernel<T, Op>) 6");
        check_cuda_parity("column sums", [](const Inputs& in) { return sum(in[0], {0}); },
                          {columns});
        // 70,000 values to one: 17 chunks of 4,118 (at least 4,096 each), not one block.
        const Tensor flat = randn_seeded({70000}, 9, dt);
        const auto v4 = kernels(flat.to(Device::cuda), {});
        REQUIRE(v4.size() == 2);
        CHECK(v4[0] == "(reduce_split_kernel<T, Op>) 17");
        check_cuda_parity("a long full sum", [](const Inputs& in) { return sum(in[0]); }, {flat});
        check_cuda_parity("a long full max", [](const Inputs& in) { return max(in[0], {0}); },
                          {flat});
    }
}
