// The attention layer (nn/model/attention.cpp) of every variant and family block against plain
// loops over b, h, i, j: its output and its stability signals, fused and naive, in float64.
#include <cmath>
#include <complex>
#include <tuple>

#include "helpers.h"
#include "nn/model/attention.h"
#include "nn_variants.h"

using namespace qk;
using namespace qk::nn;
using qk::test::ends_with;
using qk::test::mean_of;
using qk::test::tiny_config;
using qk::test::variants;

// ---- attention against naive loops ---------------------------------------------------------

namespace {

using Values = std::vector<double>;

// Normalises v[0..n) in place like the variant's norm: gain w and bias b may be empty.
void naive_norm(double* v, int64_t n, const GPTConfig& c, const Values& w, const Values& b,
                double eps) {
    if (c.qk_norm == QKNorm::l2 || c.qk_norm == QKNorm::lp) {
        const double p = c.qk_norm == QKNorm::l2 ? 2.0 : c.lp_p;
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::pow(std::abs(v[i]), p);
        const double denom = std::max(std::pow(s, 1 / p), 1e-12);
        for (int64_t i = 0; i < n; ++i) v[i] /= denom;
        return;
    }
    double mean = 0, ms = 0;
    if (c.qk_norm == QKNorm::layernorm)
        for (int64_t i = 0; i < n; ++i) mean += v[i] / n;
    for (int64_t i = 0; i < n; ++i) ms += (v[i] - mean) * (v[i] - mean) / n;
    const double offset = c.norm_unit_offset ? 1.0 : 0.0;  // Gemma's (1 + w)
    for (int64_t i = 0; i < n; ++i)
        v[i] = (v[i] - mean) / std::sqrt(ms + eps) * (offset + w[i]) + (b.empty() ? 0.0 : b[i]);
}

Values values(const Tensor& t) { return t.defined() ? t.to_vector<double>() : Values{}; }

// RoPE on one head vector v[0..D) at position t, as complex numbers: pair i is v_i + i·v_{i+D/2},
// multiplied by e^{i·t·θ^(−2i/D)}.
void naive_rope(double* v, int64_t D, int64_t t, double theta) {
    for (int64_t i = 0; i < D / 2; ++i) {
        const std::complex<double> z(v[i], v[i + D / 2]);
        const std::complex<double> turned = z * std::polar(1.0, t * std::pow(theta, -2.0 * i / D));
        v[i] = turned.real(), v[i + D / 2] = turned.imag();
    }
}

// y = x Wᵀ + b over rows of x: (rows, in) -> (rows, out).
Values naive_linear(const Values& x, const Linear& lin) {
    const Values w = values(lin.weight), b = values(lin.bias);
    const int64_t out = lin.weight.size(0), in = lin.weight.size(1), rows = x.size() / in;
    Values y(rows * out);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
            double s = b.empty() ? 0.0 : b[o];
            for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
    return y;
}

// The whole layer (layer 0 of the config: its window and RoPE base) in plain loops over b, h,
// i, j; fills the stability signals too. q has H heads, k and v Hkv, each of width D.
Values naive_attention(const CausalSelfAttention& a, const GPTConfig& c, const Values& x, int64_t B,
                       int64_t T, AttentionStats& st) {
    const int64_t H = c.n_head, D = c.head_size > 0 ? c.head_size : c.n_embd / H;
    const int64_t Hkv = c.n_kv_head > 0 ? c.n_kv_head : H, group = H / Hkv;
    const int64_t Wq = H * D, Wkv = Hkv * D, row = Wq + 2 * Wkv;
    const bool sliding = c.sliding_window > 0 && c.layer_types.rfind("full", 0) != 0;
    const int64_t window = sliding ? c.sliding_window : T;
    const double theta = sliding && c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
    const double scale_dim = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(D);
    Values qkv = naive_linear(x, *a.c_attn);  // (B, T, Wq + 2 Wkv): q, k, v
    auto at = [&](int64_t part, int64_t b, int64_t t) {
        return &qkv[(b * T + t) * row + (part == 0 ? 0 : Wq + (part - 1) * Wkv)];
    };
    auto heads = [&](int64_t part) { return part == 0 ? H : Hkv; };
    // The mean ‖q‖ and ‖k‖ per head (into q_heads, k_heads) and over all heads.
    auto vector_norms = [&](Values& q_heads, Values& k_heads) {
        double norms[2] = {0, 0};
        Values* per_head[2] = {&q_heads, &k_heads};
        q_heads.assign(H, 0.0), k_heads.assign(Hkv, 0.0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t part : {0, 1})
                    for (int64_t h = 0; h < heads(part); ++h) {
                        double s = 0;
                        for (int64_t d = 0; d < D; ++d) s += std::pow(at(part, b, t)[h * D + d], 2);
                        norms[part] += std::sqrt(s) / (B * T * heads(part));
                        (*per_head[part])[h] += std::sqrt(s) / (B * T);
                    }
        return std::pair{norms[0], norms[1]};
    };
    std::tie(st.q_norm, st.k_norm) = vector_norms(st.head_q_norm, st.head_k_norm);
    auto rotate_q_and_k = [&] {
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t part : {0, 1})
                    for (int64_t h = 0; h < heads(part); ++h)
                        naive_rope(at(part, b, t) + h * D, D, t, theta);
    };
    const bool rope = c.pos_emb == PosEmb::rope;
    if (rope && c.qk_norm_order == QKNormOrder::after_rope) rotate_q_and_k();
    if (c.qk_norm != QKNorm::none) {
        const bool full = c.qk_norm_scope == NormScope::full && c.qk_norm != QKNorm::l2 &&
                          c.qk_norm != QKNorm::lp;
        const std::shared_ptr<Norm> norms[3] = {a.q_norm, a.k_norm, a.v_norm};
        for (int64_t part = 0; part < (c.qkv_norm ? 3 : 2); ++part) {
            const Values w = norms[part] ? values(norms[part]->weight) : Values{};
            const Values bias = norms[part] ? values(norms[part]->bias) : Values{};
            const double eps = norms[part] ? norms[part]->eps : 0;
            const int64_t width = part == 0 ? Wq : Wkv;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t h = 0; h < (full ? 1 : heads(part)); ++h)
                        naive_norm(at(part, b, t) + h * D, full ? width : D, c, w, bias, eps);
        }
    }
    if (rope && c.qk_norm_order == QKNormOrder::before_rope) rotate_q_and_k();
    vector_norms(st.head_q_norm_after, st.head_k_norm_after);  // as they enter the dot product
    st.head_entropy.assign(H, 0.0);
    const Values g = values(a.qk_scale);
    Values y(B * T * Wq, 0.0);
    double max_logit = 0, entropy = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const double scale = g.empty() ? 1 / std::sqrt(scale_dim) : g[g.size() == 1 ? 0 : h];
            const int64_t kv = h / group;  // the key/value head this query head reads
            for (int64_t i = 0; i < T; ++i) {
                const int64_t first = std::max<int64_t>(0, i - window + 1);
                Values s(i + 1 - first);
                double m = -INFINITY;
                for (int64_t j = first; j <= i; ++j) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d)
                        dot += at(0, b, i)[h * D + d] * at(1, b, j)[kv * D + d];
                    double& e = s[j - first];
                    e = scale * dot;
                    max_logit = std::max(max_logit, std::abs(e));
                    if (c.attn_softcap > 0) e = c.attn_softcap * std::tanh(e / c.attn_softcap);
                    m = std::max(m, e);
                }
                double z = 0;
                for (double& e : s) z += (e = std::exp(e - m));
                for (int64_t j = first; j <= i; ++j) {
                    const double p = s[j - first] / z;
                    entropy -= p * std::log(p) / (B * H * T);
                    st.head_entropy[h] -= p * std::log(p) / (B * T);
                    for (int64_t d = 0; d < D; ++d)
                        y[(b * T + i) * Wq + h * D + d] += p * at(2, b, j)[kv * D + d];
                }
            }
        }
    st.max_logit = max_logit, st.entropy = entropy, st.qk_scale = g.empty() ? 0 : mean_of(g);
    return naive_linear(y, *a.c_proj);
}

}  // namespace

TEST_CASE("attention forward and its stability signals match naive loops, for every variant") {
    const int64_t B = 2, T = 5;
    for (bool fused : {true, false})
        for (const auto& variant : variants()) {
            CAPTURE(variant.name);
            CAPTURE(fused);
            GPTConfig c = tiny_config();
            c.block_size = T, c.n_embd = 12, c.n_head = 3;
            c.fused_attention = fused;
            variant.apply(c);
            Generator gen(11);
            CausalSelfAttention attn(c, gen, kF64);
            {  // random gains, biases and scales, so that each one is seen
                NoGradGuard no_grad;
                for (auto& [name, p] : attn.named_parameters())
                    if (p.dim() == 1)
                        copy_into(p, normal(p.shape(), ends_with(name, "bias") ? 0.0 : 1.5, 0.4,
                                            kF64, gen));
            }
            Tensor x = normal({B, T, c.n_embd}, 0, 1, kF64, gen);
            AttentionStats got, want;
            Tensor y = attn.forward(x, &got);
            const Values ref = naive_attention(attn, c, x.to_vector<double>(), B, T, want);
            CHECK(y.shape() == x.shape());
            double worst = 0;
            const Values yv = y.to_vector<double>();
            for (size_t i = 0; i < ref.size(); ++i)
                worst = std::max(worst, std::abs(yv[i] - ref[i]));
            CHECK(worst < 1e-12);
            CHECK(got.max_logit == doctest::Approx(want.max_logit).epsilon(1e-12));
            CHECK(got.entropy == doctest::Approx(want.entropy).epsilon(1e-12));
            CHECK(got.q_norm == doctest::Approx(want.q_norm).epsilon(1e-12));
            CHECK(got.k_norm == doctest::Approx(want.k_norm).epsilon(1e-12));
            CHECK(got.qk_scale == doctest::Approx(want.qk_scale).epsilon(1e-12));
            for (auto field : {&AttentionStats::head_entropy, &AttentionStats::head_q_norm,
                               &AttentionStats::head_k_norm, &AttentionStats::head_q_norm_after,
                               &AttentionStats::head_k_norm_after}) {
                const std::vector<double>&got_heads = got.*field, &want_heads = want.*field;
                REQUIRE(got_heads.size() == want_heads.size());
                for (size_t h = 0; h < got_heads.size(); ++h)
                    CHECK(got_heads[h] == doctest::Approx(want_heads[h]).epsilon(1e-12));
            }
        }
}
