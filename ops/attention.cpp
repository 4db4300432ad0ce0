// Fused scaled-dot-product attention, FlashAttention-2's algorithm (Dao 2023), with the soft-cap,
// the causal mask, a learnable per-head scale and the stability signals inside.
//
// Per head, q_i: query row i, k_j, v_j: key/value row j (all of length D):
//   r_ij = q_i · k_j                          raw dot
//   s_ij = g · r_ij                           g: the scale (1/sqrt(D), or a learnable tensor)
//   z_ij = c · tanh(s_ij / c)                 soft-cap when c > 0, else z = s
//   visible j: j <= i + (Tk − Tq) under the causal mask, else every j; with a sliding window W
//              also j > i + (Tk − Tq) − W (the row's last W keys)
//   p_ij = exp(z_ij − lse_i),  lse_i = log Σ_vis exp(z_ij)
//   o_i  = Σ_j p_ij v_j
//
// Forward without the (Tq, Tk) matrix: the keys are visited tile by tile and each row keeps an
// online softmax (m: running max, l = Σ exp(z − m), o_acc = Σ exp(z − m) v). When a tile moves the
// max to m', everything carried so far is rescaled by α = exp(m − m'):
//   l ← α·l + Σ_tile exp(z − m'),   o_acc ← α·o_acc + Σ_tile exp(z − m') v
// and at the end o = o_acc / l, lse = m + log l. Every exp(z − m) <= 1, so nothing overflows.
//
// Saved: q, k, v, o and lse (one number per row); nothing of size Tq × Tk. lse is kept in float64
// whatever the dtype: the backward's p = exp(z − lse) inherits lse's absolute error, and a float32
// lse of a row whose logits reach 10 is off by ~1e-6, the same relative error on every p of the
// row, which D_i = dO·o below does not share. Each row's ds then stops summing to zero, and the
// scale's gradient Σ ds·r collected that bias over every row: 3-5x the unfused path's error in a
// float32 test, before the change (8 bytes a row is nothing next to the row's D values).
//
// Backward, with dO = ∂loss/∂o (each tile's p recomputed from q, k and the saved lse):
//   dv_j  = Σ_i p_ij dO_i
//   dp_ij = dO_i · v_j
//   dz_ij = p_ij (dp_ij − D_i),   D_i = Σ_j p_ij dp_ij = dO_i · o_i      (softmax's backward; the
//                                  second form needs no pass over j: FA-2's trick)
//   ds_ij = dz_ij · (1 − (z_ij / c)²)                                     (the cap's factor)
//   dq_i  = g Σ_j ds_ij k_j,   dk_j = g Σ_i ds_ij q_i,   dg = Σ_ij ds_ij r_ij
// A scale of shape (1) sums dg over every head, shape (H) per head; over the batch either way.
//
// Stability signals, by the same forward: max |s_ij| over the visible j (s before the cap), and
// the entropy of p_i,
//   H_i = −Σ_j p_ij log p_ij = −Σ_j p_ij (z_ij − lse_i) = lse_i − Σ_j p_ij z_ij = lse_i − w / l,
// with w = Σ_j exp(z_ij − m) z_ij carried and rescaled along with l.
//
// The recomputed p is clamped at 1 (which it is, mathematically). The backward's dots r come from
// other GEMM calls than the forward's and may round differently: at logits of 1e12 (a run that
// has blown up, with q and k near 1e6), r differs by ~1e5, exp(z − lse) overflowed to inf, and
// inf · 0 made every gradient NaN where the unfused path, which saves p, gave finite ones.
//
// Grouped-query attention (Hkv key/value heads for H query heads) changes no formula: query head h
// reads key/value head h / (H / Hkv), and a shared head's dk_j, dv_j are the sums above over every
// query head of its group.
//
// Edge cases, as softmax: a NaN logit (or +inf) makes its row's output, lse and signals NaN; a row
// with no finite logit (only with infinite inputs) outputs 0, with lse −inf and zero gradient.
//
// The kernel ladder: attention_unfused below is v1, the plain composition matmul → softmax →
// matmul whose ops each save their (B, H, Tq, Tk) result; the fused kernels are v2, in
// ops/attention_cpu.cpp and cuda/attention.cu (one read of q, k, v per tile, no T² memory, the
// masked half skipped), and the tests hold v2 to v1.
#include "ops/attention.h"
#include "ops/attention_materialized.h"

#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/rounded_copy.h"
#include "ops/softmax.h"

namespace qk {

namespace {

using autograd::Grads;

void check_options(const char* op, const AttentionOptions& o, const Tensor& q) {
    const int64_t H = q.size(1);
    QK_CHECK(o.softcap >= 0 && std::isfinite(o.softcap),
             "{}: softcap must be a finite number >= 0 (0 = off), got {}", op, o.softcap);
    QK_CHECK(!o.scale || std::isfinite(*o.scale), "{}: scale must be finite, got {}", op,
             o.scale.value_or(0));
    QK_CHECK(o.dropout >= 0 && o.dropout < 1, "{}: dropout must be in [0, 1), got {}", op,
             o.dropout);
    if (!o.scale_tensor.defined()) return;
    const Tensor& g = o.scale_tensor;
    QK_CHECK(g.dim() == 1 && (g.size(0) == 1 || g.size(0) == H),
             "{}: scale tensor must have shape (1) or (H) = ({}), got {}", op, H, g.shape());
    QK_CHECK(g.dtype() == q.dtype() && g.device() == q.device(),
             "{}: scale tensor is {} on {}, q is {} on {}", op, g.dtype(), g.device(), q.dtype(),
             q.device());
}

void check_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                const AttentionOptions& o) {
    QK_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "{}: q, k, v must be (B, H, T, D), got q {}, k {}, v {}", op, q.shape(), k.shape(),
             v.shape());
    QK_CHECK(is_compute_dtype(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
             "{}: q, k, v must be float32 or float64 and the same, got {}, {}, {} (shapes {}, {}, "
             "{})",
             op, q.dtype(), k.dtype(), v.dtype(), q.shape(), k.shape(), v.shape());
    QK_CHECK(k.device() == q.device() && v.device() == q.device(),
             "{}: q, k, v must be on one device, got {}, {}, {}", op, q.device(), k.device(),
             v.device());
    // k and v have Hkv heads, Hkv dividing H (grouped-query attention when Hkv < H).
    const bool same_heads = k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                            v.size(1) == k.size(1) && k.size(1) > 0 && q.size(1) % k.size(1) == 0;
    const bool same_dims = k.size(3) == q.size(3) && v.size(3) == q.size(3) && q.size(3) > 0;
    QK_CHECK(same_heads && same_dims && v.size(2) == k.size(2),
             "{}: expected q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, D) with D > 0 and "
             "Hkv dividing H, got q {}, k {}, v {}",
             op, q.shape(), k.shape(), v.shape());
    QK_CHECK(o.window >= 0 && (o.window == 0 || o.causal),
             "{}: window must be 0 (none) or > 0 with the causal mask, got window {} (causal {})",
             op, o.window, o.causal);
    QK_CHECK(!o.causal || q.size(2) <= k.size(2),
             "{}: causal mask needs Tq <= Tk, got q {} and k {}: the first {} query rows would see "
             "no key",
             op, q.shape(), k.shape(), q.size(2) - k.size(2));
    check_options(op, o, q);
    QK_CHECK(o.precision == Precision::full || q.dtype() == kF32,
             "{}: {} precision needs float32 q, k, v, got {} {}", op, precision_name(o.precision),
             q.dtype(), q.shape());
    QK_CHECK(o.precision != Precision::fp8,
             "{}: fp8 precision applies to Linear layers; attention takes bf16 or fp16, and "
             "fp8_logits for FP8 logits",
             op);
    QK_CHECK(!o.fp8_logits || q.dtype() == kF32, "{}: fp8_logits needs float32 q, k, v, got {} {}",
             op, q.dtype(), q.shape());
}

// FP8 logits, unfused: z rounded to E4M3 at scale 1 (saturating at ±448), straight-through.
Tensor round_logits_to_e4m3(const Tensor& z) {
    DelayedScaling unit(MiniFormat::e4m3);  // never recorded: its scale stays 1
    const Tensor rounded = fp8_cast(z, unit, false).q;
    return autograd::record("round_logits_to_e4m3", rounded, {z},
                            [](const Tensor& dy) { return std::vector<Tensor>{dy}; });
}

// Mixed precision: the values a bf16 or fp16 GEMM would read, as float32. The backward passes dq,
// dk, dv through unrounded (the straight-through rule; two casts would round the gradient on its
// way back), as linear's mixed path keeps dx in float32.
Tensor round_to_half(const Tensor& t, Precision precision) {
    const DType half = precision == Precision::bf16 ? kBF16 : kF16;
    Tensor rounded = autograd::saved(t).to(half).to(kF32);
    return autograd::record(precision == Precision::bf16 ? "round_to_bf16" : "round_to_fp16",
                            rounded, {t}, [](const Tensor& dy) { return std::vector<Tensor>{dy}; });
}

AttentionOptions full_precision(AttentionOptions o) {
    o.precision = Precision::full;
    return o;
}

AttentionShape shape_of(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
    return {q.size(0) * q.size(1),
            q.size(1),
            k.size(1),
            q.size(2),
            k.size(2),
            q.size(3),
            o.causal,
            o.window,
            o.fp8_logits};
}

// The scale as a tensor of shape (1) or (H) on q's device: the user's, or the number's.
Tensor scale_as_tensor(const Tensor& q, const AttentionOptions& o) {
    if (o.scale_tensor.defined()) return autograd::contiguous_input(o.scale_tensor);
    const double g = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    if (q.device() == Device::cpu) return full({1}, g, q.dtype());
    // On cuda each value is copied from the host once and kept (nothing writes it), where a fill
    // kernel per call was a launch per layer. Never freed: its storage outlives any teardown order.
    static std::mutex mutex;
    static auto* kept = new std::map<std::pair<double, DType>, Tensor>;
    const std::lock_guard lock(mutex);
    if (kept->size() > 64) kept->clear();  // a few values per model; bounded all the same
    auto [entry, fresh] = kept->try_emplace({g, q.dtype()});
    if (fresh) entry->second = full({1}, g, q.dtype()).to(q.device());
    return entry->second;
}

// ∂loss/∂g from the per-head partials (B·H) to the scale tensor's shape, (1) or (H).
Tensor reduce_scale_grad(const Tensor& partials, const Tensor& scale, int64_t B, int64_t H) {
    Tensor per_head = sum(partials.view({B, H}), {0});  // (H)
    return scale.numel() == 1 ? sum(per_head).reshape({1}) : per_head;
}

// What the fused backward reads: q, k, v (float32 or float64, or from the tensor-core forward
// their bf16/fp16 copies, which send the backward to tensor cores too) and the forward's results.
struct FusedSaved {
    Tensor q, k, v, scale, lse, out;
    AttentionShape sh;
    int64_t stride;  // 0: one scale, 1: one per head
    bool scale_grad;
    double cap;
};

// The backward's results in `dtype` on q's device: dq, dk, dv, the D_i workspace and, for a
// learned scale, its per-head partials; as_grads gives them to autograd.
struct BackwardResults {
    Tensor dq, dk, dv, delta, dscale;

    BackwardResults(const FusedSaved& saved, DType dtype) {
        const Device device = saved.q.device();
        dq = Tensor::empty(saved.q.shape(), dtype, device);
        dk = Tensor::empty(saved.k.shape(), dtype, device);
        dv = Tensor::empty(saved.v.shape(), dtype, device);
        delta = Tensor::empty(saved.lse.shape(), dtype, device);
        if (saved.scale_grad) dscale = Tensor::empty({saved.sh.batch_heads}, dtype, device);
    }
    Grads as_grads(const FusedSaved& saved) const {
        Grads grads{dq, dk, dv};
        if (saved.scale_grad)
            grads.push_back(
                reduce_scale_grad(dscale, saved.scale, saved.q.size(0), saved.q.size(1)));
        return grads;
    }
};

// The forward's results in `dtype` on q's device: out (q's shape), lse (float64, one per row) and,
// when asked for, the signals.
// out_by_time: out stored (B, Tq, H, D) and returned as its (B, H, Tq, D) view.
std::pair<Tensor, Tensor> forward_results(const Tensor& q, DType dtype, bool fp8_logits,
                                          AttentionSignals* signals, bool out_by_time = false) {
    Tensor out =
        out_by_time ? Tensor::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, dtype, q.device())
                          .transpose(1, 2)
                    : Tensor::empty(q.shape(), dtype, q.device());
    Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, kF64, q.device());
    if (signals) {
        signals->max_abs_logit = Tensor::empty(lse.shape(), dtype, q.device());
        signals->entropy = Tensor::empty(lse.shape(), dtype, q.device());
        if (fp8_logits) signals->saturated = Tensor::empty(lse.shape(), dtype, q.device());
    }
    return {out, lse};
}

#ifdef QK_WITH_CUDA
// The backward of the tensor-core forward, on tensor cores too: dO rounded to the half type.
Grads tensor_core_backward(const FusedSaved& saved, const Tensor& dout_in) {
    const AttentionShape& sh = saved.sh;
    const Tensor &q = saved.q, &k = saved.k, &v = saved.v;
    // dO is read through its strides (a transposed view of c_proj's input gradient, usually) and
    // rounded in the kernels' first pass: no copy of it is made first.
    const Tensor dout = dout_in.strides().back() == 1 ? dout_in : dout_in.contiguous();
    const Tensor dout_half = Tensor::empty(dout.shape(), q.dtype(), dout.device());
    const cuda::RowStrides strides{dout.strides()[0], dout.strides()[1], dout.strides()[2]};
    const BackwardResults r(saved, kF32);
    auto launch = [&](auto tag) {
        using H = decltype(tag);
        cuda::attention_backward_mma<H>(
            r.dq.data<float>(), r.dk.data<float>(), r.dv.data<float>(),
            saved.scale_grad ? r.dscale.data<float>() : nullptr, r.delta.data<float>(),
            dout.data<float>(), strides, dout_half.data<H>(), q.data<H>(), k.data<H>(), v.data<H>(),
            saved.out.data<float>(), saved.lse.data<double>(), saved.scale.data<float>(),
            saved.stride, float(saved.cap), sh);
    };
    q.dtype() == kBF16 ? launch(bf16{}) : launch(f16{});
    return r.as_grads(saved);
}
#endif

Grads fused_backward(const FusedSaved& saved, const Tensor& dout_in) {
#ifdef QK_WITH_CUDA
    if (saved.q.dtype() == kBF16 || saved.q.dtype() == kF16)
        return tensor_core_backward(saved, dout_in);
#endif
    const AttentionShape& sh = saved.sh;
    const Tensor &q = saved.q, &k = saved.k, &v = saved.v;
    const Tensor &scale = saved.scale, &lse = saved.lse, &out = saved.out;
    const Tensor dout = dout_in.contiguous();
    const BackwardResults r(saved, q.dtype());
    dispatch_float(q.dtype(), [&](auto tag) {
        using T = decltype(tag);
        auto args = std::tuple(r.dq.data<T>(), r.dk.data<T>(), r.dv.data<T>(),
                               saved.scale_grad ? r.dscale.data<T>() : nullptr, r.delta.data<T>(),
                               dout.data<T>(), q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                               lse.data<double>(), scale.data<T>(), saved.stride, T(saved.cap), sh);
        switch (q.device()) {
            case Device::cpu:
                std::apply(cpu::attention_backward<T>, args);
                break;
            case Device::cuda:
#ifdef QK_WITH_CUDA
                std::apply(cuda::attention_backward<T>, args);
#else
                throw_built_without_cuda("attention");
#endif
                break;
        }
    });
    return r.as_grads(saved);
}

Tensor record_fused(const char* op, const Tensor& out, const Tensor& q_in, const Tensor& k_in,
                    const Tensor& v_in, const AttentionOptions& o, FusedSaved saved) {
    std::vector<Tensor> inputs{q_in, k_in, v_in};
    if (o.scale_tensor.defined()) inputs.push_back(o.scale_tensor);
    return autograd::record(op, out, inputs, [saved = std::move(saved)](const Tensor& dout) {
        return fused_backward(saved, dout);
    });
}

#ifdef QK_WITH_CUDA
// bf16 and fp16 attention on a GPU's tensor cores (cuda/attention_mma.cu): q, k, v rounded to the
// half type once, which is what the kernel reads and what the backward keeps. P is rounded too
// before P·V, the one change from the float32 kernels (docs/fused-attention.md).
bool on_tensor_cores(const Tensor& q, const AttentionOptions& o) {
    return q.device() == Device::cuda && o.dropout == 0 &&
           (o.precision == Precision::bf16 || o.precision == Precision::fp16) &&
           cuda::attention_mma_supports(q.size(3));
}

Tensor attention_on_tensor_cores(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 const AttentionOptions& o, AttentionSignals* signals) {
    const DType half = o.precision == Precision::bf16 ? kBF16 : kF16;
    const auto [q, k, v] = rounded_attention_inputs({q_in, k_in, v_in}, half);
    const Tensor scale = scale_as_tensor(q_in, o);
    AttentionShape sh = shape_of(q, k, o);
    const int64_t stride = scale.numel() == 1 ? 0 : 1;
    // out is written (B, Tq, H, D), the layout c_proj reads, and returned as its (B, H, Tq, D)
    // view: merging the heads after is then a view, not a copy.
    sh.out_by_time = true;
    const auto [out, lse] = forward_results(q, kF32, o.fp8_logits, signals, sh.out_by_time);
    float* max_abs = signals ? signals->max_abs_logit.data<float>() : nullptr;
    float* entropy = signals ? signals->entropy.data<float>() : nullptr;
    float* saturated = signals && o.fp8_logits ? signals->saturated.data<float>() : nullptr;
    // c_proj reads out rounded to the same half type: the kernel writes that rounding beside out,
    // kept as the buffer's cast copy (ops/rounded_copy.h), so no cast of its own follows.
    const Tensor out_buffer = out.transpose(1, 2);  // (B, Tq, H, D), the whole buffer
    const Tensor out_h = rounded_copy_for(out_buffer, o.precision);
    auto launch = [&](auto tag) {
        using H = decltype(tag);
        cuda::attention_forward_mma<H>(out.data<float>(), lse.data<double>(), max_abs, entropy,
                                       saturated, q.data<H>(), k.data<H>(), v.data<H>(),
                                       scale.data<float>(), stride, float(o.softcap), sh,
                                       half_bits(out_h));
    };
    half == kBF16 ? launch(bf16{}) : launch(f16{});
    keep_rounded_copy(out_buffer, out_h);
    return record_fused("attention", out, q_in, k_in, v_in, o,
                        FusedSaved{q, k, v, autograd::saved(scale), lse, autograd::saved(out), sh,
                                   stride, o.scale_tensor.defined(), o.softcap});
}
#endif
}  // namespace

#ifdef QK_WITH_CUDA
// Declared in ops/attention_materialized.h.
std::array<Tensor, 3> rounded_attention_inputs(const std::array<Tensor, 3>& inputs, DType half) {
    std::array<Tensor, 3> rounded;
    std::vector<Tensor> to_round, sources;
    for (size_t i = 0; i < 3; ++i) {
        const Tensor& in = inputs[i];
        if (in.is_contiguous() && has_kept_cast(in, half)) {
            rounded[i] = cast_once(in, half);
            continue;
        }
        rounded[i] = Tensor::empty(in.shape(), half, in.device());
        to_round.push_back(rounded[i]);
        sources.push_back(in);
    }
    copy_into_all(to_round, sources);
    return rounded;
}
#endif

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const AttentionOptions& o, AttentionSignals* signals) {
    constexpr const char* op = "attention";
    check_args(op, q_in, k_in, v_in, o);
#ifdef QK_WITH_CUDA
    if (on_tensor_cores(q_in, o)) return attention_on_tensor_cores(q_in, k_in, v_in, o, signals);
#endif
    if (o.precision != Precision::full)
        return attention(round_to_half(q_in, o.precision), round_to_half(k_in, o.precision),
                         round_to_half(v_in, o.precision), full_precision(o), signals);
    QK_CHECK(o.dropout == 0,
             "attention: the fused kernel does not drop attention probabilities (dropout {}); "
             "use attention_unfused (the model's --attention naive)",
             o.dropout);
    if (q_in.device() == Device::cuda) {  // each block's tiles must fit in 48 KB of shared memory
        const int64_t max_d = q_in.dtype() == kF64 ? 64 : 128;
        QK_CHECK(q_in.size(3) <= max_d,
                 "attention: the CUDA kernel takes head dims D <= {} in {} at full precision "
                 "(bf16 and fp16 precision run on tensor cores for D = 64, 128, 256), got q {}",
                 max_d, q_in.dtype(), q_in.shape());
    }
    const Tensor q = autograd::contiguous_input(q_in), k = autograd::contiguous_input(k_in),
                 v = autograd::contiguous_input(v_in), scale = scale_as_tensor(q, o);
    const AttentionShape sh = shape_of(q, k, o);
    const int64_t stride = scale.numel() == 1 ? 0 : 1;
    const auto [out, lse] = forward_results(q, q.dtype(), o.fp8_logits, signals);
    dispatch_float(q.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* max_abs = signals ? signals->max_abs_logit.data<T>() : nullptr;
        T* entropy = signals ? signals->entropy.data<T>() : nullptr;
        T* saturated = signals && o.fp8_logits ? signals->saturated.data<T>() : nullptr;
        auto args =
            std::tuple(out.data<T>(), lse.data<double>(), max_abs, entropy, saturated, q.data<T>(),
                       k.data<T>(), v.data<T>(), scale.data<T>(), stride, T(o.softcap), sh);
        switch (q.device()) {
            case Device::cpu:
                std::apply(cpu::attention_forward<T>, args);
                break;
            case Device::cuda:
#ifdef QK_WITH_CUDA
                std::apply(cuda::attention_forward<T>, args);
#else
                throw_built_without_cuda(op);
#endif
                break;
        }
    });

    return record_fused(
        op, out, q_in, k_in, v_in, o,
        FusedSaved{autograd::saved(q), autograd::saved(k), autograd::saved(v),
                   autograd::saved(scale), autograd::saved(lse), autograd::saved(out), sh, stride,
                   o.scale_tensor.defined(), o.softcap});
}

// ---- v1: the unfused composition ---------------------------------------------------------------

namespace {

// Per-row signals from the materialised scores s and probabilities p, (B, H, Tq, Tk), measured in
// float64 on the host: a (B, H, Tq, Tk) copy per stats step, the cost the fused path removes.
// With FP8 logits, z_rounded (the same shape) gives the saturation counts.
void measure_rows(const Tensor& s, const Tensor& p, const Tensor& z_rounded,
                  const AttentionShape& sh, AttentionSignals& signals) {
    const int64_t Tq = s.size(2), Tk = s.size(3), rows = s.numel() / Tk;
    const Tensor s_host = s.to(Device::cpu).contiguous().to(kF64);
    const Tensor p_host = p.to(Device::cpu).contiguous().to(kF64);
    const double *sp = s_host.data<double>(), *pp = p_host.data<double>();
    Tensor max_abs = Tensor::empty({s.size(0), s.size(1), Tq}, kF64);
    Tensor entropy = Tensor::empty(max_abs.shape(), kF64);
    for (int64_t r = 0; r < rows; ++r) {
        double row_max = 0, row_entropy = 0;
        bool nan_seen = false;  // std::max and `p > 0` would skip a NaN: report it instead
        for (int64_t j = sh.first_key(r % Tq); j < sh.end_key(r % Tq); ++j) {
            const double s_abs = std::abs(sp[r * Tk + j]), a = pp[r * Tk + j];
            nan_seen = nan_seen || std::isnan(s_abs) || std::isnan(a);
            row_max = std::max(row_max, s_abs);
            if (a > 0) row_entropy -= a * std::log(a);
        }
        max_abs.data<double>()[r] = nan_seen ? NAN : row_max;
        entropy.data<double>()[r] = nan_seen ? NAN : row_entropy;
    }
    signals.max_abs_logit = max_abs.to(s.dtype()).to(s.device());
    signals.entropy = entropy.to(s.dtype()).to(s.device());
    if (!z_rounded.defined()) return;
    const Tensor z_host = z_rounded.to(Device::cpu).contiguous();
    const float* zp = z_host.data<float>();
    const float limit = static_cast<float>(max_finite(MiniFormat::e4m3));
    Tensor saturated = zeros(max_abs.shape(), kF32);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = sh.first_key(r % Tq); j < sh.end_key(r % Tq); ++j)
            saturated.data<float>()[r] += std::abs(zp[r * Tk + j]) >= limit ? 1.0f : 0.0f;
    signals.saturated = saturated.to(s.device());
}

// k or v: (B, Hkv, Tk, D) -> (B, H, Tk, D), each key/value head repeated for its query heads
// (transformers' repeat_kv); expand's backward sums the copies' gradients.
Tensor repeat_kv(const Tensor& t, int64_t H) {
    const int64_t B = t.size(0), Hkv = t.size(1), Tk = t.size(2), D = t.size(3);
    if (Hkv == H) return t;
    return t.unsqueeze(2).expand({B, Hkv, H / Hkv, Tk, D}).reshape({B, H, Tk, D});
}

// (Tq, Tk): 0 where a sliding window lets row i see key j, −inf before it (the causal mask itself
// stays softmax's).
Tensor window_mask(const AttentionShape& sh, DType dtype, Device device) {
    std::vector<double> mask(static_cast<size_t>(sh.Tq * sh.Tk), 0.0);
    for (int64_t i = 0; i < sh.Tq; ++i)
        for (int64_t j = 0; j < sh.first_key(i); ++j) mask[i * sh.Tk + j] = -INFINITY;
    return from_vector(mask, {sh.Tq, sh.Tk}, dtype).to(device);
}

// s = g · q · kᵀ, (B, H, Tq, Tk), k with H heads. At full precision g goes on q (B·H·Tq·D
// multiplies rather than B·H·Tq·Tk: the same math). At bf16 or fp16 both GEMM operands are the
// rounded q and k (q·g would not be a bf16 number), and a scale number rides on the GEMM's
// alpha; a learned g multiplies s.
Tensor scores(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
    const Tensor k_t = k.transpose(-2, -1);
    const Tensor g = !o.scale_tensor.defined()     ? Tensor()
                     : o.scale_tensor.numel() == 1 ? o.scale_tensor
                                                   : o.scale_tensor.view({q.size(1), 1, 1});
    const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    if (o.precision == Precision::full) return matmul(g.defined() ? q * g : q * scale, k_t);
    if (g.defined()) return matmul(q, k_t, o.precision) * g;
    return matmul(q, k_t, o.precision, scale);
}

}  // namespace

Tensor attention_unfused(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& o, AttentionSignals* signals) {
    check_args("attention_unfused", q, k, v, o);
    const int64_t H = q.size(1);
    if (materialized_attention_applies(q, k, o, signals))
        return attention_materialized(q, repeat_kv(k, H), repeat_kv(v, H), o);
    Tensor s = scores(q, repeat_kv(k, H), o);  // (B, H, Tq, Tk)
    const AttentionShape sh = shape_of(q, k, o);
    Tensor p, z_rounded;
    if (o.fp8_logits) {  // z̃ = e4m3(cap(s)), then masked (−inf is kept out of the rounding)
        z_rounded = round_logits_to_e4m3(o.softcap > 0 ? softcap(s, o.softcap) : s);
        p = softmax(o.window > 0 ? z_rounded + window_mask(sh, s.dtype(), s.device()) : z_rounded,
                    {.causal = o.causal});
    } else if (o.window > 0) {  // z = cap(s) masked outside the window, then the causal softmax
        p = softmax(
            (o.softcap > 0 ? softcap(s, o.softcap) : s) + window_mask(sh, s.dtype(), s.device()),
            {.causal = o.causal});
    } else {  // p (and in the backward dS) rounded in the same pass for the GEMMs that read them
        p = softmax(s, {.causal = o.causal, .softcap = o.softcap, .rounded_copy = o.precision});
    }
    if (signals) {
        NoGradGuard no_grad;
        measure_rows(s, p, z_rounded, sh, *signals);
    }
    if (o.dropout > 0)
        p = dropout(p, o.dropout, true,
                    o.dropout_generator ? *o.dropout_generator : default_generator());
    return matmul(p, repeat_kv(v, H), o.precision);  // p rounded too at bf16, as autocast's
}

}  // namespace qk
