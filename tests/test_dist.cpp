// Run by `mpirun -np 2` (meson test 'dist_ranks'): the collectives of core/distributed.h, and
// GradientSync's data-parallel steps in float64 against one model trained on the whole batch,
// which each rank also trains on its own as the reference.
#include "core/distributed.h"
#include "helpers.h"
#include "nn/model/gpt.h"
#include "nn/optim/data_parallel.h"
#include "nn/optim/optim.h"
#include "nn/optim/zero.h"
#ifdef QK_WITH_CUDA
#include "cuda/runtime.h"
#endif

using namespace qk;
using namespace qk::nn;
using qk::test::max_abs_diff;

namespace {

struct World {
    World() { dist::init(); }
};
const World world;  // joins the MPI world before the first test case

// The tiny model of these tests: V = 13, T = 8, 2 layers of 2 heads, C = 16.
GPTConfig tiny_model() {
    GPTConfig c;
    c.vocab_size = 13, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
    return c;
}

// A batch (B, T) of random token ids and targets; gen is seeded alike on every rank.
std::pair<Tensor, Tensor> random_batch(Generator& gen, int64_t B, int64_t T) {
    std::vector<int32_t> x, y;
    for (int64_t i = 0; i < B * T; ++i) {
        const auto words = gen.next_block();
        x.push_back(static_cast<int32_t>(words[0] % 13));
        y.push_back(static_cast<int32_t>(words[1] % 13));
    }
    return {from_ids(x, {B, T}), from_ids(y, {B, T})};
}

}  // namespace

TEST_CASE("collectives: sums, max, broadcast, gather, reduce-scatter and all-gather") {
    const int rank = dist::rank(), ranks = dist::world_size();
    REQUIRE(ranks == 2);  // the suite is started by mpirun -np 2
    Tensor t = from_vector({1.0 + rank, 10.0 * (rank + 1)}, {2}, kF64);
    dist::all_reduce_sum(t);
    CHECK(t.to_vector<double>() == std::vector<double>{3, 30});
    CHECK(dist::all_reduce_sum(0.5 + rank) == 2.0);
    CHECK(dist::all_reduce_max(-1.0 * rank) == 0.0);
    Tensor b = from_vector({rank == 0 ? 7.0 : -1.0, rank == 0 ? 8.0 : -1.0}, {2}, kF32);
    dist::broadcast(b);
    CHECK(b.to_vector<double>() == std::vector<double>{7, 8});
    CHECK(dist::all_gather(std::string(static_cast<size_t>(rank) + 1, 'x')) ==
          std::vector<std::string>{"x", "xx"});
    Tensor full = from_vector({1.0 + rank, 2.0 + rank, 3.0 + rank, 4.0 + rank}, {4}, kF64);
    Tensor shard = zeros({2}, kF64);
    dist::reduce_scatter_sum(full, shard);  // rank r: the sum of elements [2r, 2r + 2)
    CHECK(shard.to_vector<double>() ==
          (rank == 0 ? std::vector<double>{3, 5} : std::vector<double>{7, 9}));
    Tensor gathered = zeros({4}, kF64);
    dist::all_gather_into(shard, gathered);
    CHECK(gathered.to_vector<double>() == std::vector<double>{3, 5, 7, 9});
    CHECK(test::error_message([&] {
              dist::reduce_scatter_sum(full, zeros({3}, kF64));
          }).find("reduce_scatter_sum") != std::string::npos);
}

TEST_CASE("data-parallel float64 steps equal whole-batch steps to 1e-10, overlapped or not") {
    GPTConfig c = tiny_model();
    c.qk_norm = QKNorm::layernorm;
    const int64_t B = 6, T = 8, half = B / 2;
    for (bool overlap : {true, false}) {
        CAPTURE(overlap);
        GPT reference(c, 5, kF64), replica(c, 5, kF64);
        AdamWOptions options{.lr = 1e-2};
        AdamW ref_opt(reference.parameters(), options), rep_opt(replica.parameters(), options);
        // 2 KB buckets: several of them, started during backward when overlap is on
        GradientSync sync(replica.parameters(), 2048, overlap);
        CHECK(sync.bucket_count() > 3);
        Generator gen(11);  // the same batches on both ranks
        for (int step = 0; step < 20; ++step) {
            const auto [ids, targets] = random_batch(gen, B, T);
            GPTOutput ref_out = reference.forward(ids, targets);
            const double ref_loss = ref_out.loss.item();
            ref_out.loss.backward();
            ref_opt.step(1e-2);
            ref_opt.zero_grad();
            const Tensor my_ids = ids.narrow(0, dist::rank() * half, half).contiguous();
            const Tensor my_targets = targets.narrow(0, dist::rank() * half, half).contiguous();
            GPTOutput out = replica.forward(my_ids, my_targets);
            out.loss.backward();
            sync.finish();
            const double loss = dist::all_reduce_sum(out.loss.item()) / 2;
            rep_opt.step(1e-2);
            rep_opt.zero_grad();
            CHECK(std::abs(loss - ref_loss) <= 1e-10 * std::abs(ref_loss));
        }
        const auto ref_params = reference.parameters(), rep_params = replica.parameters();
        for (size_t i = 0; i < ref_params.size(); ++i)
            CHECK(max_abs_diff(ref_params[i], rep_params[i]) < 1e-10);
    }
}

TEST_CASE("ZeRO-1 float64 steps equal whole-batch AdamW to 1e-10, and its gathered moments too") {
    const GPTConfig c = tiny_model();
    const int64_t B = 4, T = 8, half = B / 2;
    GPT reference(c, 7, kF64), replica(c, 7, kF64);
    AdamWOptions options{.lr = 1e-2, .weight_decay = 0.1};
    AdamW ref_opt(reference.parameters(), options);
    ShardedAdamW sharded(replica.parameters(), options);
    // Each rank keeps the moments of half of the elements (the shard is padded to equal sizes).
    int64_t total = 0;
    for (const Tensor& p : replica.parameters()) total += p.numel();
    CHECK(sharded.moment_bytes() == 2 * 8 * ((total + 1) / 2));
    Generator gen(13);
    for (int step = 0; step < 10; ++step) {
        const auto [ids, targets] = random_batch(gen, B, T);
        GPTOutput ref_out = reference.forward(ids, targets);
        ref_out.loss.backward();
        const double ref_norm = clip_grad_norm(reference.parameters(), 0.5);
        ref_opt.step(1e-2);
        ref_opt.zero_grad();
        GPTOutput out = replica.forward(ids.narrow(0, dist::rank() * half, half).contiguous(),
                                        targets.narrow(0, dist::rank() * half, half).contiguous());
        out.loss.backward();
        sharded.reduce_gradients();
        CHECK(std::abs(sharded.clip_grad_norm(0.5) - ref_norm) <= 1e-10 * ref_norm);
        sharded.step(1e-2);
        sharded.zero_grad();
    }
    const auto ref_params = reference.parameters(), rep_params = replica.parameters();
    for (size_t i = 0; i < ref_params.size(); ++i)
        CHECK(max_abs_diff(ref_params[i], rep_params[i]) < 1e-10);
    const AdamW whole = sharded.gather_full();
    CHECK(whole.steps() == 10);
    const auto ref_state = ref_opt.state(), state = whole.state();
    REQUIRE(state.size() == ref_state.size());
    for (size_t i = 0; i < state.size(); ++i) CHECK(max_abs_diff(state[i], ref_state[i]) < 1e-10);
    // ... and back: a fresh sharded optimizer loaded from the whole state gathers the same.
    ShardedAdamW reloaded(replica.parameters(), options);
    reloaded.load_full(whole);
    const auto again = reloaded.gather_full().state();
    for (size_t i = 0; i < state.size(); ++i) CHECK(max_abs_diff(again[i], state[i]) == 0);
}

TEST_CASE("replicas started with other settings or weights are refused, on every rank") {
    const std::string same = R"({"lr": 0.001, "model": {"n_embd": "16"}})";
    const std::vector<Tensor> params = {from_vector({1, 2}, {2}, kF64)};
    check_replicas_agree(same, params);  // no throw
    const std::string mine =
        dist::rank() == 0 ? same : R"({"lr": 0.001, "model": {"n_embd": "32"}})";
    const std::string message = test::error_message([&] { check_replicas_agree(mine, params); });
    CHECK(message.find("model.n_embd: \"16\" vs \"32\"") != std::string::npos);
    const std::vector<Tensor> other = {from_vector({1, 2.0 + dist::rank()}, {2}, kF64)};
    CHECK(test::error_message([&] { check_replicas_agree(same, other); }).find("other weights") !=
          std::string::npos);
}

#ifdef QK_WITH_CUDA
TEST_CASE("device tensors: sums and bucketed gradient averages across ranks") {
    // In the emulation build device tensors take the host path (a copy and MPI); with real CUDA
    // and NCCL they are summed on the device. The same checks hold either way.
    if (!cuda::device_available()) {
        MESSAGE("no CUDA device: skipped (" << std::string(cuda::backend_description()) << ")");
        return;
    }
    const int rank = dist::rank();
    Tensor t = from_vector({1.0 + rank, -2.0 * rank, 0.25}, {3}, kF64).to(Device::cuda);
    dist::all_reduce_sum(t);
    CHECK(t.to(Device::cpu).to_vector<double>() == std::vector<double>{3, -2, 0.5});
    // Two parameters on the device, one bucket each (16-byte buckets), rank r's gradient r + 1
    // times the input: the average is 1.5 times it on both ranks.
    Tensor w = from_vector({1, 2}, {2}, kF64).to(Device::cuda).requires_grad_();
    Tensor b = from_vector({3}, {1}, kF64).to(Device::cuda).requires_grad_();
    GradientSync sync({w, b}, 16, /*overlap=*/true);
    CHECK(sync.bucket_count() == 2);
    const Tensor x = from_vector({0.5, -1}, {2}, kF64).to(Device::cuda);
    (sum(w * x + b) * (1.0 + rank)).backward();
    sync.finish();
    CHECK(w.grad().device() == Device::cuda);
    CHECK(w.grad().to(Device::cpu).to_vector<double>() == std::vector<double>{0.75, -1.5});
    CHECK(b.grad().to(Device::cpu).to_vector<double>() == std::vector<double>{3});
}
#endif
