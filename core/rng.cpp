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
    return philox4x32({uint32_t(n), uint32_t(n >> 32), 0, 0}, {uint32_t(seed_), uint32_t(seed_ >> 32)});
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
