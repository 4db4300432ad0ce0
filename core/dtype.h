// Element types and devices, and dispatch_float(): the one place a runtime dtype becomes a C++
// type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "core/bfloat16.h"
#include "core/error.h"
#include "core/float16.h"

namespace qk {

// float32 trains; float64 exists so that gradcheck's finite differences are exact enough;
// int32 holds token ids and targets (embedding, cross_entropy), and is never differentiated;
// bfloat16 (core/bfloat16.h) and float16 (core/float16.h) are storage formats: mixed-precision
// GEMMs read them, casts and copies make them, and the ops that compute take float32 or float64
// (dispatch_float below).
enum class DType { f32, f64, i32, bf16, f16 };
inline constexpr DType kF32 = DType::f32;
inline constexpr DType kF64 = DType::f64;
inline constexpr DType kI32 = DType::i32;
inline constexpr DType kBF16 = DType::bf16;
inline constexpr DType kF16 = DType::f16;

enum class Device { cpu, cuda };

// How the GEMMs of an op (linear, attention) multiply: `full`, in their inputs' own dtype;
// `bf16` and `fp16`, mixed precision: float32 inputs rounded to bfloat16 or float16, their
// products summed in float32, the result float32 (the --precision flag of qknorm train); `fp8`,
// simulated FP8 on the Linear layers (ops/fp8.h, with per-layer scaling state), bf16 elsewhere.
enum class Precision { full, bf16, fp16, fp8 };
constexpr std::string_view precision_name(Precision p) {
    return p == Precision::bf16   ? "bf16"
           : p == Precision::fp16 ? "fp16"
           : p == Precision::fp8  ? "fp8"
                                  : "full";
}

constexpr std::size_t dtype_size(DType d) {
    return d == DType::f64 ? 8 : d == DType::bf16 || d == DType::f16 ? 2 : 4;
}
constexpr std::string_view dtype_name(DType d) {
    switch (d) {
        case DType::f32:
            return "float32";
        case DType::f64:
            return "float64";
        case DType::i32:
            return "int32";
        case DType::bf16:
            return "bfloat16";
        case DType::f16:
            return "float16";
    }
    return "?";
}
// The dtypes that ops compute in (bfloat16 and float16 are read by GEMMs and cast, not computed
// in).
constexpr bool is_compute_dtype(DType d) { return d == DType::f32 || d == DType::f64; }
constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
    return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
    return DType::i32;
}
template <>
constexpr DType dtype_of<bf16>() {
    return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
    return DType::f16;
}

// Calls fn(T{}) with T = float or double, matching dtype. Kernels are templates on T:
//   dispatch_float(x.dtype(), [&](auto tag) { using T = decltype(tag); kernel<T>(...); });
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, Fn&& fn) {
    switch (dtype) {
        case DType::f32:
            return fn(float{});
        case DType::f64:
            return fn(double{});
        case DType::i32:
        case DType::bf16:
        case DType::f16:
            break;
    }
    throw Error(fmt::format("this op computes in float32 or float64, got {} (cast with .to(kF32))",
                            dtype_name(dtype)));
}

// Like dispatch_float, with int32, bfloat16 and float16 too: for copies, casts, fills and
// printing.
template <typename Fn>
decltype(auto) dispatch_all(DType dtype, Fn&& fn) {
    if (dtype == DType::i32) return fn(int32_t{});
    if (dtype == DType::bf16) return fn(bf16{});
    if (dtype == DType::f16) return fn(f16{});
    return dispatch_float(dtype, std::forward<Fn>(fn));
}

// One element converted for a copy or cast: static_cast, except between the two 16-bit float
// types, which go through float (exact from either) and round once.
template <class D, class S>
QK_HOST_DEVICE inline D convert_value(S x) {
    if constexpr ((std::is_same_v<D, f16> && std::is_same_v<S, bf16>) ||
                  (std::is_same_v<D, bf16> && std::is_same_v<S, f16>))
        return D(x.to_float());
    else
        return static_cast<D>(x);
}

}  // namespace qk

template <>
struct fmt::formatter<qk::DType> : fmt::formatter<std::string_view> {
    auto format(qk::DType d, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(qk::dtype_name(d), ctx);
    }
};
template <>
struct fmt::formatter<qk::Device> : fmt::formatter<std::string_view> {
    auto format(qk::Device d, format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(qk::device_name(d), ctx);
    }
};
