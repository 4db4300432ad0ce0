// The `cuda_attention` suite: cuda/attention.cu against the cpu kernels of ops/attention_cpu.cpp,
// forward (output, lse, signals) and backward (dq, dk, dv, the scale's per-head sums), in float32
// and float64, causal or not, capped or not, one scale or one per head, under every run order of
// the emulator (the outputs must also be bit-identical across orders: no atomics, fixed sums).
// T is ragged (45, 70: not multiples of the 16-row and 32-key tiles) and D is 16, 32 or 64;
// Tq < Tk shifts the causal mask. Then the op itself through tests/cuda_parity.h.
#include <algorithm>
#include <array>
#include <string>

#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"

using namespace qk::test;
namespace cpu = qk::cpu;
namespace cuda = qk::cuda;
using qk::AttentionShape;

namespace {

struct Case {
    int64_t batch_heads, heads, Tq, Tk, D;
    bool causal;
    double cap;
    bool per_head_scale;
    int64_t kv_heads = 0;  // 0: as many as query heads
    int64_t window = 0;
    bool fp8_logits = false;
    double qk_range = 0.8;  // q and k uniform in ±this (large: FP8 logits saturate)
};

std::string describe(const Case& c) {
    return fmt::format(
        "BH={} H={} Hkv={} Tq={} Tk={} D={} causal={} window={} cap={} per-head "
        "scale={} fp8 logits={} |q|,|k| <= {}",
        c.batch_heads, c.heads, c.kv_heads, c.Tq, c.Tk, c.D, c.causal, c.window, c.cap,
        c.per_head_scale, c.fp8_logits, c.qk_range);
}

template <class T>
struct Outputs {
    std::vector<T> out;
    std::vector<double> lse;
    std::vector<T> max_abs, entropy, dq, dk, dv, dscale, saturated;
};

template <class T>
void check_close(const Outputs<T>& got, const Outputs<T>& want) {
    CHECK(max_rel_error(got.out, want.out) <= tolerance<T>());
    CHECK(max_rel_error(got.lse, want.lse) <= tolerance<T>());  // lse is float64, from T sums
    CHECK(max_rel_error(got.max_abs, want.max_abs) <= tolerance<T>());
    CHECK(max_rel_error(got.entropy, want.entropy) <= tolerance<T>());
    // The gradients sum over up to Tk keys in a different order than the cpu's GEMMs.
    const double grad_tol = 10 * tolerance<T>();
    CHECK(max_rel_error(got.dq, want.dq) <= grad_tol);
    CHECK(max_rel_error(got.dk, want.dk) <= grad_tol);
    CHECK(max_rel_error(got.dv, want.dv) <= grad_tol);
    CHECK(max_rel_error(got.dscale, want.dscale) <= grad_tol);
    CHECK(got.saturated == want.saturated);  // counts: exact
}

// Returns how many logits the cpu counted as saturated (FP8 logits only).
template <class T>
double check_case(const Case& c, uint64_t seed) {
    CAPTURE(describe(c));
    const int64_t kv_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
    const AttentionShape sh{c.batch_heads, c.heads,  kv_heads, c.Tq,        c.Tk,
                            c.D,           c.causal, c.window, c.fp8_logits};
    const size_t nq = c.batch_heads * c.Tq * c.D;
    const size_t nk = c.batch_heads / c.heads * kv_heads * c.Tk * c.D;
    const size_t rows = c.batch_heads * c.Tq;
    auto q = random_values<T>(nq, seed, c.qk_range), k = random_values<T>(nk, seed + 1, c.qk_range);
    if (c.fp8_logits)  // multiples of 1/8: every dot exact in any order, so z̃ cannot differ
        for (auto* values : {&q, &k})
            for (T& x : *values) x = std::round(x * 8) / 8;
    const auto v = random_values<T>(nk, seed + 2), dout = random_values<T>(nq, seed + 3);
    std::vector<T> scale = random_values<T>(c.per_head_scale ? c.heads : 1, seed + 4, 0.2);
    for (T& g : scale) g += T(0.9);
    const int64_t stride = c.per_head_scale ? 1 : 0;
    const T cap = T(c.cap);

    Outputs<T> want{std::vector<T>(nq),
                    std::vector<double>(rows),
                    std::vector<T>(rows),
                    std::vector<T>(rows),
                    std::vector<T>(nq),
                    std::vector<T>(nk),
                    std::vector<T>(nk),
                    std::vector<T>(c.batch_heads),
                    std::vector<T>(c.fp8_logits ? rows : 0)};
    std::vector<T> delta(rows);
    cpu::attention_forward<T>(want.out.data(), want.lse.data(), want.max_abs.data(),
                              want.entropy.data(), c.fp8_logits ? want.saturated.data() : nullptr,
                              q.data(), k.data(), v.data(), scale.data(), stride, cap, sh);
    cpu::attention_backward<T>(want.dq.data(), want.dk.data(), want.dv.data(), want.dscale.data(),
                               delta.data(), dout.data(), q.data(), k.data(), v.data(),
                               want.out.data(), want.lse.data(), scale.data(), stride, cap, sh);

    DeviceBuffer<T> d_q(q), d_k(k), d_v(v), d_dout(dout), d_scale(scale);
    // The backward reads the cpu's out and lse, so that it is tested on exactly the same inputs.
    DeviceBuffer<T> d_out_ref(want.out), d_delta(rows);
    DeviceBuffer<double> d_lse_ref(want.lse), d_lse(rows);
    DeviceBuffer<T> d_out(nq), d_max_abs(rows), d_entropy(rows), d_saturated(rows);
    DeviceBuffer<T> d_dq(nq), d_dk(nk), d_dv(nk), d_dscale(c.batch_heads);
    std::optional<Outputs<T>> first;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::attention_forward<T>(d_out.ptr, d_lse.ptr, d_max_abs.ptr, d_entropy.ptr,
                                   c.fp8_logits ? d_saturated.ptr : nullptr, d_q.ptr, d_k.ptr,
                                   d_v.ptr, d_scale.ptr, stride, cap, sh);
        cuda::attention_backward<T>(d_dq.ptr, d_dk.ptr, d_dv.ptr, d_dscale.ptr, d_delta.ptr,
                                    d_dout.ptr, d_q.ptr, d_k.ptr, d_v.ptr, d_out_ref.ptr,
                                    d_lse_ref.ptr, d_scale.ptr, stride, cap, sh);
        Outputs<T> got{d_out.download(),
                       d_lse.download(),
                       d_max_abs.download(),
                       d_entropy.download(),
                       d_dq.download(),
                       d_dk.download(),
                       d_dv.download(),
                       d_dscale.download(),
                       c.fp8_logits ? d_saturated.download() : std::vector<T>{}};
        check_close(got, want);
        if (!first) {
            first = got;
            continue;
        }
        CHECK(got.out == first->out);  // bit-identical across run orders
        CHECK(got.dq == first->dq);
        CHECK(got.dk == first->dk);
        CHECK(got.dscale == first->dscale);
    }
    double saturated = 0;
    for (T n : want.saturated) saturated += n;
    return saturated;
}

}  // namespace

TEST_CASE("cuda attention kernels match the cpu's, float64, every variant, ragged T") {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 100;
    for (bool causal : {false, true})
        for (double cap : {0.0, 2.0})
            for (bool per_head : {false, true}) {
                check_case<double>({4, 2, 45, 45, 16, causal, cap, per_head}, seed += 10);
                check_case<double>({2, 2, 21, 70, 16, causal, cap, per_head}, seed += 10);
            }
}

TEST_CASE("cuda attention kernels at lengths around the tiles, Tq = Tk and Tq < Tk") {
    // T = 1 (a one-token prompt), 63, 64, 65, 127, 128, 129: a last visible key alone in its key
    // tile, for the cuda tiles and the cpu's alike (T ≡ 1 mod 16, 32 and 64).
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 900;
    for (int64_t T : {1, 63, 64, 65, 127, 128, 129}) {
        check_case<double>({2, 2, T, T, 16, true, 0.0, false}, seed += 10);
        if (T < 129) check_case<double>({2, 2, T, 129, 16, true, 2.0, true}, seed += 10);
    }
    check_case<double>({2, 1, 1, 1, 16, false, 0.0, false}, seed += 10);
    check_case<float>({2, 2, 65, 65, 32, true, 0.0, false}, seed += 10);
}

TEST_CASE("cuda attention kernels with grouped-query heads and sliding windows") {
    // 4 query heads on 2 or 1 key/value heads (each dk, dv a sum over its group), windows of 1, 18
    // and 29 keys against 16-row and 32-key tiles, Tq < Tk. 18 (Tq = Tk) and 29 (Tk − Tq = 43)
    // make query row 16, alone in its tile, the last to see key 31 of the first key tile.
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 1300;
    for (int64_t kv_heads : {2, 1})
        for (int64_t window : {0, 1, 18, 29}) {
            check_case<double>({8, 4, 70, 70, 16, true, 0.0, true, kv_heads, window}, seed += 10);
            check_case<double>({4, 4, 37, 80, 16, true, 2.0, false, kv_heads, window}, seed += 10);
        }
    check_case<float>({4, 2, 45, 45, 32, true, 0.0, false, 1, 17}, seed += 10);
    check_case<double>({4, 2, 45, 45, 16, false, 0.0, false, 1, 0}, seed += 10);
}

TEST_CASE("cuda attention kernels match the cpu's, float32, D = 16, 32, 64") {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 500;
    for (int64_t D : {16, 32, 64}) {
        check_case<float>({4, 2, 70, 70, D, true, 0.0, true}, seed += 10);
        check_case<float>({2, 1, 45, 45, D, false, 5.0, false}, seed += 10);
    }
    check_case<double>({2, 2, 33, 33, 64, true, 3.0, true}, seed += 10);  // the double limit
    // 130 x 64 values a head: dq's scaling and dscale run in two slices per head, combined.
    check_case<float>({2, 2, 130, 130, 64, true, 0.0, true}, seed += 10);
}

TEST_CASE("cuda attention kernels with FP8 logits: the same rounding, the same saturation counts") {
    // q, k in multiples of 1/8 up to ±12 with D = 16: logits s = g · q·k with a spread of ~190,
    // so a few percent of them saturate at 448; each dot is exact in any order, and z̃ is rounded
    // by the same integer code on both sides, so the outputs agree as closely as without FP8 and
    // the counts exactly. (A soft-cap would put two tanh implementations before the rounding,
    // which may round a z across an E4M3 step: the op-level test covers the cap on one device.)
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 1700;
    for (bool causal : {false, true})
        for (double range : {12.0, 0.8}) {  // 0.8: small logits, nothing saturates
            Case c{4, 2, 45, 45, 16, causal, 0.0, true};
            c.fp8_logits = true;
            c.qk_range = range;
            const double saturated = check_case<float>(c, seed += 10);
            CAPTURE(saturated);
            CHECK((range > 1 ? saturated > 0 : saturated == 0));
        }
}

TEST_CASE("the attention op on cuda matches the cpu, forward and every gradient") {
    for (qk::DType dtype : {qk::kF32, qk::kF64}) {
        const Inputs inputs{
            randn_seeded({2, 3, 37, 16}, 1, dtype), randn_seeded({2, 3, 37, 16}, 2, dtype),
            randn_seeded({2, 3, 37, 16}, 3, dtype), randn_seeded({3}, 4, dtype, 0.1) + 1.0};
        check_cuda_parity(
            "attention, causal, capped, per-head scale",
            [](const Inputs& in) {
                return qk::attention(in[0], in[1], in[2],
                                     {.causal = true, .scale_tensor = in[3], .softcap = 4.0});
            },
            inputs);
        check_cuda_parity("attention, plain",
                          [](const Inputs& in) { return qk::attention(in[0], in[1], in[2]); },
                          {inputs[0], inputs[1], inputs[2]});
        check_cuda_parity("attention, one key/value head for three query heads, a window of 9",
                          [](const Inputs& in) {
                              return qk::attention(in[0], in[1], in[2],
                                                   {.causal = true, .window = 9});
                          },
                          {inputs[0], randn_seeded({2, 1, 37, 16}, 5, dtype),
                           randn_seeded({2, 1, 37, 16}, 6, dtype)});
    }
}

TEST_CASE("naive attention at bf16 on cuda (tensor-core batched GEMMs) matches the cpu's") {
    // Both round q, k, v, p, dO and dS to bf16 before each GEMM. Their float32 sums differ in
    // order (~1e-7 relative), and where a value straddles a bf16 rounding midpoint the two round
    // it one bf16 step (2^-8 relative) apart: one p or dS element moves an output or gradient by
    // at most 2^-8 · |p or dS| · |v, k or q| ≲ 1e-2 here (|values| ≲ 3).
    qk::test::ParityOptions options;
    options.atol_f32 = 1e-2, options.rtol_f32 = 1e-2;
    const Inputs inputs{randn_seeded({2, 3, 37, 16}, 1), randn_seeded({2, 3, 37, 16}, 2),
                        randn_seeded({2, 3, 37, 16}, 3), randn_seeded({3}, 4, qk::kF32, 0.1) + 1.0};
    check_cuda_parity(
        "naive attention at bf16, causal, capped, per-head scale",
        [](const Inputs& in) {
            return qk::attention_unfused(in[0], in[1], in[2],
                                         {.causal = true,
                                          .scale_tensor = in[3],
                                          .softcap = 4.0,
                                          .precision = qk::Precision::bf16});
        },
        inputs, options);
    check_cuda_parity(
        "naive attention at bf16, grouped-query heads, a window of 9",
        [](const Inputs& in) {
            return qk::attention_unfused(
                in[0], in[1], in[2],
                {.causal = true, .window = 9, .precision = qk::Precision::bf16});
        },
        {inputs[0], randn_seeded({2, 1, 37, 16}, 5), randn_seeded({2, 1, 37, 16}, 6)}, options);
}

namespace {

// attention_unfused at half precision on cuda, its one-node path on or off: the output, then the
// gradients of q, k and v under the probe sum(out * r), and the names of the launches made.
struct NaiveRun {
    std::vector<qk::Tensor> results;  // out, dq, dk, dv on the cpu
    std::vector<std::string> launched;
};

NaiveRun run_naive(bool one_node, const Inputs& in, const qk::AttentionOptions& o,
                   std::array<bool, 3> wants_grad = {true, true, true}) {
    // Fresh device memory (the emulator fills it with 0xFF bytes, NaN as floats): blocks the
    // other path just freed would hold its T² values, and hide a row the node wrote too short.
    qk::cuda::empty_cache();
    const bool before = qk::use_materialized_attention(one_node);
    Inputs dev;
    for (size_t i = 0; i < in.size(); ++i) {
        dev.push_back(in[i].to(qk::Device::cuda));
        if (wants_grad[i]) dev.back().requires_grad_();
    }
    NaiveRun run;
    for (const auto& e : launches_of([&] {
             const qk::Tensor out = qk::attention_unfused(dev[0], dev[1], dev[2], o);
             const qk::Tensor r = randn_seeded(out.shape(), 77).to(qk::Device::cuda);
             qk::sum(out * r).backward();
             run.results.push_back(out.detach().to(qk::Device::cpu));
         }))
        run.launched.push_back(e.name);
    for (const qk::Tensor& t : dev)
        run.results.push_back(t.grad().defined() ? t.grad().to(qk::Device::cpu) : qk::Tensor());
    qk::use_materialized_attention(before);
    return run;
}

bool launched(const NaiveRun& run, const std::string& name) {
    return std::find(run.launched.begin(), run.launched.end(), name) != run.launched.end();
}

}  // namespace

TEST_CASE("naive attention at half precision: the one-node path gives the composition's values") {
    if (!cuda_runnable()) return;
    struct NaiveCase {
        int64_t B, H, Hkv, Tq, Tk, D;
        bool causal;
        double cap;
        qk::Precision precision;
        int64_t nan_key = -1;  // a NaN in k at this key, or none
    };
    // T = 150 and 200 make chunks of 64 query rows (3 and 4, the last ragged); Tq < Tk shifts
    // the mask, so chunk k's keys start at its first row + 20.
    const NaiveCase cases[] = {
        {2, 2, 2, 150, 150, 16, true, 0, qk::Precision::bf16},
        {1, 3, 1, 150, 170, 16, true, 4.0, qk::Precision::bf16},
        {1, 2, 2, 200, 200, 8, true, 0, qk::Precision::fp16},
        {1, 2, 2, 200, 200, 16, true, 0, qk::Precision::fp16},
        {1, 2, 2, 150, 150, 8, true, 0, qk::Precision::fp16},
        {1, 2, 2, 200, 200, 8, true, 0, qk::Precision::bf16},
        {2, 2, 2, 37, 45, 16, false, 3.0, qk::Precision::fp16},
        {1, 2, 2, 150, 150, 16, true, 0, qk::Precision::bf16, 100},
    };
    for (const NaiveCase& c : cases) {
        INFO("Tq ", c.Tq, " Tk ", c.Tk, " Hkv ", c.Hkv, " causal ", c.causal, " cap ", c.cap, " ",
             qk::precision_name(c.precision), " NaN key ", c.nan_key);
        Inputs in{randn_seeded({c.B, c.H, c.Tq, c.D}, 11),
                  randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 12),
                  randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 13)};
        if (c.nan_key >= 0) in[1].data<float>()[c.nan_key * c.D + 3] = NAN;
        const qk::AttentionOptions o{
            .causal = c.causal, .softcap = c.cap, .precision = c.precision};
        RunOrderReset reset;
        for (const std::string& order : parity_run_orders()) {
            set_parity_run_order(order);
            INFO("run order: ", order);
            const NaiveRun composed = run_naive(false, in, o), one_node = run_naive(true, in, o);
            CHECK(launched(one_node, "softmax_rounded_forward_kernel"));
            CHECK(launched(one_node, "softmax_rounded_backward_kernel"));
            CHECK_FALSE(launched(one_node, "(softmax_forward_kernel<T, false>)"));
            CHECK(launched(composed, "(softmax_forward_kernel<T, false>)"));
            for (size_t i = 0; i < 4; ++i) {
                CAPTURE(i);  // out, dq, dk, dv
                if (c.nan_key >= 0 && i == 1) {
                    // dQ = α · dS̃ k̃: the composition multiplies every row's masked zeros by the
                    // NaN key too, so its dq is NaN everywhere. The node's chunks stop at their
                    // last visible key: the rows of chunks before the NaN key's stay finite (the
                    // loss is NaN either way, from the rows that see the key).
                    const auto dq = one_node.results[1].to_vector<float>();
                    const int64_t first_chunk_rows = 64;
                    int64_t finite_early = 0, nan_late = 0;
                    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
                        for (int64_t row = 0; row < c.Tq; ++row)
                            for (int64_t d = 0; d < c.D; ++d) {
                                const float v = dq[size_t((bh * c.Tq + row) * c.D + d)];
                                finite_early += row < first_chunk_rows && std::isfinite(v);
                                nan_late += row >= c.nan_key && std::isnan(v);
                            }
                    CHECK(finite_early == c.B * c.H * first_chunk_rows * c.D);
                    CHECK(nan_late == (c.Tq - c.nan_key) * c.D);  // the head with the NaN
                    continue;
                }
#ifdef QK_CUDA_EMULATION
                // The same GEMM sums less their zero terms, the same softmax instructions.
                CHECK(parity_mismatch(one_node.results[i], composed.results[i], 0, 0) == "");
#else
                // cuBLAS may split the shorter sums differently: a last-bit change in s or dP
                // moves a rounded p or dS by one step at most (see the parity test above).
                CHECK(parity_mismatch(one_node.results[i], composed.results[i], 1e-2, 1e-2) == "");
#endif
            }
        }
    }
}

TEST_CASE("naive attention at half precision: the one node makes only the gradients wanted") {
    if (!cuda_runnable()) return;
    const Inputs in{randn_seeded({1, 2, 150, 16}, 21), randn_seeded({1, 2, 150, 16}, 22),
                    randn_seeded({1, 2, 150, 16}, 23)};
    const qk::AttentionOptions o{.causal = true, .precision = qk::Precision::bf16};
    for (const std::array<bool, 3> wants :
         {std::array{true, false, false}, std::array{false, true, false},
          std::array{false, false, true}, std::array{true, false, true}}) {
        INFO("q, k, v want gradients: ", wants[0], wants[1], wants[2]);
        const NaiveRun composed = run_naive(false, in, o, wants),
                       one_node = run_naive(true, in, o, wants);
        CHECK(parity_mismatch(one_node.results[0], composed.results[0], 0, 0) == "");
        for (size_t i = 0; i < 3; ++i) {
            CAPTURE(i);
            REQUIRE(one_node.results[1 + i].defined() == wants[i]);
            if (wants[i])
                CHECK(parity_mismatch(one_node.results[1 + i], composed.results[1 + i], 0, 0) ==
                      "");
        }
        // dP and dS only when q or k wants a gradient.
        CHECK(launched(one_node, "softmax_rounded_backward_kernel") == (wants[0] || wants[1]));
    }
}

TEST_CASE("naive attention at bf16, causal, T = 1024: the one-node path moves 2/3 of the bytes") {
    if (!cuda_runnable()) return;
#ifndef QK_CUDA_EMULATION
    return;  // a dry run is the emulator's
#endif
    // One layer's attention at GPT-2's context, recorded, not run: the composition writes and
    // reads S, P, dP and dS in float32 over whole rows; the node writes P and dS rounded only,
    // and its GEMMs stop at each chunk's last visible key.
    const auto bytes = [](bool one_node) {
        const bool before = qk::use_materialized_attention(one_node);
        Inputs dev;
        for (int i = 0; i < 3; ++i)
            dev.push_back(
                qk::Tensor::empty({1, 2, 1024, 64}, qk::kF32, qk::Device::cuda).requires_grad_());
        cuda::ledger::open(false, /*dry_run=*/true);
        const qk::Tensor out = qk::attention_unfused(
            dev[0], dev[1], dev[2], {.causal = true, .precision = qk::Precision::bf16});
        qk::sum(out).backward();
        double total = 0;
        for (const auto& e : cuda::ledger::close()) total += e.bytes;
        qk::use_materialized_attention(before);
        return total;
    };
    const double composed = bytes(false), one_node = bytes(true);
    MESSAGE("bytes of one causal layer: composition ", composed / 1e6, " MB, one node ",
            one_node / 1e6, " MB (", one_node / composed, "x)");
    CHECK(one_node <= 0.7 * composed);  // 0.63 with 4 chunks (0.64 with 8: more re-reads of k, v)
}

TEST_CASE("the attention op refuses head dims the cuda kernel cannot hold") {
    if (!cuda_runnable()) return;
    qk::Tensor q = randn_seeded({1, 1, 4, 130}, 1).to(qk::Device::cuda);
    CHECK(throws_with([&] { qk::attention(q, q, q); }, {"attention", "D <= 128"}));
    qk::Tensor q64 = randn_seeded({1, 1, 4, 72}, 1, qk::kF64).to(qk::Device::cuda);
    CHECK(throws_with([&] { qk::attention(q64, q64, q64); }, {"attention", "D <= 64"}));
}
