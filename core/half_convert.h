// float32 <-> float16 and float32 -> bfloat16 over whole runs of elements, for casts (the rounded
// copies of bf16/fp16 training) and for the fp16 GEMMs' widening.
// On x86 CPUs with F16C (every AVX2 CPU) the conversion instructions do it, 8 values at a time:
// vcvtps2ph rounds to nearest even with IEEE overflow to Inf exactly as core/float16.h does (the
// tests compare them on every float16 boundary), and vcvtph2ps is exact; elsewhere the scalar
// conversions of core/float16.h. Only a NaN's payload may differ (F16C keeps its top bits, the
// scalar rule makes the canonical quiet NaN): it is a NaN either way. Internal.
#pragma once

#include <cstdint>

#include "core/bfloat16.h"
#include "core/float16.h"

namespace qk::cpu {

void floats_to_f16(f16* dst, const float* src, int64_t n);
void f16_to_floats(float* dst, const f16* src, int64_t n);
// Whether the F16C path runs on this CPU (tests report it).
bool has_f16c();

// float -> bfloat16, round to nearest even, bit for bit the scalar rule of core/bfloat16.h (NaN
// included: quieted, top payload bits kept). With AVX-512F, 16 values at a time on the integer
// bits (the rule is integer arithmetic, so the vector form is the same rule, lane by lane; the
// AVX512_BF16 instruction vcvtneps2bf16 is not used because it flushes subnormal inputs to zero).
// It is the rounding pass of every bf16 activation a GEMM reads: the scalar loop was 4 % of a
// bf16 training step at the speedrun's shape.
void floats_to_bf16(bf16* dst, const float* src, int64_t n);
bool has_avx512f();

}  // namespace qk::cpu
