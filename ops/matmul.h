// Matrix multiplication through OpenBLAS.
#pragma once

#include "core/tensor.h"

namespace qk {

// a: (..., M, K), b: (..., K, N) -> (..., M, N). The batch dims broadcast like numpy; 2-D inputs
// are plain GEMMs. Transposed views are handed to GEMM as transpose flags, not copied.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace qk
