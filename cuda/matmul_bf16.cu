// cuda/matmul_bf16.cu — the passes around the bf16 (and fp16) linear's GEMMs, one launch each
// where plain ops take two (ops/matmul_bf16.cpp calls them; its header gives the math):
//
//   forward    y = b in every row          (only where cuBLASLt declines to add b in its GEMM's
//                                            epilogue, cuda/matmul.cu: the GEMM then adds x̃·W̃ᵀ
//                                            to y, beta = 1)
//   backward   dỸ = round(dY), and db = Σ_r dY in float32    (from one read of dY)
//              with GELU before it (linear_gelu): dY = dH ⊙ gelu'(Y) made in the same pass,
//              from dH and GELU's input Y, never stored in float32
//
// In the backward the rounding of dY and the column sums read the same values: the column-tile
// layout of cuda/reduce.cu's v3 (block (bx, k) holds 32 columns of chunk k of the rows, 8 row
// lanes) rounds each value as it adds it, and the tile's last block to finish combines the
// chunks' partials (arrived_last, cuda/warp_reduce.h), so the sums are the bits the two-launch
// path gave. The weight is not rounded here: the optimizer keeps its rounding (core/storage.h,
// cast_copy), and x arrives rounded by its producer or by one cast.
//
// CPU twins: sum_to in ops/matmul_bf16.cpp (the cpu GEMM writes the bias itself).
#include <cstddef>
#include <cstdint>

#include "core/float16.h"
#include "cuda/bf16_convert.h"
#include "cuda/runtime.h"
#include "cuda/warp_reduce.h"
#include "ops/elementwise_math.h"
#include "ops/matmul.h"

namespace qk::cuda {

namespace {

constexpr unsigned kRowThreads = 128;
constexpr int64_t kMinRowsPerChunk = 64;

// kVec neighbours as one aligned value: with kVec = 4, a 16-byte load or store of float32, a
// quarter of the memory instructions.
template <class T, int kVec>
struct alignas(kVec * sizeof(T)) Vec {
    T v[kVec];
};

// y: (R, N) out; bias: (N); N a multiple of kVec. grid (blocks), block (kRowThreads): block b
// takes rows b, b + gridDim.x, ...; its threads walk each row kVec values at a time.
template <int kVec>
__global__ void fill_bias_rows_kernel(float* y, const float* bias, int64_t R, int64_t N) {
    using Row = Vec<float, kVec>;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        Row* y_row = reinterpret_cast<Row*>(y + r * N);
        for (int64_t c = threadIdx.x; c < N / kVec; c += blockDim.x)
            y_row[c] = reinterpret_cast<const Row*>(bias)[c];  // y = b
    }
}

bool aligned(const void* p, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// dy_half: (R, N) out; db: (N) out, or null for no bias; partial: (chunks, N) scratch; counters:
// one per tile; dy: (R, N) with row stride ldy; gelu_in (kGelu): (R, N) contiguous, GELU's input,
// and the values rounded and summed are dy ⊙ gelu'(gelu_in), by the functor GELU's own backward
// kernel runs (the same bits). grid (ceil(N / 32), chunks), block (32, 8): lane (x, y) of block
// (bx, k) rounds and sums rows y, y + 8, ... of chunk k in column 32·bx + x.
template <class Half, bool kGelu>
__global__ void round_and_sum_columns_kernel(Half* dy_half, float* db, float* partial,
                                             unsigned* counters, const float* dy, int64_t ldy,
                                             const float* gelu_in, int64_t R, int64_t N,
                                             int64_t per_chunk) {
    const int64_t c = int64_t(blockIdx.x) * kWarp + threadIdx.x;
    const int64_t r0 = int64_t(blockIdx.y) * per_chunk;
    const int64_t r1 = r0 + per_chunk < R ? r0 + per_chunk : R;
    struct Loaded {
        float dy, gelu_in;
    };
    float sum = 0;
    if (c < N)
        walk_rows(
            r0 + threadIdx.y, r1, kLaneRows,
            [&](int64_t r) {
                return Loaded{dy[r * ldy + c], kGelu ? gelu_in[r * N + c] : 0.0f};
            },
            [&](int64_t r, Loaded v) {
                float value = v.dy;
                if constexpr (kGelu) value = math::GeluBackward{}(value, v.gelu_in, 0.0f);
                dy_half[r * N + c] = convert_element<Half>(value);  // dỸ = round(dY)
                sum += value;                                       // db = Σ_r dY
            });
    if (!db) return;  // uniform over the grid: no block waits on the counters
    const auto add = [](float a, float b) { return a + b; };
    sum = combine_lane_rows(sum, add);
    if (threadIdx.y == 0 && c < N) partial[int64_t(blockIdx.y) * N + c] = sum;
    if (!arrived_last(counters)) return;
    sum = combine_chunks(partial, gridDim.y, N, add, 0.0f);
    if (threadIdx.y == 0 && c < N) db[c] = sum;
}

}  // namespace

void fill_bias_rows(float* y, const float* bias, int64_t R, int64_t N) {
    if (R == 0) return;
    const unsigned blocks = static_cast<unsigned>(R < 8 * kFillBlocks ? R : 8 * kFillBlocks);
    ledger::declare(4.0 * double(R) * double(N) + 4.0 * double(N));
    if (N % 4 == 0 && aligned(y, 16) && aligned(bias, 16))
        QK_LAUNCH((fill_bias_rows_kernel<4>), blocks, kRowThreads, 0, stream(), y, bias, R, N);
    else
        QK_LAUNCH((fill_bias_rows_kernel<1>), blocks, kRowThreads, 0, stream(), y, bias, R, N);
    QK_CUDA_CHECK_LAUNCH("fill_bias_rows_kernel");
}

template <class Half>
void round_and_sum_columns(Half* dy_half, float* db, const float* dy, int64_t ldy, int64_t R,
                           int64_t N, const float* gelu_in) {
    if (N == 0) return;
    if (R == 0) return db ? fill_zero(db, sizeof(float) * size_t(N)) : void();
    const int64_t tiles = (N + kWarp - 1) / kWarp;
    const auto [per_chunk, chunks] = pieces_for(R, tiles, kMinRowsPerChunk);
    QK_CHECK(tiles <= 0x7fffffff && chunks <= 65535,
             "linear: a ({}, {}) gradient cannot be split on one grid", R, N);
    // Scratch from the caching allocator; freed at return, safe as the stream orders its reuse.
    const double partials = db ? double(chunks * N) : 0.0;
    Storage scratch(sizeof(float) * size_t(partials), Device::cuda);
    const double values = double(R) * double(N);
    // Bytes: dY (and GELU's input) read, dỸ written, the partials written and read, db written.
    ledger::declare((gelu_in ? 10.0 : 6.0) * values + 4.0 * (2 * partials + (db ? N : 0)),
                    (db ? values + partials : 0.0) + (gelu_in ? 2.0 * values : 0.0));
    const dim3 grid{unsigned(tiles), unsigned(chunks)}, block{kWarp, kLaneRows};
    float* partial = static_cast<float*>(scratch.data());
    unsigned* counters = db ? tile_counters(tiles) : nullptr;
    if (gelu_in)
        QK_LAUNCH((round_and_sum_columns_kernel<Half, true>), grid, block, 0, stream(), dy_half, db,
                  partial, counters, dy, ldy, gelu_in, R, N, per_chunk);
    else
        QK_LAUNCH((round_and_sum_columns_kernel<Half, false>), grid, block, 0, stream(), dy_half,
                  db, partial, counters, dy, ldy, gelu_in, R, N, per_chunk);
    QK_CUDA_CHECK_LAUNCH("round_and_sum_columns_kernel");
}

template void round_and_sum_columns<bf16>(bf16*, float*, const float*, int64_t, int64_t, int64_t,
                                          const float*);
template void round_and_sum_columns<f16>(f16*, float*, const float*, int64_t, int64_t, int64_t,
                                         const float*);

}  // namespace qk::cuda
