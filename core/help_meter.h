// The thread pool's judge of whether its workers help (core/threading.cpp uses it; tests drive it
// with a clock of their own).
#pragma once

#include <algorithm>
#include <chrono>

namespace qk {

// True when the tasks the system can run at this moment (the 4th field of /proc/loadavg,
// "runnable/total", counting the calling thread) leave `workers` of this process's cores free.
// False when unknown (no /proc, or a container that sees the host's count).
bool idle_cores_for(int workers);

// Whether waking the workers pays. On idle cores each of n threads claims about 1/n of a job's
// tasks. When another program holds the cores, the workers get few of them: beside one busy
// process on 2 cores the calling thread ran 83 % of the tasks, and a step of the default model
// took 1.4x as long as with one thread, the waking, spinning and waiting costing more than the
// help (bench_busy). So the meter compares, over each window of kWindowJobs jobs, the tasks the
// workers ran with their fair share ((n-1)/n of each job's tasks), and after two windows under
// kMinShare of it (one alone can be a page fault or a thread starting), the caller runs the jobs
// alone for a rest spell, the workers asleep, then measures again: a first window still under
// it doubles the spell (up to kLongestRest), so that a neighbour that stays costs one window per
// few seconds. Every kLookEvery of a spell, a look at what the system is running ends it early
// when cores are free again. The results do not change: a job's tasks, and the order its sums are
// added in, are the same whoever runs them.
class HelpMeter {
  public:
    using Clock = std::chrono::steady_clock;
    // cores_free(workers): whether the system has `workers` cores to spare right now.
    explicit HelpMeter(bool (*cores_free)(int workers) = idle_cores_for)
        : cores_free_(cores_free) {}

    bool workers_resting(Clock::time_point now, int threads) {
        if (now >= rest_until_) return false;
        if (now >= next_look_) {  // the neighbour may have gone: then stop resting now
            next_look_ = now + kLookEvery;
            if (cores_free_(threads - 1)) rest_until_ = now;
        }
        return now < rest_until_;
    }
    void record(int tasks, int by_caller, int threads, Clock::time_point now) {
        const int sharing = std::min(threads, tasks);
        fair_ += tasks * double(sharing - 1) / sharing;
        helped_ += tasks - by_caller;
        if (++jobs_ < kWindowJobs) return;
        const bool low = helped_ < kMinShare * fair_;
        jobs_ = 0;
        fair_ = helped_ = 0;
        if (!low) {
            low_windows_ = 0;
            rest_ = kFirstRest;
            after_rest_ = false;
            return;
        }
        if (after_rest_)
            rest_ = std::min(2 * rest_, kLongestRest);  // the neighbour is still there
        else if (++low_windows_ < 2)
            return;
        rest_until_ = now + rest_;
        low_windows_ = 0;
        after_rest_ = true;
    }

    static constexpr int kWindowJobs = 32;  // a few ms of a training step
    static constexpr double kMinShare = 0.5;
    static constexpr std::chrono::milliseconds kFirstRest{500}, kLongestRest{4000};
    static constexpr std::chrono::milliseconds kLookEvery{100};

  private:
    bool (*cores_free_)(int);
    Clock::time_point next_look_{};
    int jobs_ = 0, low_windows_ = 0;
    bool after_rest_ = false;       // the window being measured is the first after a rest
    double fair_ = 0, helped_ = 0;  // tasks, over the current window
    std::chrono::milliseconds rest_ = kFirstRest;
    Clock::time_point rest_until_{};
};

}  // namespace qk
