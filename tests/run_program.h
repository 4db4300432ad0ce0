// Runs a program as a child process with a deadline and collects what it prints: the qknorm
// program in tests/test_cli.cpp, and mpirun starting it in tests/test_dist_cli.cpp.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace qk::test {

struct Outcome {
    int exit_code = -1;  // -1: killed by a signal (an abort) or by the deadline
    bool timed_out = false;
    std::string output;  // stdout and stderr together
};

// Runs argv[0] with argv (and extra environment entries "NAME=value"), stdin from /dev/null,
// QK_NUM_THREADS=1. Past the deadline the child's whole process group is killed.
inline Outcome run_program(const std::vector<std::string>& args,
                           const std::vector<std::string>& env = {}, int seconds = 60) {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::setpgid(0, 0);  // its own group: a deadline kill reaches mpirun's ranks too
        ::dup2(pipe_fds[1], 1), ::dup2(pipe_fds[1], 2), ::close(pipe_fds[0]);
        const int null_fd = ::open("/dev/null", O_RDONLY);
        ::dup2(null_fd, 0);
        ::setenv("QK_NUM_THREADS", "1", 1);
        for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        ::_exit(127);
    }
    ::close(pipe_fds[1]);
    Outcome out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    char buffer[4096];
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{pipe_fds[0], POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) {
            out.timed_out = true;
            ::kill(-pid, SIGKILL);
            break;
        }
        const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
        if (n <= 0) break;
        out.output.append(buffer, static_cast<size_t>(n));
    }
    ::close(pipe_fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFEXITED(status) && !out.timed_out) out.exit_code = WEXITSTATUS(status);
    return out;
}

// A run that must have finished with exit code 0; its output is shown when it did not.
inline void require_ok(const Outcome& out) {
    INFO(out.output);
    REQUIRE(!out.timed_out);
    REQUIRE(out.exit_code == 0);
}

// The qknorm program's path, which meson test passes as QKNORM.
inline std::string qknorm_program() {
    const char* exe = std::getenv("QKNORM");
    REQUIRE_MESSAGE(exe != nullptr, "QKNORM (the qknorm program's path) is set by meson test");
    return exe;
}

// args with each flag of `changes` set to the value after it (appended when args lacks it).
inline std::vector<std::string> with_flags(std::vector<std::string> args,
                                           const std::vector<std::string>& changes) {
    for (size_t i = 0; i + 1 < changes.size(); i += 2) {
        const auto found = std::find(args.begin(), args.end(), changes[i]);
        if (found != args.end() && found + 1 != args.end())
            *(found + 1) = changes[i + 1];
        else
            args.insert(args.end(), {changes[i], changes[i + 1]});
    }
    return args;
}

// `qknorm train` on the suites' tiny model (1 layer, C = 16, 2 heads, T = 16, float32, quiet, no
// sample) on `corpus`, into `run_dir`; `changes`: flag-value pairs, as with_flags takes them.
inline std::vector<std::string> tiny_train_args(const std::string& corpus,
                                                const std::string& run_dir,
                                                const std::vector<std::string>& changes) {
    return with_flags({qknorm_program(), "train", "--data", corpus, "--n-layer", "1", "--n-head",
                       "2", "--n-embd", "16", "--block-size", "16", "--sample-tokens", "0",
                       "--precision", "fp32", "--quiet", "--run-dir", run_dir},
                      changes);
}

}  // namespace qk::test
