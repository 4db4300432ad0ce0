// error_in_child: runs a call that might block or eat memory in a forked child with a deadline,
// so that a test of "refuses a FIFO / /dev/zero" fails on a regression instead of hanging CI.
#pragma once

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

#include "core/error.h"

namespace qk::test {

namespace detail {

inline void run_child(const std::function<void()>& f, int fd, unsigned seconds) {
    ::alarm(seconds);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
    // Reading /dev/zero into memory must hit this, not the machine's memory; sanitizers reserve
    // terabytes of address space, so only the plain build sets it.
    const rlimit cap{rlim_t{2} << 30, rlim_t{2} << 30};
    ::setrlimit(RLIMIT_AS, &cap);
#endif
    std::string out = "(no error)";
    try {
        f();
    } catch (const qk::Error& e) {
        out = e.what();
    } catch (const std::exception& e) {
        out = std::string("(not a qk::Error) ") + e.what();
    }
    [[maybe_unused]] const ssize_t n = ::write(fd, out.data(), out.size());
    ::_exit(0);  // no atexit handlers, no doctest teardown: the parent owns those
}

}  // namespace detail

// The qk::Error message of f, "(no error)", or why the child did not finish within `seconds`.
inline std::string error_in_child(const std::function<void()>& f, unsigned seconds = 10) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fds[0]);
        detail::run_child(f, fds[1], seconds);
    }
    ::close(fds[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        return "(child killed by signal " + std::to_string(WTERMSIG(status)) + ": " +
               ::strsignal(WTERMSIG(status)) + ")";
    return out;
}

}  // namespace qk::test
