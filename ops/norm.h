// Normalisations over the last dim (layer_norm, rms_norm) or any dim (lp_normalize).
#pragma once

#include "core/tensor.h"

namespace qk {

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance).
// weight: (C); bias: (C) or an undefined Tensor for none.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// y = x / sqrt(mean(x²) + eps) * weight over the last dim. weight: (C) or undefined for none.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// y = x / max(‖x‖_p, eps) along `dim`, for any p >= 1 (p = 2 is L2 normalisation).
Tensor lp_normalize(const Tensor& x, double p, int64_t dim = -1, double eps = 1e-12);

}  // namespace qk
