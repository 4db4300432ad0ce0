// The math of softplus, shared by the cpu loop (softplus.cpp) and the CUDA kernel (softplus.cu),
// so that the two backends cannot disagree on a formula. Yours to write (stop 6).
//
//   forward    y = softplus(x) = log(1 + e^x)
//                = max(x, 0) + log1p(e^-|x|)        (never exponentiates a large positive x)
//   saved      x
//   backward   dy/dx = e^x / (1 + e^x) = σ(x)       so  dx = dy · σ(x)
//              σ(x) = 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) for x < 0   (no overflow)
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace tour {

// Stop 6: y = log(1 + e^x), written so that no large positive x is exponentiated (the check
// tries x = 800, where e^x is inf in float64).
template <class T>
QK_HOST_DEVICE T softplus_value(T x) {
    return x * T(0);  // yours to write
}

// Stop 6: dy/dx = σ(x), written so that neither branch overflows.
template <class T>
QK_HOST_DEVICE T softplus_slope(T x) {
    return x * T(0);  // yours to write
}

}  // namespace tour
