// The basic layers: Linear, Embedding, and Norm (LayerNorm or RMSNorm, by NormKind). Shapes and
// initialisation follow nanoGPT so that checkpoints interoperate (Linear.weight is
// (out_features, in_features)).
#pragma once

#include <memory>

#include "core/rng.h"
#include "nn/model/module.h"
#include "ops/fp8.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace qk::nn {

class Linear : public Module {
  public:
    // weight ~ N(0, init_std), bias = 0.
    Linear(int64_t in_features, int64_t out_features, bool bias, double init_std, Generator& gen,
           DType dtype = kF32, Precision precision = Precision::full);
    Tensor forward(const Tensor& x) const;  // x: (..., in) -> (..., out) = x Wᵀ + b
    // gelu(forward(x)), one op at bf16 and fp16 (ops/matmul.h's linear_gelu), with GELU's output
    // rounded at `rounded_copy` for the Linear that reads it.
    Tensor forward_gelu(const Tensor& x, Precision rounded_copy) const;

    Tensor weight, bias;  // bias undefined when built without
    Precision precision;  // of the GEMMs (bf16: mixed precision, see ops/matmul.h)
    // Precision::fp8: the delayed scaling of x, W and dY (ops/fp8.h), shared with the backward
    // of every forward still in flight; null otherwise.
    std::shared_ptr<Fp8LinearScaling> fp8;
};

class Embedding : public Module {
  public:
    Embedding(int64_t num_embeddings, int64_t dim, double init_std, Generator& gen,
              DType dtype = kF32);
    Tensor forward(const Tensor& ids) const;  // ids: int32 (...) -> (..., dim)

    Tensor weight;
};

// Normalisation over the last dim of size `dim`: LayerNorm (weight and optional bias) or RMSNorm
// (weight only; `bias` is ignored). weight starts at 1, bias at 0. One class, because every
// place that takes a norm lets the config choose. With unit_offset the gain is stored as w and
// applied as (1 + w), w starting at 0 (Gemma's RMSNorm): the same function, another coordinate.
enum class NormKind { layernorm, rmsnorm };

class Norm : public Module {
  public:
    Norm(NormKind kind, int64_t dim, bool bias, DType dtype = kF32, double eps = 1e-5,
         bool unit_offset = false);
    Tensor forward(const Tensor& x, const RopeTables& rotate = {}) const;  // ops/norm.h's rotate
    // {x + delta, forward(x + delta)}: the residual add before the norm, made in the norm's own
    // pass where the kernels can (ops/norm.h's add_layer_norm). delta undefined: {x, forward(x)}.
    SumAndNorm forward_added(const Tensor& x, const Tensor& delta) const;

    NormKind kind;
    double eps;
    bool unit_offset;
    Tensor weight, bias;
    // bf16 / fp16 for a norm whose output a mixed-precision Linear reads next (a block's pre-norms,
    // ln_f before the head): the kernel also writes its output rounded (ops/rounded_copy.h).
    Precision rounded_copy = Precision::full;
};

// The half type a Linear of this precision multiplies in, which the op feeding it can round its
// output to in the same pass (bf16, fp16), or full where the Linear rounds its own operands.
inline Precision rounded_copy_for_linear(Precision linear_precision) {
    return rounded_copy_for_gemm(linear_precision);
}

}  // namespace qk::nn
