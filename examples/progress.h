// A progress bar on stderr for the qknorm program's long commands (tokenizing, preparing shards,
// sampling several texts): redrawn in place on a terminal, a line every 5 % into a file.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace qk::cli {

// A progress bar on stderr: redrawn in place on a terminal, a line every 5 % into a file.
class Progress {
  public:
    Progress(std::string what, bool quiet) : what_(std::move(what)), quiet_(quiet) {}
    void operator()(int64_t done, int64_t total, const char* unit) {
        if (quiet_ || total <= 0) return;
        const int percent = static_cast<int>(100 * done / total);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        const bool terminal = ::isatty(2) == 1;
        if (!terminal && percent / 5 == last_ / 5 && done < total) return;
        if (percent == last_ && done < total) return;
        last_ = percent;
        const int filled = percent * 24 / 100;
        const std::string rate = std::string(unit) == "MB"
                                     ? fmt::format("{:.1f} MB/s", static_cast<double>(done) / 1e6 /
                                                                      std::max(seconds, 1e-9))
                                     : fmt::format("{}/{}", done, total);
        fmt::print(stderr, "{}[{}{}] {:3d}% {} {}{}", terminal ? "\r" : "",
                   std::string(filled, '#'), std::string(24 - filled, '.'), percent, what_, rate,
                   terminal ? "   " : "\n");
        if (terminal && done >= total) fmt::print(stderr, "\n");
    }

  private:
    std::string what_;
    bool quiet_;
    int last_ = -1;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace qk::cli
