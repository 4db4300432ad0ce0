// What controls a training run from outside its loop: Ctrl-C and SIGTERM (stop after this step,
// with a checkpoint), and the lock that keeps two processes out of one run directory.
#pragma once

#include <string>

namespace qk::nn {

// While alive, SIGINT and SIGTERM ask the run to stop at the end of the current step instead of
// killing the process: requested() turns true, and a one-line notice says what happens. A second
// signal restores the default action and re-raises it: the process ends at once. The previous
// handlers come back when it is destroyed. The same signal again within kDuplicateSeconds is the
// same request, not a second one: GNU timeout sends SIGTERM to the program and then to its
// process group, so the program gets it twice at once (and lost its checkpoint to the rule).
inline constexpr double kDuplicateSeconds = 0.2;
class StopSignals {
  public:
    StopSignals();
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;

    bool requested() const;
    int signal_number() const;  // the signal that asked (0 if none)
};

// An exclusive lock on a run directory (flock on the directory itself: no lock file to leave
// behind, and the kernel drops it when the process dies). A second holder, in this process or
// another, is refused with an error naming the directory and the flag that chose it (`flag`,
// e.g. "train: --run-dir").
class RunDirLock {
  public:
    RunDirLock(const std::string& dir, const std::string& flag);
    ~RunDirLock();
    RunDirLock(const RunDirLock&) = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;

  private:
    int fd_ = -1;
};

}  // namespace qk::nn
