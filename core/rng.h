// Generator: a counter-based random number generator (Philox-4x32-10, Salmon et al. 2011).
//
// The n-th block of four 32-bit numbers is a pure function of (seed, n), so the same seed gives the
// same tensors on every machine and on every device (tensors are drawn on the cpu and copied),
// and a generator's whole state is two integers, which a checkpoint saves.
#pragma once

#include <array>
#include <cstdint>

namespace qk {

class Generator {
  public:
    explicit Generator(uint64_t seed = 0) : seed_(seed) {}

    std::array<uint32_t, 4> next_block();  // four fresh 32-bit words
    // n words: the next ceil(n / 4) blocks' words in order, as repeated next_block() gives them
    // (the unused words of a last partial block are dropped), vectorised.
    void fill(uint32_t* words, int64_t n);
    double uniform();  // in [0, 1), 53 random bits
    double normal();   // N(0, 1), Box-Muller; caches the second value

    uint64_t seed() const { return seed_; }
    uint64_t counter() const { return counter_; }
    void set_state(uint64_t seed, uint64_t counter);

  private:
    uint64_t seed_;
    uint64_t counter_ = 0;  // blocks drawn so far
    bool has_spare_normal_ = false;
    double spare_normal_ = 0;
};

// The process-wide generator that factories use when none is passed.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace qk
