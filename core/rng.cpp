#include "core/rng.h"

#include <cmath>
#include <numbers>

namespace qk {

namespace {

// Ten rounds of the Philox-4x32 bijection keyed by the seed (constants from the paper).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
    constexpr uint32_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
    constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = uint64_t{kMul0} * counter[0];
        uint64_t p1 = uint64_t{kMul1} * counter[2];
        counter = {uint32_t(p1 >> 32) ^ counter[1] ^ key[0], uint32_t(p1),
                   uint32_t(p0 >> 32) ^ counter[3] ^ key[1], uint32_t(p0)};
        key = {key[0] + kWeyl0, key[1] + kWeyl1};
    }
    return counter;
}

}  // namespace

std::array<uint32_t, 4> Generator::next_block() {
    uint64_t n = counter_++;
    return philox4x32({uint32_t(n), uint32_t(n >> 32), 0, 0},
                      {uint32_t(seed_), uint32_t(seed_ >> 32)});
}

// The same bijection on 16 counters at once, structure of arrays: the loop over lanes is plain
// 32×32→64-bit multiplies and xors, which the compiler vectorises (about 8× the scalar rate).
void Generator::fill(uint32_t* words, int64_t n) {
    constexpr int kLanes = 16;
    constexpr uint32_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
    constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
    const int64_t full_blocks = n / 4;
    int64_t block = 0;
    for (; block + kLanes <= full_blocks; block += kLanes) {
        uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
        for (int l = 0; l < kLanes; ++l) {
            const uint64_t counter = counter_ + static_cast<uint64_t>(block + l);
            c0[l] = uint32_t(counter), c1[l] = uint32_t(counter >> 32), c2[l] = 0, c3[l] = 0;
        }
        uint32_t key0 = uint32_t(seed_), key1 = uint32_t(seed_ >> 32);
        for (int round = 0; round < 10; ++round) {
            for (int l = 0; l < kLanes; ++l) {
                const uint64_t p0 = uint64_t{kMul0} * c0[l], p1 = uint64_t{kMul1} * c2[l];
                const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[l] ^ key0,
                               n2 = uint32_t(p0 >> 32) ^ c3[l] ^ key1;
                c0[l] = n0, c1[l] = uint32_t(p1), c2[l] = n2, c3[l] = uint32_t(p0);
            }
            key0 += kWeyl0, key1 += kWeyl1;
        }
        uint32_t* out = words + 4 * block;
        for (int l = 0; l < kLanes; ++l)
            out[4 * l] = c0[l], out[4 * l + 1] = c1[l], out[4 * l + 2] = c2[l],
                    out[4 * l + 3] = c3[l];
    }
    counter_ += static_cast<uint64_t>(block);
    for (int64_t i = 4 * block; i < n; i += 4) {  // the tail, and a last partial block
        const auto b = next_block();
        for (int64_t j = 0; j < 4 && i + j < n; ++j) words[i + j] = b[j];
    }
}

double Generator::uniform() {
    auto block = next_block();
    uint64_t bits = (uint64_t{block[0]} << 21) ^ (block[1] >> 11);  // 53 bits
    return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

double Generator::normal() {
    if (has_spare_normal_) {
        has_spare_normal_ = false;
        return spare_normal_;
    }
    double u1 = uniform(), u2 = uniform();
    double radius = std::sqrt(-2.0 * std::log1p(-u1));  // 1 - u1 is in (0, 1]: log never sees 0
    double angle = 2.0 * std::numbers::pi * u2;
    spare_normal_ = radius * std::sin(angle);
    has_spare_normal_ = true;
    return radius * std::cos(angle);
}

void Generator::set_state(uint64_t seed, uint64_t counter) {
    seed_ = seed;
    counter_ = counter;
    has_spare_normal_ = false;
}

Generator& default_generator() {
    static Generator generator(0);
    return generator;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

}  // namespace qk
