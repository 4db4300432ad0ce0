// The `cuda_rope` suite: cuda/rope.cu against the cpu op of ops/rope.cpp, forward and backward,
// float32 and float64, under every run order of the emulator. Sizes are ragged: 2 x 3 x 37 rows
// of D = 22 (11 pairs each) are 2442 pairs, ten blocks of 256 with a partial last one.
#include "cuda_parity.h"

using namespace qk;
using qk::test::check_cuda_parity;
using qk::test::Inputs;
using qk::test::ParityOptions;
using qk::test::randn_seeded;

TEST_CASE("rope on cuda matches the cpu, forward and backward") {
    for (DType dt : {kF32, kF64}) {
        CAPTURE(dt);
        const RopeTables tables = rope_tables(37, 22, 10000.0, dt);
        ParityOptions options;
        options.requires_grad = {true, false, false};
        check_cuda_parity(
            "rope", [](const Inputs& in) { return rope(in[0], in[1], in[2]); },
            {randn_seeded({2, 3, 37, 22}, 1, dt), tables.cos, tables.sin}, options);
        // A strided input: the heads split from (B, T, H, D) by a transpose.
        check_cuda_parity(
            "rope strided",
            [](const Inputs& in) { return rope(in[0].transpose(1, 2), in[1], in[2]); },
            {randn_seeded({2, 37, 3, 22}, 2, dt), tables.cos, tables.sin}, options);
    }
}
