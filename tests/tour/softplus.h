// The tour's softplus: a differentiable op on both backends, written outside the library with
// only its public API — the solution of the exercises of stops 6 and 11 of docs/tour.md.
#pragma once

#include "qk.h"

namespace tour {

// y = log(1 + e^x), elementwise; x float32 or float64 on the cpu or on cuda. Differentiable.
qk::Tensor softplus(const qk::Tensor& x);

}  // namespace tour
