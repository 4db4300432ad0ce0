#include "nn/model/layers.h"

#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/fp8.h"
#include "ops/matmul.h"
#include "ops/norm.h"

namespace qk::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, double init_std,
               Generator& gen, DType dtype, Precision precision_in)
    : precision(precision_in) {
    if (precision == Precision::fp8) fp8 = std::make_shared<Fp8LinearScaling>();
    weight =
        register_parameter("weight", normal({out_features, in_features}, 0, init_std, dtype, gen));
    if (with_bias) bias = register_parameter("bias", zeros({out_features}, dtype));
}

Tensor Linear::forward(const Tensor& x) const {
    if (fp8) return linear_fp8(x, weight, bias, fp8);  // x, W in E4M3; dY in E5M2
    return linear(x, weight, bias, precision);  // one GEMM, the bias folded in; Wᵀ a GEMM flag
}

Tensor Linear::forward_gelu(const Tensor& x, Precision rounded_copy) const {
    if (fp8) return gelu(forward(x), rounded_copy);
    return linear_gelu(x, weight, bias, precision, rounded_copy);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, double init_std, Generator& gen,
                     DType dtype) {
    weight = register_parameter("weight", normal({num_embeddings, dim}, 0, init_std, dtype, gen));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

Norm::Norm(NormKind kind_in, int64_t dim, bool with_bias, DType dtype, double eps_in,
           bool unit_offset_in)
    : kind(kind_in), eps(eps_in), unit_offset(unit_offset_in) {
    weight = register_parameter("weight", unit_offset ? zeros({dim}, dtype) : ones({dim}, dtype));
    if (with_bias && kind == NormKind::layernorm)
        bias = register_parameter("bias", zeros({dim}, dtype));
}

Tensor Norm::forward(const Tensor& x, const RopeTables& rotate) const {
    const Tensor gain = unit_offset ? weight + 1.0 : weight;  // (1 + w) rounded once, as Gemma
    return kind == NormKind::layernorm ? layer_norm(x, gain, bias, eps, rounded_copy, rotate)
                                       : rms_norm(x, gain, eps, rounded_copy, rotate);
}

SumAndNorm Norm::forward_added(const Tensor& x, const Tensor& delta) const {
    if (!delta.defined()) return {x, forward(x)};
    const Tensor gain = unit_offset ? weight + 1.0 : weight;
    return kind == NormKind::layernorm ? add_layer_norm(x, delta, gain, bias, eps, rounded_copy)
                                       : add_rms_norm(x, delta, gain, eps, rounded_copy);
}

}  // namespace qk::nn
