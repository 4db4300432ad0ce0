// Controlling a run from outside, as a user does with the qknorm program: Ctrl-C (a checkpoint at
// the end of the step, then the same losses as a run never stopped; a second Ctrl-C quits at
// once), `--resume DIR --steps N` extending a finished run, the settings --resume keeps, a system
// that refuses threads, hostile environment values and oversized inputs, a sweep whose runs all
// fail.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "helpers.h"
#include "nn/lab/sweep.h"
#include "nn/train/run_control.h"
#include "run_program.h"

using namespace qk::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string qknorm() { return qknorm_program(); }

// `qknorm train` on a tiny model: 1 layer, C = 16, T = 16, float32, a checkpoint every 1000 steps
// (so that only a stop writes one), evaluation every 10.
std::vector<std::string> tiny_train(const TempDir& dir, const std::string& run, int steps) {
    return tiny_train_args(
        write_corpus(dir), dir / run,
        {"--batch-size", "4", "--steps", std::to_string(steps), "--warmup", "2", "--eval-every",
         "10", "--eval-batches", "1", "--checkpoint-every", "1000"});
}

std::map<int64_t, json> metrics_by_step(const std::string& run_dir) {
    std::map<int64_t, json> by_step;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line);
        by_step[j["step"].get<int64_t>()] = j;
    }
    return by_step;
}

// Polls for up to a minute until ready() holds.
void wait_for(const std::function<bool()>& ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ready() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

size_t lines_in(const std::string& path) {
    std::ifstream in(path);
    size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
}

// How interrupt_after signals the program.
enum class Interrupt {
    once,     // SIGINT, as Ctrl-C
    twice,    // SIGINT, and again once the first was taken and kDuplicateSeconds later
    group,    // SIGTERM to the program and at once to its process group (kill -TERM -PGID)
    timeout,  // the program runs under GNU timeout, which gets SIGTERM and passes it on twice
};

// Starts args with its output in log (in a process group of its own), waits until
// run_dir/metrics.jsonl has `lines` lines, and interrupts it as `how` says (pending signals of one
// kind merge into one). Returns the wait status.
int interrupt_after(std::vector<std::string> args, const std::string& log,
                    const std::string& run_dir, size_t lines, Interrupt how = Interrupt::once) {
    if (how == Interrupt::timeout) args.insert(args.begin(), {"/usr/bin/timeout", "600"});
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::setpgid(0, 0);
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 1), ::dup2(fd, 2);
        ::setenv("QK_NUM_THREADS", "1", 1);
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    int status = 0;
    bool exited = false;  // on its own, before the signal: a failure the caller reports
    auto exited_or = [&](const std::function<bool()>& ready) {
        return [&, ready] { return (exited = ::waitpid(pid, &status, WNOHANG) == pid) || ready(); };
    };
    wait_for(exited_or([&] { return lines_in(run_dir + "/metrics.jsonl") >= lines; }));
    if (exited) return status;
    const int signal = how == Interrupt::once || how == Interrupt::twice ? SIGINT : SIGTERM;
    ::kill(pid, signal);
    if (how == Interrupt::twice || how == Interrupt::group) {
        // The second after the first was taken (else the two merge into one pending signal):
        // at once for the group, as timeout does; later for a user's second Ctrl-C.
        wait_for(
            exited_or([&] { return read_file(log).find("stopping after") != std::string::npos; }));
        if (exited) return status;
        if (how == Interrupt::twice)
            std::this_thread::sleep_for(
                std::chrono::duration<double>(1.5 * qk::nn::kDuplicateSeconds));
        ::kill(how == Interrupt::group ? -pid : pid, signal);
    }
    ::waitpid(pid, &status, 0);
    return status;
}

}  // namespace

TEST_CASE("Ctrl-C: a checkpoint at the end of the step, a resume command, the same losses") {
    TempDir dir("run_control_sigint");
    const int steps = 3000;  // far more than the run lasts before the signal
    const int status = interrupt_after(tiny_train(dir, "run", steps), dir / "log", dir / "run", 8);
    const std::string log = read_file(dir / "log");
    INFO(log);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    CHECK(log.find("stopping after this step") != std::string::npos);
    CHECK(log.find(qknorm() + " train --resume " + dir / "run") != std::string::npos);
    // The checkpoint is of the last step in metrics.jsonl, which the loss of no later step follows.
    const auto stopped = metrics_by_step(dir / "run");
    const int64_t at = stopped.rbegin()->first;
    REQUIRE(at >= 7);
    REQUIRE(at < steps);
    CHECK(fs::exists(dir / "run" + fmt::format("/step-{:06d}.model.safetensors", at)));
    CHECK(!fs::exists(dir / "run/result.json"));  // not finished
}

TEST_CASE("Ctrl-C then resume gives the losses of a run never stopped, bit for bit") {
    TempDir dir("run_control_resume");
    const int steps = 400;
    const int status = interrupt_after(tiny_train(dir, "run", steps), dir / "log", dir / "run", 6);
    INFO(read_file(dir / "log"));
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 130);
    require_ok(run_program({qknorm(), "train", "--resume", dir / "run", "--quiet"}, {}, 120));
    require_ok(run_program(tiny_train(dir, "straight", steps), {}, 120));
    const auto resumed = metrics_by_step(dir / "run"), straight = metrics_by_step(dir / "straight");
    REQUIRE(resumed.size() == straight.size());
    for (const auto& [step, record] : straight) {
        if (!record.contains("loss")) continue;
        INFO("step ", step);
        CHECK(resumed.at(step)["loss"] == record["loss"]);
    }
}

TEST_CASE("a second Ctrl-C quits at once") {
    TempDir dir("run_control_twice");
    // Steps of about two seconds (C = 512, T = 256, B = 32): the first signal comes as the second
    // step starts, the second 0.3 s after it (past the duplicate window), mid-step.
    const std::vector<std::string> args = with_flags(
        tiny_train(dir, "run", 100),
        {"--n-embd", "512", "--n-head", "8", "--block-size", "256", "--batch-size", "32"});
    const int status = interrupt_after(args, dir / "log", dir / "run", 1, Interrupt::twice);
    INFO(read_file(dir / "log"));
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGINT);
}

// GNU timeout passes its SIGTERM to the program and then to the program's process group: one
// request arriving twice, which the "second signal quits at once" rule took for a second Ctrl-C
// (a run under `timeout 900` lost its checkpoint). kill -TERM of the group does the same.
TEST_CASE(
    "the same signal twice at once (timeout, a process group) still stops with a checkpoint") {
    for (const Interrupt how : {Interrupt::group, Interrupt::timeout}) {
        TempDir dir("run_control_duplicate");
        // Steps of a few tenths of a second, so that the second signal finds the run in its last
        // step, as timeout's does (a tiny run could be past its stop by then).
        const std::vector<std::string> args =
            with_flags(tiny_train(dir, "run", 3000),
                       {"--n-embd", "256", "--n-head", "4", "--block-size", "128"});
        const int status = interrupt_after(args, dir / "log", dir / "run", 2, how);
        const std::string log = read_file(dir / "log");
        INFO(log);
        REQUIRE(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 128 + SIGTERM);  // timeout passes the program's status on
        const int64_t at = metrics_by_step(dir / "run").rbegin()->first;
        CHECK(fs::exists(dir / "run" + fmt::format("/step-{:06d}.model.safetensors", at)));
        CHECK(log.find("qknorm train --resume") != std::string::npos);
    }
}

TEST_CASE("--resume DIR --steps N extends a finished run; the schedule keeps its length") {
    TempDir dir("run_control_extend");
    const std::vector<std::string> first =
        with_flags(tiny_train(dir, "run", 10),
                   {"--lr", "0.01", "--lr-min", "0.001", "--zero", "1", "--dist-timeout", "17"});
    require_ok(run_program(first, {}, 120));
    json config = json::parse(read_file(dir / "run/config.json"));
    CHECK(config["zero"] == 1);  // kept for --resume
    CHECK(config["dist_timeout"] == 17.0);
    require_ok(run_program(
        {qknorm(), "train", "--resume", dir / "run", "--steps", "14", "--dist-timeout", "30"}, {},
        120));
    config = json::parse(read_file(dir / "run/config.json"));
    CHECK(config["steps"] == 14);
    CHECK(config["schedule_steps"] == 10);
    CHECK(config["zero"] == 1);
    CHECK(config["dist_timeout"] == 30.0);
    const auto metrics = metrics_by_step(dir / "run");
    CHECK(metrics.rbegin()->first == 14);
    for (int64_t step = 11; step <= 14; ++step) CHECK(metrics.at(step)["lr"] == 0.001);
    const Outcome shorter =
        run_program({qknorm(), "train", "--resume", dir / "run", "--steps", "5"}, {}, 60);
    CHECK(shorter.exit_code == 2);
    CHECK(shorter.output.find("extend a run, not shorten it") != std::string::npos);
    const Outcome model_flag =
        run_program({qknorm(), "train", "--resume", dir / "run", "--n-head", "4"}, {}, 60);
    CHECK(model_flag.exit_code == 2);
    CHECK(model_flag.output.find("--n-head") != std::string::npos);
}

// The pool catches the std::system_error a refused std::thread throws. QK_THREAD_LIMIT raises it
// for the third thread: `ulimit -v` against 1 GB stacks did so for real, but left OpenBLAS too
// little address space for its buffers, and its allocator retries forever (a hang, not ours).
TEST_CASE("a system that refuses threads: fewer threads and a notice, never an abort") {
    TempDir dir("run_control_threads");
    std::vector<std::string> args = tiny_train(dir, "run", 3);
    args.insert(args.end(), {"--threads", "16"});
    const Outcome out = run_program(args, {"QK_THREAD_LIMIT=3"}, 60);
    INFO(out.output);
    CHECK(!out.timed_out);
    CHECK(out.exit_code == 0);
    CHECK(out.output.find("the system refused thread 4 of 16") != std::string::npos);
    CHECK(out.output.find("running on 3") != std::string::npos);
}

TEST_CASE("hostile environment values and oversized inputs get one short error") {
    TempDir dir("run_control_hostile");
    std::vector<std::string> args = tiny_train(dir, "run", 3);
    args.insert(args.end(), {"--threads", "2"});
    const Outcome spin = run_program(args, {"QK_SPIN_US=9223372036854775807"}, 60);
    INFO(spin.output);
    CHECK(spin.exit_code != 0);
    CHECK(spin.output.find("QK_SPIN_US") != std::string::npos);
    // A long flag value is echoed cut short, not whole (twice).
    const std::string huge(100'000, 'x');
    const Outcome echoed = run_program({qknorm(), "train", "--qk-norm", huge}, {}, 60);
    CHECK(echoed.exit_code == 2);
    CHECK(echoed.output.size() < 2000);
    CHECK(echoed.output.find("(100000 bytes)") != std::string::npos);
    // A config file far larger than any config.
    std::ofstream(dir / "big.toml") << "[train]\n" << std::string(2 << 20, '#') << "\n";
    const Outcome big = run_program({qknorm(), "train", "--config", dir / "big.toml"}, {}, 60);
    CHECK(big.exit_code == 2);
    CHECK(big.output.find("1048576 byte limit") != std::string::npos);
}

TEST_CASE("a sweep whose runs all fail exits with an error") {
    TempDir dir("run_control_sweep");
    std::ofstream(dir / "short.txt") << "too short";  // fewer characters than one window
    const Outcome out = run_program({qknorm(),     "sweep",      "--data",       dir / "short.txt",
                                     "--variants", "baseline",   "--lrs",        "0.001",
                                     "--seeds",    "1",          "--steps",      "2",
                                     "--n-layer",  "1",          "--n-embd",     "16",
                                     "--n-head",   "2",          "--block-size", "16",
                                     "--out",      dir / "sweep"},
                                    {}, 120);
    INFO(out.output);
    CHECK(out.exit_code == 1);
    CHECK(out.output.find("1 of 1 runs failed") != std::string::npos);
}

// A sweep of 42 runs printed nothing on Ctrl-C: only a run's log.txt said where it stopped.
TEST_CASE("Ctrl-C stops a sweep: no new run, the running one checkpointed, and a report") {
    TempDir dir("run_control_sweep_stop");
    const std::vector<std::string> args = {
        qknorm(),     "sweep",      "--data",       write_corpus(dir),
        "--variants", "baseline",   "--lrs",        "0.01,0.02",
        "--seeds",    "1",          "--steps",      "3000",
        "--n-layer",  "1",          "--n-embd",     "16",
        "--n-head",   "2",          "--block-size", "16",
        "--out",      dir / "sweep"};
    const std::string first = dir / "sweep/runs/" + qk::nn::run_dir_name("baseline", 0.01, 1);
    // SIGINT to the sweep alone (kill PID): it passes it on to the run it started.
    const int status = interrupt_after(args, dir / "log", first, 3);
    const std::string log = read_file(dir / "log");
    INFO(log);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    CHECK(log.find("stopped (Ctrl-C): 0 of 2 runs finished, 1 not started") != std::string::npos);
    CHECK(log.find("baseline lr 0.01 seed 1: stopped at step") != std::string::npos);
    CHECK(log.find("Continue with the same command") != std::string::npos);
    const int64_t at = metrics_by_step(first).rbegin()->first;
    CHECK(fs::exists(first + fmt::format("/step-{:06d}.model.safetensors", at)));
    CHECK(!fs::exists(dir / "sweep/results.csv"));  // no table of a sweep not done
}

TEST_CASE("short runs validate about 20 times; into a pipe, progress is a plain line a 1/20") {
    TempDir dir("run_control_cadence");
    std::vector<std::string> args = tiny_train(dir, "run", 300);
    args.erase(std::find(args.begin(), args.end(), "--quiet"));
    args.erase(std::find(args.begin(), args.end(), "--eval-every"),
               std::find(args.begin(), args.end(), "--eval-every") + 2);
    const Outcome out = run_program(args, {}, 120);  // stderr is a pipe here, not a terminal
    INFO(out.output);
    REQUIRE(out.exit_code == 0);
    CHECK(out.output.find('\r') == std::string::npos);
    size_t progress_lines = 0;
    for (size_t at = 0; (at = out.output.find("\nstep ", at)) != std::string::npos; ++at)
        ++progress_lines;
    CHECK(progress_lines == 20);
    CHECK(out.output.find("step 15/300  loss") != std::string::npos);
    std::vector<int64_t> validated;
    for (const auto& [step, record] : metrics_by_step(dir / "run"))
        if (record.contains("val_loss")) validated.push_back(step);
    REQUIRE(validated.size() == 21);  // step 0, then every 15 steps
    CHECK(validated[1] == 15);
    CHECK(validated.back() == 300);
    // The plot: the final validation figure, the learning-rate schedule.
    const std::string svg = read_file(dir / "run/plot.svg");
    CHECK(svg.find("final val") != std::string::npos);
    CHECK(svg.find("Learning rate") != std::string::npos);
    const Outcome help = run_program({qknorm(), "train", "--help"}, {}, 30);
    CHECK(help.output.find("--threads") != std::string::npos);
    CHECK(help.output.find("--eval-every") != std::string::npos);
}
