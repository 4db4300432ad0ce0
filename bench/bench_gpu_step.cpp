// bench_gpu_step: one training step of the GPT-2-124M-shaped model on the device, timed as
// PyTorch's peer times its own (bench/gpu_check.sh runs both in one call on a lent GPU).
//
//   ./build/bench/bench_gpu_step [VOCAB=65] [BATCH=16] [naive|fused] [STEPS=20] [WARM=8]
//   QK_LEDGER=h200 ./build/bench/bench_gpu_step ...   then one more step with its launch ledger
//                  (cuda/ledger.h): each launch timed by CUDA events, grouped by kernel, beside
//                  the cost model's estimate for that GPU; QK_LEDGER_CSV=path also writes every
//                  launch (name, grid, block, bytes, FLOPs, estimate, measured) for calibration
//   ./build/bench/bench_gpu_step calibrate LEDGER.csv [h200]   a measured ledger (the CSV above,
//                  from a GPU) re-estimated by today's cost model, by kernel: how close it lands
//
// The model is the project's default block at GPT-2 small's size: 12 layers, width 768, 12 heads,
// context 1024, QK-LayerNorm per head, RoPE, tanh-GELU MLP, tied embeddings, bf16 mixed precision.
// A step is the trainer's: forward with targets, backward, clip_grad_norm(1.0), AdamW, zero_grad,
// on fixed random ids (VOCAB 65 is Tiny Shakespeare's, 50257 GPT-2's, as llm.c measures). The
// time of a step is wall time between two device synchronisations; the median of the steps after
// WARM is reported, with tokens/s and the model FLOP rate in llm.c's count (6N + 6·L·T·C per
// token, the causal half not discounted).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/cost_model.h"
#include "cuda/ledger.h"
#include "cuda/runtime.h"
#include "nn/model/gpt.h"
#include "nn/optim/optim.h"
#include "qk.h"

using namespace qk;

namespace {

// One more step under a ledger: the table by kernel, and every launch as CSV on request. On a GPU
// each launch is timed; in the emulation build the step is a dry run (recorded, not run).
template <class Step>
void print_ledger(Step& step, const std::string& gpu_name, int64_t layers, bool dry_run) {
    const auto& gpu = cuda::cost::gpu(gpu_name);
    cuda::ledger::open(/*time_launches=*/!dry_run, dry_run);
    step();
    const auto entries = cuda::ledger::close();
    fmt::print("\nledger of one step ({} launches, {:.0f} per layer):\n{}", entries.size(),
               double(entries.size()) / double(layers), cuda::cost::table(entries, gpu));
    const char* csv = std::getenv("QK_LEDGER_CSV");
    if (!csv) return;
    std::ofstream out(csv);
    out << "launch,kernel,grid,block,bytes,flops,tensor_flops,float64,estimated_us,measured_us\n";
    for (size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        out << fmt::format("{},\"{}\",\"({},{},{})\",\"({},{},{})\",{},{},{},{},{:.3f},{:.3f}\n", i,
                           e.name, e.grid[0], e.grid[1], e.grid[2], e.block[0], e.block[1],
                           e.block[2], e.bytes, e.flops, e.tensor_flops, int(e.float64),
                           cuda::cost::estimate_us(e, gpu), e.measured_us);
    }
}

// A measured ledger CSV (print_ledger's) back as entries.
std::vector<cuda::ledger::Entry> read_ledger_csv(const std::string& path) {
    std::ifstream in(path);
    QK_CHECK(in, "bench_gpu_step calibrate: cannot read {}", path);
    std::string line;
    std::getline(in, line);  // the header
    std::vector<cuda::ledger::Entry> entries;
    while (std::getline(in, line)) {
        // launch,"kernel","(gx,gy,gz)","(bx,by,bz)",bytes,flops,tensor_flops,float64,est,measured
        const auto q1 = line.find('"'), q2 = line.find('"', q1 + 1);
        const auto q3 = line.find('"', q2 + 1), q4 = line.find('"', q3 + 1);
        const auto q5 = line.find('"', q4 + 1), q6 = line.find('"', q5 + 1);
        QK_CHECK(q6 != std::string::npos, "bench_gpu_step calibrate: bad line in {}: {}", path,
                 line);
        cuda::ledger::Entry e;
        e.name = line.substr(q1 + 1, q2 - q1 - 1);
        e.library = e.name.rfind("cublas:", 0) == 0 || e.name.rfind("cuda:", 0) == 0;
        std::sscanf(line.c_str() + q3, "\"(%u,%u,%u)\"", &e.grid[0], &e.grid[1], &e.grid[2]);
        std::sscanf(line.c_str() + q5, "\"(%u,%u,%u)\"", &e.block[0], &e.block[1], &e.block[2]);
        int float64 = 0;
        double estimated = 0;
        std::sscanf(line.c_str() + q6 + 1, ",%lf,%lf,%lf,%d,%lf,%lf", &e.bytes, &e.flops,
                    &e.tensor_flops, &float64, &estimated, &e.measured_us);
        e.float64 = float64 != 0;
        e.declared = e.bytes > 0 || e.flops > 0 || e.tensor_flops > 0;
        entries.push_back(e);
    }
    return entries;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 2 && std::string(argv[1]) == "calibrate") {
        const auto entries = read_ledger_csv(argv[2]);
        const auto& gpu = cuda::cost::gpu(argc > 3 ? argv[3] : "h200");
        fmt::print("{} launches of {}, re-estimated for {}:\n{}", entries.size(), argv[2], gpu.name,
                   cuda::cost::table(entries, gpu));
        return 0;
    }
    const int64_t V = argc > 1 ? std::stoll(argv[1]) : 65, B = argc > 2 ? std::stoll(argv[2]) : 16;
    const bool fused = argc > 3 && std::string(argv[3]) == "fused";
    const int steps = argc > 4 ? std::stoi(argv[4]) : 20, warm = argc > 5 ? std::stoi(argv[5]) : 8;
    const int64_t L = 12, C = 768, H = 12, T = 1024;
    const char* ledger_gpu = std::getenv("QK_LEDGER");
    const bool want_ledger = ledger_gpu && *ledger_gpu;
#ifdef QK_CUDA_EMULATION
    // No GPU to time: the ledger of a dry-run step, with the cost model's estimate, is all there
    // is.
    constexpr bool emulated = true;
    if (!want_ledger) {
        fmt::print(
            "bench_gpu_step: the emulation build times nothing; QK_LEDGER=h200 (or h100) "
            "prints the estimated ledger of one dry-run step\n");
        return 0;
    }
#else
    constexpr bool emulated = false;
#endif
    if (!cuda::device_available()) {
        fmt::print("bench_gpu_step: no CUDA device here ({}), nothing to time\n",
                   cuda::backend_description());
        return 0;
    }
    nn::GPTConfig cfg;
    cfg.vocab_size = V;
    cfg.block_size = T;
    cfg.n_layer = L;
    cfg.n_head = H;
    cfg.n_embd = C;
    cfg.qk_norm = nn::QKNorm::layernorm;
    cfg.pos_emb = nn::PosEmb::rope;
    cfg.precision = Precision::bf16;
    cfg.fused_attention = fused;
    nn::GPT model(cfg, /*seed=*/1);
    model.to(Device::cuda);
    nn::AdamW opt(model.parameters(), nn::AdamWOptions{.lr = 3e-4});
    int64_t n_params = 0;
    for (const Tensor& p : model.parameters()) n_params += p.numel();

    Generator gen(7);
    auto random_ids = [&] {
        Tensor t = Tensor::empty({B, T}, kI32);
        for (int64_t i = 0; i < t.numel(); ++i)
            t.data<int32_t>()[i] = static_cast<int32_t>(gen.next_block()[0] % uint32_t(V));
        return t.to(Device::cuda);
    };
    const Tensor ids = random_ids(), targets = random_ids();
    double loss = 0;
    auto step = [&] {
        nn::GPTOutput out = model.forward(ids, targets);
        out.loss.backward();
        nn::clip_grad_norm(model.parameters(), 1.0,
                           /*throw_on_nonfinite=*/false);  // as the trainer
        opt.step(3e-4);
        opt.zero_grad();
        loss = out.cross_entropy.item();  // the one read a training loop makes
    };
    if (emulated) {
        fmt::print("bench_gpu_step: {} V={} B={} L{} C{} T{}, estimated on {}\n",
                   fused ? "fused" : "naive", V, B, L, C, T, ledger_gpu);
        // A first step makes each weight's bf16 copy, which the optimizer then keeps current:
        // the ledger shows a later step, as on a GPU after the warm-up steps.
        cuda::ledger::open(false, /*dry_run=*/true);
        step();
        (void)cuda::ledger::close();
        print_ledger(step, ledger_gpu, L, /*dry_run=*/true);
        return 0;
    }
    std::vector<double> seconds;
    for (int s = 0; s < steps; ++s) {
        cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        step();
        cuda::synchronize();
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::vector<double> timed(seconds.begin() + std::min<int>(warm, steps - 1), seconds.end());
    std::nth_element(timed.begin(), timed.begin() + timed.size() / 2, timed.end());
    const double step_s = timed[timed.size() / 2];
    const double flops_per_token = 6.0 * double(n_params) + 6.0 * double(L * T * C);
    fmt::print(
        "RESULT qknorm bf16 {} V={} B={} L{} C{} T{} N={:.1f}M: step {:.1f} ms, {:.0f} tok/s, "
        "{:.1f} TFLOP/s (llm.c count), loss {:.3f} on {}\n",
        fused ? "fused" : "naive", V, B, L, C, T, double(n_params) / 1e6, step_s * 1e3,
        double(B * T) / step_s, flops_per_token * double(B * T) / step_s / 1e12, loss,
        cuda::backend_description());
    if (want_ledger) print_ledger(step, ledger_gpu, L, /*dry_run=*/false);
    return 0;
}
