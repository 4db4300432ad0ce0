// The `cuda_attention_mma` suite: the tensor-core forward (cuda/attention_mma.cu) against the
// cpu's fused kernel on the same bf16 (or fp16) inputs, under every run order of the emulator,
// and the attention op at bf16 precision on cuda (which takes that path) against the cpu's,
// forward and every gradient.
//
// The tolerance, derived. Both sides read the same rounded q, k, v and sum exact products, so the
// logits, lse, max |s| and entropy differ only by float32's summation order (tolerance<float>).
// The output differs by one more rounding: the kernel rounds each e_ij = exp(z_ij − m) to H before
// O += P V. With u the unit roundoff of H (2^-8 for bf16, 2^-11 for fp16), |Δe| <= u·e (+ 2^-25
// for fp16, whose subnormals stop below 2^-14), so, dividing by l = Σ e,
//     |Δo_id| <= u · Σ_j p_ij |v_jd|  (+ 2^-25 · Σ_j |v_jd| in fp16).
// The backward, on tensor cores too, rounds dO, P and dS to H before their products, and reads
// the kernel's o in D_i = dO_i · o_i. Per pair, with ε_ij = u Σ_d |dO_id v_jd| (dP from the rounded
// dO) and δ_i = Σ_d |dO_id| · bound(o_id) (D_i from the kernel's o):
//     |Δds_ij| <= σ_ij = p_ij (ε_ij + δ_i + u |dp_ij − D_i|)        (the cap factor is <= 1)
//     |Δdq_id| <= g Σ_j σ_ij |k_jd|,   |Δdk_jd| <= g Σ_i σ_ij |q_id|,   |Δdg| <= Σ_ij σ_ij |r_ij|,
//     |Δdv_jd| <= 2u Σ_i p_ij |dO_id|                                 (P and dO rounded).
// Each bound is computed here per element in float64 from the cpu's own p, plus float32's slack.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/minifloat.h"
#include "cuda_kernel_check.h"
#include "cuda_parity.h"
#include "helpers.h"
#include "qk.h"

using namespace qk;
using namespace qk::test;

namespace {

struct Case {
    int64_t batch_heads, heads, kv_heads, Tq, Tk, D;
    bool causal = true;
    int64_t window = 0;
    double cap = 0;
    bool per_head_scale = false;
    bool fp8_logits = false;
    double qk_range = 1.0;
    double scale_sign = 1;   // g's centre times this: −1 negative, 0 both signs about 0
    bool one_scale = false;  // check_op: one g for every head (a (1) tensor), else one a head
};

std::string describe(const Case& c) {
    return fmt::format(
        "BH={} H={} Hkv={} Tq={} Tk={} D={} causal={} window={} cap={} per-head "
        "scale={} fp8 logits={} |q|,|k| ~ {} scale sign {}",
        c.batch_heads, c.heads, c.kv_heads, c.Tq, c.Tk, c.D, c.causal, c.window, c.cap,
        c.per_head_scale, c.fp8_logits, c.qk_range, c.scale_sign);
}

template <class H>
constexpr double unit_roundoff() {
    return std::is_same_v<H, bf16> ? 0x1p-8 : 0x1p-11;
}

// Values rounded to H, as float (what both kernels compute with) and as H (what the mma reads).
template <class H>
struct Rounded {
    std::vector<float> value;
    std::vector<H> half;
    Rounded(size_t n, uint64_t seed, double scale, bool eighths = false) {
        for (float x : random_values<float>(n, seed, scale)) {
            if (eighths) x = std::round(x * 8) / 8;  // FP8 logits: every dot exact in any order
            half.push_back(H(x));
            value.push_back(float(half.back()));
        }
    }
};

// p_ij of every (row, key) pair from the cpu's lse, in float64: (BH, Tq, Tk), 0 where hidden.
std::vector<double> probabilities(const Case& c, const AttentionShape& sh,
                                  const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& scale, const std::vector<double>& lse) {
    std::vector<double> p(size_t(c.batch_heads * c.Tq * c.Tk), 0.0);
    for (int64_t bh = 0; bh < c.batch_heads; ++bh) {
        const double g = scale[c.per_head_scale ? bh % c.heads : 0];
        const int64_t kv = sh.kv_head(bh);
        for (int64_t i = 0; i < c.Tq; ++i)
            for (int64_t j = sh.first_key(i); j < sh.end_key(i); ++j) {
                double r = 0;
                for (int64_t d = 0; d < c.D; ++d)
                    r += double(q[(bh * c.Tq + i) * c.D + d]) * k[(kv * c.Tk + j) * c.D + d];
                double z = c.cap > 0 ? c.cap * std::tanh(g * r / c.cap) : g * r;
                if (c.fp8_logits) z = FastRounder(MiniFormat::e4m3, Overflow::saturate)(float(z));
                p[(bh * c.Tq + i) * c.Tk + j] = std::exp(z - lse[bh * c.Tq + i]);
            }
    }
    return p;
}

// The bound on |Δo| above, per output element.
template <class H>
std::vector<double> output_bound(const Case& c, const AttentionShape& sh,
                                 const std::vector<double>& p, const std::vector<float>& v) {
    std::vector<double> bound(size_t(c.batch_heads * c.Tq * c.D), 0.0);
    const bool fp16 = std::is_same_v<H, f16>;
    for (int64_t bh = 0; bh < c.batch_heads; ++bh)
        for (int64_t i = 0; i < c.Tq; ++i)
            for (int64_t d = 0; d < c.D; ++d) {
                double pv = 0, sum_v = 0;
                for (int64_t j = sh.first_key(i); j < sh.end_key(i); ++j) {
                    const double vj = std::abs(v[(sh.kv_head(bh) * c.Tk + j) * c.D + d]);
                    pv += p[(bh * c.Tq + i) * c.Tk + j] * vj;
                    sum_v += vj;
                }
                bound[(bh * c.Tq + i) * c.D + d] =
                    unit_roundoff<H>() * pv + (fp16 ? 0x1p-25 * sum_v : 0.0);
            }
    return bound;
}

// Whether every element keeps |got − want| <= bound + slack · max(1, max |want|); a failure
// shows the worst ratio of an error to its bound.
template <class G, class W>
bool within_bound(const std::vector<G>& got, const std::vector<W>& want,
                  const std::vector<double>& bound, double slack) {
    REQUIRE(got.size() == want.size());
    double scale = 1, worst = 0;
    for (W w : want) scale = std::max(scale, std::abs(double(w)));
    int64_t beyond = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double allowed = bound[i] + slack * scale;
        const double error = std::abs(double(got[i]) - double(want[i]));
        beyond += !(error <= allowed);
        worst = std::max(worst, error / allowed);
    }
    CAPTURE(worst);
    CHECK(beyond == 0);
    return beyond == 0;
}

double max_abs_value(const std::vector<double>& x) {
    double m = 1;
    for (double v : x)
        if (std::isfinite(v)) m = std::max(m, std::abs(v));
    return m;
}

template <class H>
void check_forward(const Case& c, uint64_t seed) {
    CAPTURE(describe(c));
    const AttentionShape sh{c.batch_heads, c.heads,  c.kv_heads, c.Tq,        c.Tk,
                            c.D,           c.causal, c.window,   c.fp8_logits};
    const size_t nq = size_t(c.batch_heads * c.Tq * c.D),
                 nk = size_t(c.batch_heads / c.heads * c.kv_heads * c.Tk * c.D),
                 rows = size_t(c.batch_heads * c.Tq);
    const double qk_scale = c.qk_range / std::sqrt(std::sqrt(double(c.D)));
    const Rounded<H> q(nq, seed, qk_scale, c.fp8_logits), k(nk, seed + 1, qk_scale, c.fp8_logits),
        v(nk, seed + 2, 1.0);
    std::vector<float> scale = random_values<float>(c.per_head_scale ? c.heads : 1, seed + 3, 0.1);
    for (float& g : scale) g += float(c.scale_sign);
    const int64_t stride = c.per_head_scale ? 1 : 0;
    std::vector<float> out(nq), max_abs(rows), entropy(rows), saturated(rows);
    std::vector<double> lse(rows);
    cpu::attention_forward<float>(out.data(), lse.data(), max_abs.data(), entropy.data(),
                                  c.fp8_logits ? saturated.data() : nullptr, q.value.data(),
                                  k.value.data(), v.value.data(), scale.data(), stride,
                                  float(c.cap), sh);
    const auto bound =
        output_bound<H>(c, sh, probabilities(c, sh, q.value, k.value, scale, lse), v.value);

    DeviceBuffer<H> d_q(q.half), d_k(k.half), d_v(v.half);
    DeviceBuffer<float> d_scale(scale), d_out(nq), d_max_abs(rows), d_entropy(rows),
        d_saturated(rows);
    DeviceBuffer<double> d_lse(rows);
    std::optional<std::vector<float>> first;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        cuda::attention_forward_mma<H>(d_out.ptr, d_lse.ptr, d_max_abs.ptr, d_entropy.ptr,
                                       c.fp8_logits ? d_saturated.ptr : nullptr, d_q.ptr, d_k.ptr,
                                       d_v.ptr, d_scale.ptr, stride, float(c.cap), sh);
        const auto got = d_out.download();
        CHECK(within_bound(got, out, bound, tolerance<float>()));
        CHECK(max_rel_error(d_lse.download(), lse) <= tolerance<float>());
        CHECK(max_rel_error(d_max_abs.download(), max_abs) <= tolerance<float>());
        // H_i = lse_i − w_i / l_i: two terms of lse's size cancel (to ~1 when p is peaky and the
        // logits reach 60), so float32's reordering shows at lse's scale, not H's.
        const std::vector<double> entropy_bound(rows, tolerance<float>() * max_abs_value(lse));
        CHECK(within_bound(d_entropy.download(), entropy, entropy_bound, 0));
        if (c.fp8_logits) CHECK(d_saturated.download() == saturated);  // counts: exact
        if (!first)
            first = got;
        else
            CHECK(got == *first);  // bit-identical across run orders
    }
}

}  // namespace

TEST_CASE(
    "tensor-core attention forward: tile edges, Tq < Tk, a KV-cache query, D = 64, 128, 256") {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 100;
    for (int64_t T : {1, 63, 65, 130}) check_forward<bf16>({2, 2, 2, T, T, 64}, seed += 10);
    check_forward<bf16>({2, 2, 2, 70, 70, 64, false}, seed += 10);
    check_forward<bf16>({2, 2, 2, 33, 100, 64}, seed += 10);  // the causal mask shifted
    check_forward<bf16>({2, 2, 2, 3, 100, 64, false}, seed += 10);
    check_forward<bf16>({2, 1, 1, 70, 70, 128}, seed += 10);
    check_forward<bf16>({2, 2, 1, 70, 70, 256}, seed += 10);  // Gemma 3's head size
    check_forward<bf16>({2, 2, 2, 1, 300, 64}, seed += 10);   // one new token against a KV cache
}

TEST_CASE("tensor-core attention's tile masks give the per-pair rule's answers") {
    // Each tile's mask in 32-bit offsets, and the ranges of tiles every pair of which is seen
    // (the plain rule's), against first_key(i) <= j < end_key(i) pair by pair: ragged ends, Tq
    // below and above Tk, windows narrower and wider than a tile.
    const int64_t lengths[] = {1,  2,   63,  64,  65,
                               66, 128, 130, 257, 400};  // every shift mod 64 near 0
    int64_t shapes = 0;
    for (int64_t Tq : lengths)
        for (int64_t Tk : lengths)
            for (bool causal : {false, true})
                for (int64_t window : {0, 1, 20, 63, 64, 65, 150}) {
                    if (causal && Tq > Tk) continue;
                    const AttentionShape sh{1, 1, 1, Tq, Tk, 64, causal, window};
                    CAPTURE(Tq);
                    CAPTURE(Tk);
                    CAPTURE(causal);
                    CAPTURE(window);
                    CHECK(cuda::attention_mma_mask_mismatches(sh) == 0);
                    ++shapes;
                }
    CHECK(shapes == 1085);
}

namespace {

// Logits past float32's integers (~1e9–1e10), and g·r overflowing float32 from a finite r: the
// kernel against the cpu's, row by row. Finite rows: lse to float32's relative precision and the
// output within 2^-7 of its values' scale (p is one-hot here, so o is a value row); rows whose
// logits overflow: NaN, as on the cpu (a NaN row, never a row that looks as if it saw nothing).
template <class H>
void check_large_logits(double value_scale, float g, bool constant, int64_t T, bool causal,
                        uint64_t seed) {
    CAPTURE(value_scale);
    CAPTURE(g);
    const int64_t D = 64, BH = 2;
    const AttentionShape sh{BH, BH, BH, T, T, D, causal};
    const size_t n = size_t(BH * T * D);
    Rounded<H> q(n, seed, value_scale), k(n, seed + 1, value_scale);
    if (constant) {  // every r = 64·c², finite; g·r past float32's largest value
        for (size_t i = 0; i < n; ++i) {
            q.half[i] = k.half[i] = H(float(value_scale));
            q.value[i] = k.value[i] = float(q.half[i]);
        }
    }
    const Rounded<H> v(n, seed + 2, 1.0);
    const std::vector<float> scale{g};
    std::vector<float> out(n);
    std::vector<double> lse(size_t(BH * T));
    cpu::attention_forward<float>(out.data(), lse.data(), nullptr, nullptr, nullptr, q.value.data(),
                                  k.value.data(), v.value.data(), scale.data(), 0, 0.0f, sh);
    DeviceBuffer<H> d_q(q.half), d_k(k.half), d_v(v.half);
    DeviceBuffer<float> d_scale(scale), d_out(n);
    DeviceBuffer<double> d_lse(size_t(BH * T));
    cuda::attention_forward_mma<H>(d_out.ptr, d_lse.ptr, nullptr, nullptr, nullptr, d_q.ptr,
                                   d_k.ptr, d_v.ptr, d_scale.ptr, 0, 0.0f, sh);
    const auto got = d_out.download();
    const auto got_lse = d_lse.download();
    int64_t wrong = 0, nan_rows = 0;
    for (int64_t row = 0; row < BH * T; ++row) {
        const double want = lse[size_t(row)], have = got_lse[size_t(row)];
        if (std::isnan(want)) {
            ++nan_rows;
            wrong += !std::isnan(have);
            continue;
        }
        wrong += !(std::abs(have - want) <= tolerance<float>() * std::abs(want));
        for (int64_t d = 0; d < D; ++d) {
            const size_t at = size_t(row * D + d);
            wrong += !(std::abs(double(got[at]) - out[at]) <= 0x1p-7 * 4.0);
        }
    }
    CHECK(wrong == 0);
    CHECK(nan_rows == (constant ? BH * T : 0));
}

}  // namespace

TEST_CASE("tensor-core attention forward: logits past float32's integers, and g·r overflowing") {
    if (!cuda_device_or_skip()) return;
    check_large_logits<bf16>(4e4, 1.1f, false, 130, true, 700);  // logits ~1e10
    check_large_logits<f16>(1e4, 1.1f, false, 130, true, 710);  // ~1e9: e over 65504 is inf in fp16
    check_large_logits<bf16>(4e4, -1.1f, false, 130, true, 720);  // the same through q negated
    // r = 9.2e37, g·r = inf, on rows whose every tile is plain (no masked tile to turn them NaN).
    check_large_logits<bf16>(1.2e18, 6.0f, true, 128, false, 730);
}

TEST_CASE("tensor-core attention forward: grouped-query heads, windows, caps, scales, FP8, fp16") {
    if (!cuda_device_or_skip()) return;
    uint64_t seed = 300;
    check_forward<bf16>({4, 4, 1, 70, 70, 64}, seed += 10);                      // 4 heads read one
    check_forward<bf16>({4, 4, 2, 130, 130, 64, true, 37}, seed += 10);          // window of 37
    check_forward<bf16>({2, 2, 2, 70, 70, 64, true, 0, 5.0, true}, seed += 10);  // cap, per head
    check_forward<bf16>({2, 2, 2, 70, 70, 64, true, 0, 0, false, false, 4.0}, seed += 10);  // peaky
    Case fp8{2, 2, 2, 70, 70, 64, true, 0, 0, false, true, 3.0};  // large: some saturate
    check_forward<bf16>(fp8, seed += 10);
    check_forward<f16>({2, 2, 2, 70, 70, 64}, seed += 10);
    check_forward<f16>({2, 1, 1, 65, 65, 128, false, 0, 3.0}, seed += 10);
    // A negative scale, logits far apart: a tile's max taken over g·r's minimum would overflow
    // exp; and scales of both signs in one launch, at D = 256 too.
    check_forward<bf16>({2, 2, 2, 130, 130, 64, true, 0, 0, false, false, 4.0, -1}, seed += 10);
    check_forward<bf16>({4, 4, 2, 130, 130, 128, true, 0, 0, true, false, 4.0, 0}, seed += 10);
    check_forward<bf16>({2, 2, 1, 130, 130, 256, true, 0, 0, true, false, 4.0, -1}, seed += 10);
}

namespace {

std::vector<double> host_values(const Tensor& t) {
    return t.detach().to(Device::cpu).to(kF64).contiguous().to_vector<double>();
}

struct OpResult {
    std::vector<double> out, dq, dk, dv, dscale;
};

// strided_probe: dO arrives as a transposed view of (B, T, H, D), as c_proj's input gradient
// does in the model (the backward reads it through its strides).
OpResult run_op(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                const Tensor& probe, AttentionOptions o, Device device,
                bool strided_probe = false) {
    const auto leaf = [&](const Tensor& t) { return t.to(device).detach().requires_grad_(); };
    Tensor qd = leaf(q), kd = leaf(k), vd = leaf(v), gd = leaf(g);
    o.scale_tensor = gd;
    const Tensor out = attention(qd, kd, vd, o);
    const Tensor dout = probe.to(device);
    out.backward(strided_probe ? dout.transpose(1, 2).contiguous().transpose(1, 2) : dout);
    return {host_values(out), host_values(qd.grad()), host_values(kd.grad()),
            host_values(vd.grad()), host_values(gd.grad())};
}

// The bounds of the header, from q, k, v rounded to bf16, g and the probe dO, in float64.
struct GradBounds {
    std::vector<double> out, dq, dk, dv, dscale;
};

GradBounds bounds_for(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& g,
                      const std::vector<double>& dout) {
    const AttentionShape sh{c.batch_heads, c.heads, c.kv_heads, c.Tq,
                            c.Tk,          c.D,     c.causal,   c.window};
    const int64_t D = c.D;
    const double u = 0x1p-8;
    GradBounds b{std::vector<double>(q.size()), std::vector<double>(q.size()),
                 std::vector<double>(k.size()), std::vector<double>(k.size()),
                 std::vector<double>(g.size())};  // one g a head, or one for all
    std::vector<double> r(size_t(c.Tk)), p(size_t(c.Tk)), dp(size_t(c.Tk)), eps(size_t(c.Tk));
    for (int64_t bh = 0; bh < c.batch_heads; ++bh) {
        const int64_t kv = sh.kv_head(bh);
        const size_t h = g.size() == 1 ? 0 : size_t(bh % c.heads);  // this head's g
        const double gh = g[h];
        const double* kh = k.data() + kv * c.Tk * D;
        const double* vh = v.data() + kv * c.Tk * D;
        for (int64_t i = 0; i < c.Tq; ++i) {
            const int64_t row = bh * c.Tq + i, first = sh.first_key(i), end = sh.end_key(i);
            const double* dO = dout.data() + row * D;
            double m = -INFINITY, l = 0, D_i = 0;
            for (int64_t j = first; j < end; ++j) {
                r[j] = dp[j] = eps[j] = 0;
                for (int64_t d = 0; d < D; ++d) {
                    r[j] += q[row * D + d] * kh[j * D + d];
                    dp[j] += dO[d] * vh[j * D + d];
                    eps[j] += u * std::abs(dO[d] * vh[j * D + d]);  // dO rounded in dP = dO·v
                }
                const double s = gh * r[j];
                p[j] = c.cap > 0 ? c.cap * std::tanh(s / c.cap) : s;  // z, for now
                m = std::max(m, p[j]);
            }
            for (int64_t j = first; j < end; ++j) l += std::exp(p[j] - m);
            for (int64_t j = first; j < end; ++j) {
                p[j] = std::exp(p[j] - m) / l;
                D_i += p[j] * dp[j];
            }
            double delta = 0;  // δ_i: D_i read with the kernel's o
            for (int64_t d = 0; d < D; ++d) {
                double pv = 0;
                for (int64_t j = first; j < end; ++j) pv += p[j] * std::abs(vh[j * D + d]);
                b.out[row * D + d] = u * pv;
                delta += std::abs(dO[d]) * b.out[row * D + d];
            }
            for (int64_t j = first; j < end; ++j) {
                // σ_ij: dP's rounded dO, D_i's o, and ds itself rounded before its product.
                const double sigma = p[j] * (eps[j] + delta + u * std::abs(dp[j] - D_i));
                b.dscale[h] += sigma * std::abs(r[j]);
                for (int64_t d = 0; d < D; ++d) {
                    b.dq[row * D + d] += std::abs(gh) * sigma * std::abs(kh[j * D + d]);
                    b.dk[(kv * c.Tk + j) * D + d] +=
                        std::abs(gh) * sigma * std::abs(q[row * D + d]);
                    b.dv[(kv * c.Tk + j) * D + d] += 2 * u * p[j] * std::abs(dO[d]);  // P, dO
                }
            }
        }
    }
    return b;
}

void check_op(const Case& c, uint64_t seed) {
    CAPTURE(describe(c));
    const int64_t B = c.batch_heads / c.heads;
    const Tensor q = randn_seeded({B, c.heads, c.Tq, c.D}, seed, kF32, c.qk_range),
                 k = randn_seeded({B, c.kv_heads, c.Tk, c.D}, seed + 1, kF32, c.qk_range),
                 v = randn_seeded({B, c.kv_heads, c.Tk, c.D}, seed + 2),
                 probe = randn_seeded({B, c.heads, c.Tq, c.D}, seed + 3),
                 g = randn_seeded({c.one_scale ? 1 : c.heads}, seed + 4, kF32, 0.02) +
                     0.125 * c.scale_sign;
    const AttentionOptions o{
        .causal = c.causal, .window = c.window, .softcap = c.cap, .precision = Precision::bf16};
    const OpResult want = run_op(q, k, v, g, probe, o, Device::cpu);
    const auto rounded = [](const Tensor& t) { return host_values(t.to(kBF16)); };
    const GradBounds b =
        bounds_for(c, rounded(q), rounded(k), rounded(v), host_values(g), host_values(probe));
    const double grad_slack = 10 * tolerance<float>();  // the float32 kernels' own reordering
    std::optional<OpResult> first;
    for (Order order : kOrders) {
        CAPTURE(order_name(order));
        RunOrderScope scope(order);
        const OpResult got = run_op(q, k, v, g, probe, o, Device::cuda, order == kOrders[0]);
        CHECK(within_bound(got.out, want.out, b.out, tolerance<float>()));
        CHECK(within_bound(got.dq, want.dq, b.dq, grad_slack));
        CHECK(within_bound(got.dk, want.dk, b.dk, grad_slack));
        CHECK(within_bound(got.dv, want.dv, b.dv, grad_slack));
        CHECK(within_bound(got.dscale, want.dscale, b.dscale, grad_slack));
        if (!first) {
            first = got;
            continue;
        }
        CHECK((got.dq == first->dq && got.dk == first->dk && got.dv == first->dv &&
               got.dscale == first->dscale));  // bit-identical across run orders
    }
}

}  // namespace

TEST_CASE("the attention op at bf16 precision on cuda (tensor cores) against the cpu's gradients") {
    if (!cuda_device_or_skip()) return;
    check_op({4, 2, 2, 70, 70, 64, true, 0, 5.0}, 500);  // causal, capped, a scale per head
    check_op({4, 4, 1, 65, 65, 64, true, 20}, 510);      // 4 heads read one, a window
    check_op({2, 2, 2, 33, 80, 128, false, 0, 0, true, false, 2.0}, 520);  // Tq < Tk, D = 128
    check_op({2, 2, 1, 70, 70, 256, true, 0, 5.0}, 530);  // D = 256: a warp per key gradient
    // Tiles off the mask's edge, no cap: the backward's branch-free rule (two heads read one).
    check_op({2, 2, 1, 130, 130, 64, true}, 540);
    check_op({2, 2, 2, 64, 128, 128, false}, 550);  // every tile fully visible, D = 128
    // D = 256 off the mask's edge: two warps share each key's gradients, Sᵀ handed over.
    check_op({2, 2, 1, 130, 130, 256, true}, 560);
    // One query head per key head: dK multiplied by g once, after its sums; here g < 0 too.
    check_op({2, 2, 2, 130, 130, 64, true, 0, 0, false, false, 4.0, -1}, 570);
    check_op({2, 2, 2, 130, 130, 256, true}, 580);
    // One g for the 4 query heads that read a key head: dK times g once, across heads.
    check_op({4, 4, 1, 130, 130, 64, true, 0, 0, false, false, 1.0, 1, true}, 590);
}

TEST_CASE("tensor-core attention writes its output's rounding for c_proj in the same pass") {
    if (!cuda_runnable()) return;
    // The heads merged back into (B, T, H·D) are a view of the kernel's buffer, whose kept cast
    // copy c_proj's GEMM reads: equal, bit for bit, to the output rounded afterwards.
    for (Precision precision : {Precision::bf16, Precision::fp16}) {
        CAPTURE(precision_name(precision));
        const DType half = precision == Precision::bf16 ? kBF16 : kF16;
        const Tensor q = randn_seeded({2, 3, 67, 64}, 601, kF32).to(Device::cuda),
                     k = randn_seeded({2, 3, 67, 64}, 602, kF32).to(Device::cuda),
                     v = randn_seeded({2, 3, 67, 64}, 603, kF32).to(Device::cuda);
        const Tensor out = attention(q, k, v, {.causal = true, .precision = precision});
        const Tensor merged = out.transpose(1, 2).reshape({2, 67, 3 * 64});
        REQUIRE(has_kept_cast(merged, half));
        const Tensor kept = cast_once(merged, half), fresh = merged.clone().to(half);
        CHECK(max_abs_diff(kept.to(kF32), fresh.to(kF32)) == 0);
        mark_written(merged);  // a write makes the copy stale
        CHECK_FALSE(has_kept_cast(merged, half));
    }
}

TEST_CASE("tensor-core attention reads a QK-norm's kept rounding of q and k, the same bits") {
    if (!cuda_runnable()) return;
    // q and k from per-head LayerNorms that write their bf16 rounding beside their output: the
    // attention rounds only v (one copy, a third of the bytes), and its output and gradients are
    // those of q and k rounded by the attention itself, bit for bit.
    const Tensor x = randn_seeded({2, 3, 67, 64}, 611, kF32).to(Device::cuda),
                 w = randn_seeded({64}, 612, kF32).to(Device::cuda),
                 v = randn_seeded({2, 3, 67, 64}, 613, kF32).to(Device::cuda),
                 probe = randn_seeded({2, 3, 67, 64}, 614, kF32).to(Device::cuda);
    const AttentionOptions o{.causal = true, .precision = Precision::bf16};
    auto run = [&](bool kept) {
        Tensor xq = x.clone().requires_grad_(), xk = (x * 0.5).detach().requires_grad_();
        const Precision rounded = kept ? Precision::bf16 : Precision::full;
        const Tensor q = layer_norm(xq, w, {}, 1e-5, rounded),
                     k = layer_norm(xk, w, {}, 1e-5, rounded);
        CHECK(has_kept_cast(q, kBF16) == kept);
        Tensor out;
        const auto forward = qk::test::launches_of([&] { out = attention(q, k, v, o); });
        double copied = 0;
        for (const auto& e : forward)
            if (e.name.find("copy") != std::string::npos) copied += e.bytes;
        out.backward(probe);
        return std::tuple{host_values(out), host_values(xq.grad()), host_values(xk.grad()), copied};
    };
    const auto [out_kept, dq_kept, dk_kept, copied_kept] = run(true);
    const auto [out_fresh, dq_fresh, dk_fresh, copied_fresh] = run(false);
    CHECK(out_kept == out_fresh);
    CHECK(dq_kept == dq_fresh);
    CHECK(dk_kept == dk_fresh);
    CHECK(copied_kept * 3 == doctest::Approx(copied_fresh));  // v alone: 6 of 18 bytes a value
}

TEST_CASE("tensor-core attention backward: a scale number folds g into dQ, the same bits") {
    if (!cuda_device_or_skip()) return;
    // A scale number wants no gradient for g: the dq kernel multiplies by g itself, where a scale
    // tensor's backward takes the finishing pass (which also sums g's gradient). Same products.
    const Tensor q = randn_seeded({2, 2, 70, 64}, 600), k = randn_seeded({2, 2, 70, 64}, 601),
                 v = randn_seeded({2, 2, 70, 64}, 602), probe = randn_seeded({2, 2, 70, 64}, 603);
    auto dq_of = [&](bool as_tensor) {
        AttentionOptions o{.causal = true, .precision = Precision::bf16};
        if (as_tensor)
            o.scale_tensor = full({1}, 0.3, kF32).to(Device::cuda).requires_grad_();
        else
            o.scale = 0.3;
        Tensor qd = q.to(Device::cuda).detach().requires_grad_();
        const auto launches = qk::test::launches_of([&] {
            attention(qd, k.to(Device::cuda), v.to(Device::cuda), o)
                .backward(probe.to(Device::cuda));
        });
        long finishing = 0;
        for (const auto& e : launches)
            finishing += e.name.find("attention_scale_kernel") != std::string::npos;
        CHECK(finishing == (as_tensor ? 1 : 0));
        return host_values(qd.grad());
    };
    CHECK(dq_of(false) == dq_of(true));
}
