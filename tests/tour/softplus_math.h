// The math of softplus, shared by the cpu loop (softplus.cpp) and the CUDA kernel (softplus.cu),
// so that the two backends cannot disagree on a formula.
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

template <class T>
QK_HOST_DEVICE T softplus_value(T x) {
    return (x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::abs(x)));
}

template <class T>
QK_HOST_DEVICE T softplus_slope(T x) {  // σ(x)
    const T e = std::exp(-std::abs(x));
    return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}

}  // namespace tour
