// The unfused attention at bf16 / fp16 on cuda, as one node: the composition's GEMMs and softmax
// (ops/attention.cpp's attention_unfused, v1 of the ladder), with its T² buffers chosen by hand,
// as llm.c's attention_forward and attention_backward choose theirs.
//
// Per (batch, head), with q̃, k̃, ṽ, dÕ the operands rounded to the half type and α the scale:
//   forward   S = α · q̃ k̃ᵀ  (float32)          P = softmax(mask(cap(S)))     O = P̃ ṽ
//   backward  dP = dÕ ṽᵀ    dV = P̃ᵀ dÕ         dS = P ⊙ (dP − rowsum(dP ⊙ P)) ⊙ cap′
//             dQ = α · dS̃ k̃        dK = α · dS̃ᵀ q̃
// The composition records three nodes, and each keeps its float32 result: S, P (which P̃ rides
// on as its rounded copy) and in the backward dP and dS (dS̃ beside it). Of those, only P̃ and dS̃
// are read by the GEMMs after them, and P by the softmax's backward. So this node writes P̃ and
// dS̃ rounded only (cuda::softmax_rounded_forward / _backward), saves S and each row's max and
// sum, and recomputes P from them in the backward with the forward's own instructions: the
// same bits as the composition's P, one T² float32 tensor fewer written in each direction.
//
// The causal mask leaves the upper triangle of every T² matrix zero, and the composition's
// GEMMs still compute and read it. Here the query rows go in chunks (at most kChunks, of at
// least kMinChunkRows rows): chunk [q0, q1) sees the keys [0, keys) with keys = q1 + Tk − Tq,
// so its rows of S, O, dP and dQ are one GEMM each over those keys, and the key rows [k0, keys)
// that it adds to the triangle are seen only by query rows q0 and after, so their dV and dK are
// one GEMM each over the query rows [q0, Tq). With c chunks the six products do (c + 1) / 2c of
// the full products' work and T² traffic, and read k̃, ṽ, q̃ or dÕ (c + 1) / 2 times: 4 chunks
// (5/8) cost the least bytes at GPT-2's T = 1024, D = 64. The skipped terms are exact zeros
// (masked p and dS) times finite operands, so for finite inputs the sums are the composition's:
// in the emulator, bit for bit (the tests check it; its GEMM sums each element in k order
// whatever the shape); on a GPU cuBLAS may split the shorter sums differently, to the last bits.
// An Inf or NaN in k̃, ṽ or dÕ (an fp16 value past 65,504) reaches, through 0 · Inf, every row
// of the composition's products, and here only the rows of the chunks that see it.
//
// What it keeps until the backward: S (float32), P̃, the rows' max and sum, and q̃, k̃, ṽ; the
// composition kept P (float32), P̃, and the same operands.
#include "ops/attention_materialized.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/factory.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

namespace qk {

namespace {

bool g_materialized = true;

}  // namespace

bool use_materialized_attention(bool on) { return std::exchange(g_materialized, on); }

bool materialized_attention_applies(const Tensor& q, const Tensor& k, const AttentionOptions& o,
                                    const AttentionSignals* signals) {
#ifdef QK_WITH_CUDA
    const bool half = o.precision == Precision::bf16 || o.precision == Precision::fp16;
    // A learned scale's gradient sums dS ⊙ q·kᵀ in float32, and the signals read S and P on the
    // host: both keep the composition, as do the rarer window, FP8 logits and dropout.
    return g_materialized && q.device() == Device::cuda && q.dtype() == kF32 && half &&
           !o.scale_tensor.defined() && o.window == 0 && !o.fp8_logits && o.dropout == 0 &&
           !signals && q.size(2) > 0 && k.size(2) > 0;
#else
    (void)q, (void)k, (void)o, (void)signals;
    return false;
#endif
}

#ifdef QK_WITH_CUDA

namespace {

constexpr int64_t kChunks = 4, kMinChunkRows = 64;

// Query rows per chunk: Tq / kChunks rounded up to a multiple of kMinChunkRows (aligned GEMMs).
int64_t chunk_rows(int64_t Tq, bool causal) {
    if (!causal) return Tq;
    const int64_t rows = (Tq + kChunks - 1) / kChunks;
    return std::max(kMinChunkRows, (rows + kMinChunkRows - 1) / kMinChunkRows * kMinChunkRows);
}

// Query rows [q0, q1) see the keys [0, keys); the keys [k0, keys) are first seen by row q0.
struct Chunk {
    int64_t q0, q1, k0, keys;
};

std::vector<Chunk> chunks_of(int64_t Tq, int64_t Tk, bool causal) {
    const int64_t rows = chunk_rows(Tq, causal), shift = Tk - Tq;
    std::vector<Chunk> chunks;
    for (int64_t q0 = 0; q0 < Tq; q0 += rows) {
        const int64_t q1 = std::min(Tq, q0 + rows);
        const int64_t keys = causal ? std::min(Tk, q1 + shift) : Tk;
        chunks.push_back({q0, q1, q0 == 0 ? 0 : q0 + shift, keys});
    }
    return chunks;
}

// The B·H row-major matrices of a (B, H, rows, cols) buffer: element (β, i, j) at
// data + β·stride + i·ld + j. at(i, j) is the sub-matrix whose corner is (i, j).
template <class E>
struct Matrices {
    E* data;
    int64_t ld, stride;
    Matrices at(int64_t i, int64_t j) const { return {data + i * ld + j, ld, stride}; }
};

template <class E>
Matrices<E> matrices_of(const Tensor& t) {
    const int64_t rows = t.size(2), cols = t.size(3);
    return {static_cast<E*>(t.raw_data()), cols, rows * cols};
}

// y = α · op(a) · op(b) for each of the batch's matrices; op(a): (M, K), op(b): (K, N), an
// operand marked trans stored as its transpose.
template <class Half>
void product(Matrices<float> y, Matrices<const Half> a, bool a_trans, Matrices<const Half> b,
             bool b_trans, int64_t M, int64_t N, int64_t K, int64_t batch, float alpha) {
    cuda::gemm_mixed(y.data, y.ld, y.stride, a.data, a_trans, a.ld, a.stride, b.data, b_trans, b.ld,
                     b.stride, M, N, K, batch, alpha, 0.0f);
}

template <class Half>
Tensor forward_and_record(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                          const AttentionOptions& o) {
    constexpr DType kHalf = dtype_of<Half>();
    constexpr bool kBf16 = kHalf == kBF16;
    const int64_t B = q_in.size(0), H = q_in.size(1), Tq = q_in.size(2), Tk = k_in.size(2),
                  D = q_in.size(3), BH = B * H;
    const float alpha = float(o.scale.value_or(1.0 / std::sqrt(static_cast<double>(D))));
    const float cap = float(o.softcap);
    const bool causal = o.causal;
    const int64_t rows = chunk_rows(Tq, causal);
    const std::vector<Chunk> chunks = chunks_of(Tq, Tk, causal);
    const std::array<Tensor, 3> in = rounded_attention_inputs(  // q̃, k̃, ṽ
        {autograd::saved(q_in), autograd::saved(k_in), autograd::saved(v_in)}, kHalf);
    const auto qh = matrices_of<const Half>(in[0]), kh = matrices_of<const Half>(in[1]),
               vh = matrices_of<const Half>(in[2]);

    Tensor s = Tensor::empty({B, H, Tq, Tk}, kF32, Device::cuda);
    Tensor p = Tensor::empty({B, H, Tq, Tk}, kHalf, Device::cuda);
    Tensor row_max = Tensor::empty({B, H, Tq}, kF32, Device::cuda);
    Tensor row_sum = Tensor::empty({B, H, Tq}, kF32, Device::cuda);
    Tensor out = Tensor::empty({B, H, Tq, D}, kF32, Device::cuda);
    const auto sm = matrices_of<float>(s), om = matrices_of<float>(out);
    const auto pm = matrices_of<const Half>(p);
    for (const Chunk& c : chunks)  // S = α · q̃ k̃ᵀ
        product<Half>(sm.at(c.q0, 0), qh.at(c.q0, 0), false, kh, true, c.q1 - c.q0, c.keys, D, BH,
                      alpha);
    cuda::softmax_rounded_forward(static_cast<uint16_t*>(p.raw_data()), row_max.data<float>(),
                                  row_sum.data<float>(), s.data<float>(), BH * Tq, Tq, Tk, causal,
                                  cap, rows, kBf16);
    for (const Chunk& c : chunks)  // O = P̃ ṽ
        product<Half>(om.at(c.q0, 0), pm.at(c.q0, 0), false, vh, false, c.q1 - c.q0, D, c.keys, BH,
                      1.0f);

    const bool need_q = q_in.requires_grad(), need_k = k_in.requires_grad(),
               need_v = v_in.requires_grad();
    auto backward = [=, s = autograd::saved(s), p = autograd::saved(p),
                     row_max = autograd::saved(row_max),
                     row_sum = autograd::saved(row_sum)](const Tensor& dout) {
        const Tensor do_h = cast_once(dout, kHalf).contiguous();  // dÕ
        const auto dom = matrices_of<const Half>(do_h);
        // q̃, k̃, ṽ: the forward's rounded operands, kept alive by this capture of `in`
        const auto qh = matrices_of<const Half>(in[0]), kh = matrices_of<const Half>(in[1]),
                   vh = matrices_of<const Half>(in[2]);
        const auto pm = matrices_of<const Half>(p);
        Tensor dq, dk, dv, ds;  // ds: dS̃
        if (need_q || need_k) {
            Tensor dp = Tensor::empty({B, H, Tq, Tk}, kF32, Device::cuda);
            const auto dpm = matrices_of<float>(dp);
            for (const Chunk& c : chunks)  // dP = dÕ ṽᵀ
                product<Half>(dpm.at(c.q0, 0), dom.at(c.q0, 0), false, vh, true, c.q1 - c.q0,
                              c.keys, D, BH, 1.0f);
            ds = Tensor::empty({B, H, Tq, Tk}, kHalf, Device::cuda);
            cuda::softmax_rounded_backward(static_cast<uint16_t*>(ds.raw_data()), dp.data<float>(),
                                           s.data<float>(), row_max.data<float>(),
                                           row_sum.data<float>(), BH * Tq, Tq, Tk, causal, cap,
                                           rows, kBf16);
        }
        if (need_v) {  // dV = P̃ᵀ dÕ
            dv = Tensor::empty({B, H, Tk, D}, kF32, Device::cuda);
            const auto dvm = matrices_of<float>(dv);
            for (const Chunk& c : chunks)
                product<Half>(dvm.at(c.k0, 0), pm.at(c.q0, c.k0), true, dom.at(c.q0, 0), false,
                              c.keys - c.k0, D, Tq - c.q0, BH, 1.0f);
        }
        const auto dsm = ds.defined() ? matrices_of<const Half>(ds) : Matrices<const Half>{};
        if (need_q) {  // dQ = α · dS̃ k̃
            dq = Tensor::empty({B, H, Tq, D}, kF32, Device::cuda);
            const auto dqm = matrices_of<float>(dq);
            for (const Chunk& c : chunks)
                product<Half>(dqm.at(c.q0, 0), dsm.at(c.q0, 0), false, kh, false, c.q1 - c.q0, D,
                              c.keys, BH, alpha);
        }
        if (need_k) {  // dK = α · dS̃ᵀ q̃
            dk = Tensor::empty({B, H, Tk, D}, kF32, Device::cuda);
            const auto dkm = matrices_of<float>(dk);
            for (const Chunk& c : chunks)
                product<Half>(dkm.at(c.k0, 0), dsm.at(c.q0, c.k0), true, qh.at(c.q0, 0), false,
                              c.keys - c.k0, D, Tq - c.q0, BH, alpha);
        }
        return autograd::Grads{dq, dk, dv};
    };
    return autograd::record("attention_unfused", out, {q_in, k_in, v_in}, std::move(backward));
}

}  // namespace

Tensor attention_materialized(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& o) {
    return o.precision == Precision::bf16 ? forward_and_record<bf16>(q, k, v, o)
                                          : forward_and_record<f16>(q, k, v, o);
}

#else

Tensor attention_materialized(const Tensor&, const Tensor&, const Tensor&,
                              const AttentionOptions&) {
    throw_built_without_cuda("attention_unfused");
}

#endif

}  // namespace qk
