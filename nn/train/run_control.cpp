#include "nn/train/run_control.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

#include "core/error.h"

namespace qk::nn {

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_first_ns{0};  // when the first signal came (CLOCK_MONOTONIC)
struct sigaction g_previous_int, g_previous_term;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Async-signal-safe: only atomics, clock_gettime, write(2), and sigaction/raise for the second
// signal.
void on_stop_signal(int signal_number) {
    const int64_t now = monotonic_ns();
    int expected = 0;
    if (g_stop_signal.compare_exchange_strong(expected, signal_number)) {
        g_first_ns = now;
        static const char notice[] =
            "\nqknorm: stopping after this step, with a checkpoint (again to quit at once)\n";
        [[maybe_unused]] const ssize_t n = ::write(2, notice, sizeof notice - 1);
        return;
    }
    if (expected == signal_number &&
        static_cast<double>(now - g_first_ns.load()) < kDuplicateSeconds * 1e9)
        return;  // the same request delivered twice (timeout: to the program, then its group)
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
}

}  // namespace

StopSignals::StopSignals() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a signal must not fail a read or a write in progress
    ::sigaction(SIGINT, &action, &g_previous_int);
    ::sigaction(SIGTERM, &action, &g_previous_term);
}

StopSignals::~StopSignals() {
    ::sigaction(SIGINT, &g_previous_int, nullptr);
    ::sigaction(SIGTERM, &g_previous_term, nullptr);
}

bool StopSignals::requested() const { return g_stop_signal != 0; }
int StopSignals::signal_number() const { return g_stop_signal; }

RunDirLock::RunDirLock(const std::string& dir, const std::string& flag) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    QK_CHECK(fd_ >= 0, "{} {}: cannot open the directory: {}", flag, dir, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::close(fd_);
        throw Error(fmt::format(
            "{} {} is in use by another qknorm process{}; wait for it to end, or choose another "
            "directory",
            flag, dir, err == EWOULDBLOCK ? "" : fmt::format(" ({})", std::strerror(err))));
    }
}

RunDirLock::~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
}

}  // namespace qk::nn
