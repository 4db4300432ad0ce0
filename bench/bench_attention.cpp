// Fused attention against the unfused composition: forward + backward time and peak memory.
//
//   QK_NUM_THREADS=1 ./build/bench/bench_attention        (then with 2)
//   ./build/bench/bench_attention 1024                     one T only
//   ./build/bench/bench_attention 256 32                   one T, head size 32 (the speedrun's)
//
// Causal attention, float32, H = 6 heads of D = 64 (or the second argument), B·T = 8192 tokens (B =
// 8192 / T), at T = 64, 256, 1024, 4096. One call: out = attention(q, k, v); sum(out ·
// probe).backward(). Peak memory: the most Storage bytes live at once during the call, above what
// was live before it (q, k, v and the probe); saved: live bytes after the forward minus before
// (what the graph keeps for backward, the output included). Both paths are timed in alternation, so
// the ratio is taken under the same machine conditions.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "bench_util.h"
#include "qk.h"

using namespace qk;

namespace {

constexpr int64_t kTokens = 8192, kHeads = 6;

struct Measure {
    double seconds = 0, peak_mb = 0, saved_mb = 0;
};

double mb(std::size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

struct Inputs {
    Tensor q, k, v, probe;
    Inputs(int64_t T, int64_t D) {
        const Shape shape{kTokens / T, kHeads, T, D};
        Generator gen(1);
        q = normal(shape, 0, 1, kF32, gen);
        k = normal(shape, 0, 1, kF32, gen);
        v = normal(shape, 0, 1, kF32, gen);
        probe = normal(shape, 0, 1, kF32, gen);
        for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
    }
};

// One forward + backward of one path; fills saved/peak bytes.
void run_once(const Inputs& in, bool fused, Measure& m) {
    for (Tensor t : {in.q, in.k, in.v}) t.zero_grad();
    const std::size_t before = live_storage_bytes();
    reset_peak_storage_bytes();
    const AttentionOptions o{.causal = true};
    Tensor out = fused ? attention(in.q, in.k, in.v, o) : attention_unfused(in.q, in.k, in.v, o);
    m.saved_mb = mb(live_storage_bytes() - before);
    sum(out * in.probe).backward();
    m.peak_mb = mb(peak_storage_bytes() - before);
}

struct Row {
    int64_t T;
    Measure fused, unfused;
};

Row bench_T(int64_t T, int64_t D) {
    Inputs in(T, D);
    Row row{T, {}, {}};
    // Alternate the two paths, several rounds, and keep each one's median.
    std::vector<double> fused_s, unfused_s;
    const int rounds = T >= 4096 ? 3 : 5;
    for (int r = 0; r < rounds; ++r) {
        fused_s.push_back(bench::time_median([&] { run_once(in, true, row.fused); }, 0.2, 2));
        unfused_s.push_back(bench::time_median([&] { run_once(in, false, row.unfused); }, 0.2, 2));
    }
    auto median = [](std::vector<double> v) {
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
    };
    row.fused.seconds = median(fused_s);
    row.unfused.seconds = median(unfused_s);
    return row;
}

}  // namespace

int main(int argc, char** argv) {
    bench::quiet_openblas_threads(argv);
    std::vector<int64_t> lengths{64, 256, 1024, 4096};
    if (argc > 1) lengths = {std::stoll(argv[1])};
    const int64_t head_dim = argc > 2 ? std::stoll(argv[2]) : 64;
    fmt::print(
        "# Causal attention forward + backward, float32, H = {}, D = {}, B·T = {} tokens, {} "
        "thread(s)\n\n",
        kHeads, head_dim, kTokens, num_threads());
    fmt::print(
        "| T | B | fused ms | unfused ms | unfused / fused time | fused peak MB | unfused peak "
        "MB | unfused / fused peak | fused saved MB | unfused saved MB |\n");
    fmt::print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int64_t T : lengths) {
        const Row r = bench_T(T, head_dim);
        fmt::print(
            "| {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n",
            T, kTokens / T, r.fused.seconds * 1e3, r.unfused.seconds * 1e3,
            r.unfused.seconds / r.fused.seconds, r.fused.peak_mb, r.unfused.peak_mb,
            r.unfused.peak_mb / r.fused.peak_mb, r.fused.saved_mb, r.unfused.saved_mb);
        std::fflush(stdout);
    }
    fmt::print(
        "\npeak: the most bytes live during forward + backward above those live before (q, k, "
        "v, probe): the output, what is saved, the gradients and every temporary. saved: live "
        "after the forward minus before.\n");
    return 0;
}
