// Data-parallel training as a user runs it: `mpirun -np 2 qknorm train ...` against one process
// (same losses, same checkpoints), --grad-accum against a whole batch, resuming across rank
// counts, and the faults that must end a job with an error instead of a hang: a killed rank, a
// frozen rank, ranks started with different settings, a batch that does not split.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.h"
#include "run_program.h"

using namespace qk;
using namespace qk::test;

namespace {

const std::vector<std::string> kMpiEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};

std::string qknorm() { return qknorm_program(); }

// `qknorm train` on a tiny model, 20 steps, checkpoints every 10; `more`: flag-value pairs.
std::vector<std::string> tiny_train(const TempDir& dir, const std::string& run,
                                    std::vector<std::string> more = {}) {
    // float32 (tiny_train_args): the sums these tests compare are float32 sums
    const auto args =
        tiny_train_args(write_corpus(dir), dir / run,
                        {"--batch-size", "8", "--steps", "20", "--warmup", "4", "--lr", "1e-2",
                         "--eval-every", "10", "--eval-batches", "4", "--checkpoint-every", "10"});
    return with_flags(args, more);
}

std::vector<std::string> mpirun(int ranks, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

// The training losses of a run's metrics.jsonl, by step.
std::map<int64_t, double> losses(const std::string& run_dir) {
    std::map<int64_t, double> by_step;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) by_step[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return by_step;
}

void check_same_losses(const std::string& a, const std::string& b, double rel, int64_t first = 1) {
    const auto la = losses(a), lb = losses(b);
    REQUIRE(la.size() == 20);
    for (int64_t step = first; step <= 20; ++step) {
        INFO("step ", step);
        REQUIRE(lb.count(step) == 1);
        CHECK(std::abs(la.at(step) - lb.at(step)) <= rel * std::abs(la.at(step)));
    }
}

}  // namespace

TEST_CASE("2 ranks x B/2 train like 1 process x B; --grad-accum 2 like the whole batch") {
    TempDir dir("dist_same");
    require_ok(run_program(tiny_train(dir, "one"), {}, 120));
    require_ok(run_program(mpirun(2, tiny_train(dir, "two")), kMpiEnv, 120));
    require_ok(run_program(tiny_train(dir, "accum", {"--grad-accum", "2"}), {}, 120));
    require_ok(run_program(
        mpirun(2, tiny_train(dir, "two_accum",
                             {"--grad-accum", "2", "--overlap", "false", "--bucket-mb", "0.001"})),
        kMpiEnv, 120));
    const Outcome zero =
        run_program(mpirun(2, tiny_train(dir, "two_zero", {"--zero", "1"})), kMpiEnv, 120);
    require_ok(zero);
    CHECK(zero.output.find("optimizer state: 0.0 MB on each of 2 rank(s) (ZeRO-1: AdamW's "
                           "moments sharded)") != std::string::npos);
    // Muon and QK-Clip: every rank orthogonalises the same averaged gradient and clips the heads
    // by the maxima of the whole batch (a max over the ranks).
    const std::vector<std::string> muon_clip = {"--optimizer", "muon",      "--qk-norm",
                                                "none",        "--qk-clip", "0.05"};
    require_ok(run_program(tiny_train(dir, "one_muon", muon_clip), {}, 120));
    require_ok(run_program(mpirun(2, tiny_train(dir, "two_muon", muon_clip)), kMpiEnv, 120));
    check_same_losses(dir / "one_muon", dir / "two_muon", 1e-5);
    CHECK(read_file(dir / "two_muon/metrics.jsonl").find("\"heads_clipped\":1") !=
          std::string::npos);
    // float32: the sums run in another order (per rank, then over ranks)
    check_same_losses(dir / "one", dir / "two", 1e-5);
    check_same_losses(dir / "two", dir / "two_zero", 1e-5);
    check_same_losses(dir / "one", dir / "accum", 1e-5);
    check_same_losses(dir / "one", dir / "two_accum", 1e-5);
    // rank 0 alone wrote the run directory, the same files a single process writes
    for (const char* file : {"config.json", "metrics.jsonl", "plot.svg", "result.json",
                             "step-000020.model.safetensors", "step-000020.state.safetensors"})
        CHECK(std::filesystem::exists(dir / ("two/" + std::string(file))));
}

TEST_CASE("fine-tuning an imported model: 2 ranks train like 1 process, from rank 0's copy") {
    TempDir dir("dist_fine_tune");
    const char* fixtures = std::getenv("HF_FIXTURES");
    REQUIRE_MESSAGE(fixtures != nullptr, "HF_FIXTURES (tests/data/hf) is set by meson test");
    auto fine_tune = [&](const std::string& run) {
        return std::vector<std::string>{qknorm(),          "train",
                                        "--init-from",     std::string(fixtures) + "/qwen3",
                                        "--data",          write_corpus(dir),
                                        "--context",       "24",
                                        "--batch-size",    "8",
                                        "--steps",         "20",
                                        "--eval-every",    "10",
                                        "--eval-batches",  "4",
                                        "--precision",     "fp32",
                                        "--sample-tokens", "0",
                                        "--quiet",         "--run-dir",
                                        dir / run};
    };
    require_ok(run_program(fine_tune("one"), {}, 120));
    require_ok(run_program(mpirun(2, fine_tune("two")), kMpiEnv, 120));
    check_same_losses(dir / "one", dir / "two", 1e-5);
}

TEST_CASE("a run resumes on another number of ranks: 2 -> 1 (from ZeRO-1) and 1 -> 2") {
    TempDir dir("dist_resume");
    require_ok(run_program(tiny_train(dir, "full"), {}, 120));
    for (const auto& [name, first, then] :
         {std::tuple{"two_then_one", 2, 1}, std::tuple{"one_then_two", 1, 2}}) {
        INFO(name);
        const std::string run = dir / name;
        // the 2-rank run shards AdamW: its checkpoints hold the gathered, whole moments
        const std::vector<std::string> zero =
            first == 2 ? std::vector<std::string>{"--zero", "1"} : std::vector<std::string>{};
        require_ok(run_program(mpirun(first, tiny_train(dir, name, zero)), kMpiEnv, 120));
        // Back to the checkpoint of step 10, as if the job had been killed after it.
        std::filesystem::remove(run + "/step-000020.model.safetensors");
        std::filesystem::remove(run + "/step-000020.state.safetensors");
        require_ok(run_program(mpirun(then, {qknorm(), "train", "--resume", run, "--quiet"}),
                               kMpiEnv, 120));
        check_same_losses(dir / "full", run, 1e-5, 11);
    }
}

TEST_CASE("fp8 on 2 ranks: the amax histories agree, so a resumed run equals an unbroken one") {
    // Each rank scales by the amaxes of its own rows unless they are synced after each step: then
    // rank 0's checkpointed histories are every rank's, and resuming from them changes nothing.
    TempDir dir("dist_fp8");
    const auto fp8_run = [&](const std::string& name) {
        std::vector<std::string> args =
            tiny_train(dir, name, {"--precision", "fp8", "--grad-accum", "2"});
        args.push_back("--fp8-attention");
        return mpirun(2, args);
    };
    require_ok(run_program(fp8_run("full"), kMpiEnv, 120));
    require_ok(run_program(fp8_run("resumed"), kMpiEnv, 120));
    const std::string run = dir / "resumed";
    std::filesystem::remove(run + "/step-000020.model.safetensors");
    std::filesystem::remove(run + "/step-000020.state.safetensors");
    require_ok(
        run_program(mpirun(2, {qknorm(), "train", "--resume", run, "--quiet"}), kMpiEnv, 120));
    check_same_losses(dir / "full", run, 0.0, 11);
}

TEST_CASE("a killed or frozen rank ends the job with an error; the last checkpoint stays") {
    TempDir dir("dist_faults");
    const auto start = std::chrono::steady_clock::now();
    Outcome killed = run_program(mpirun(2, tiny_train(dir, "killed")),
                                 {kMpiEnv[0], kMpiEnv[1], "QK_FAULT_INJECT=kill:1:15"}, 60);
    INFO(killed.output);
    CHECK(!killed.timed_out);
    CHECK(killed.exit_code != 0);
    CHECK(killed.output.find("rank 1") != std::string::npos);
    CHECK(std::filesystem::exists(dir / "killed/step-000010.model.safetensors"));
    Outcome frozen = run_program(mpirun(2, tiny_train(dir, "frozen", {"--dist-timeout", "3"})),
                                 {kMpiEnv[0], kMpiEnv[1], "QK_FAULT_INJECT=stop:1:15"}, 60);
    INFO(frozen.output);
    CHECK(!frozen.timed_out);
    CHECK(frozen.exit_code != 0);
    CHECK(frozen.output.find("stopped answering") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
    // The checkpoint left behind resumes (alone).
    require_ok(run_program({qknorm(), "train", "--resume", dir / "frozen", "--quiet"}, {}, 120));
}

TEST_CASE("ranks started differently, or a batch that does not split, are refused") {
    TempDir dir("dist_refused");
    std::vector<std::string> argv = {"mpirun", "-np", "1"};
    for (const std::string& a : tiny_train(dir, "mixed", {"--lr", "0.001"})) argv.push_back(a);
    argv.insert(argv.end(), {":", "-np", "1"});
    for (const std::string& a : tiny_train(dir, "mixed", {"--lr", "0.002"})) argv.push_back(a);
    Outcome mixed = run_program(argv, kMpiEnv, 60);
    INFO(mixed.output);
    CHECK(mixed.exit_code != 0);
    CHECK(mixed.output.find("other settings") != std::string::npos);
    CHECK(mixed.output.find("lr: 0.001 vs 0.002") != std::string::npos);
    // The same path and size, other text: each rank reads data.txt in its own working directory.
    for (const char* rank_dir : {"rank0", "rank1"}) {
        std::filesystem::create_directories(dir / rank_dir);
        std::string text = read_file(write_corpus(dir));
        if (std::string(rank_dir) == "rank1") text[100] = text[100] == 'a' ? 'e' : 'a';
        std::ofstream(dir / rank_dir + "/data.txt") << text;
    }
    std::vector<std::string> content = {"mpirun", "-np", "1", "-wdir", dir / "rank0"};
    for (const std::string& a : tiny_train(dir, "content", {"--data", "data.txt"}))
        content.push_back(a);
    content.insert(content.end(), {":", "-np", "1", "-wdir", dir / "rank1"});
    for (const std::string& a : tiny_train(dir, "content", {"--data", "data.txt"}))
        content.push_back(a);
    Outcome other_text = run_program(content, kMpiEnv, 60);
    INFO(other_text.output);
    CHECK(other_text.exit_code != 0);
    CHECK(other_text.output.find("data_fnv1a64") != std::string::npos);
    Outcome odd = run_program(
        mpirun(2, tiny_train(dir, "odd", {"--batch-size", "6", "--grad-accum", "2"})), kMpiEnv, 60);
    INFO(odd.output);
    CHECK(odd.exit_code != 0);
    CHECK(odd.output.find("--batch-size 6 does not split over 2 rank(s) x --grad-accum 2") !=
          std::string::npos);
}
