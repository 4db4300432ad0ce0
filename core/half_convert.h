// float32 <-> float16 over whole runs of elements, for casts and for the fp16 GEMMs' widening.
// On x86 CPUs with F16C (every AVX2 CPU) the conversion instructions do it, 8 values at a time:
// vcvtps2ph rounds to nearest even with IEEE overflow to Inf exactly as core/float16.h does (the
// tests compare them on every float16 boundary), and vcvtph2ps is exact; elsewhere the scalar
// conversions of core/float16.h. Only a NaN's payload may differ (F16C keeps its top bits, the
// scalar rule makes the canonical quiet NaN): it is a NaN either way. Internal.
#pragma once

#include <cstdint>

#include "core/float16.h"

namespace qk::cpu {

void floats_to_f16(f16* dst, const float* src, int64_t n);
void f16_to_floats(float* dst, const f16* src, int64_t n);
// Whether the F16C path runs on this CPU (tests report it).
bool has_f16c();

}  // namespace qk::cpu
