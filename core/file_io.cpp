// Regular-file reading for user-named paths (see core/file_io.h).
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace qk {

const char* file_kind(unsigned mode) {
    switch (mode & S_IFMT) {
        case S_IFREG:
            return "a regular file";
        case S_IFDIR:
            return "a directory";
        case S_IFIFO:
            return "a FIFO";
        case S_IFCHR:
            return "a character device";
        case S_IFBLK:
            return "a block device";
        case S_IFSOCK:
            return "a socket";
        case S_IFLNK:
            return "a symbolic link";
        default:
            return "not a file";
    }
}

namespace {

void check_regular(const struct stat& st, const std::string& path, const std::string& what) {
    QK_CHECK(S_ISREG(st.st_mode), "{}: '{}' is {}, not a regular file", what, path,
             file_kind(st.st_mode));
}

}  // namespace

RegularFile::RegularFile(const std::string& path, const std::string& what)
    : path_(path), what_(what) {
    // stat first: opening a device can have side effects (a tape rewinds, a tty becomes ours).
    struct stat st {};
    QK_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot open '{}': {}", what, path,
             std::strerror(errno));
    check_regular(st, path, what);
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    QK_CHECK(fd_ >= 0, "{}: cannot open '{}': {}", what, path, std::strerror(errno));
    // fstat again: the path may have been replaced between stat and open.
    const bool stat_ok = ::fstat(fd_, &st) == 0;
    const int err = errno;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        ::close(fd_);
        QK_CHECK(stat_ok, "{}: cannot stat '{}': {}", what, path, std::strerror(err));
        check_regular(st, path, what);
    }
    size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

std::string RegularFile::read(uint64_t offset, uint64_t n) const {
    QK_CHECK(offset <= size_ && n <= size_ - offset,
             "{}: '{}': bytes [{}, {}) are past the end of the {} byte file", what_, path_, offset,
             offset + n, size_);
    std::string out;
    try {
        out.resize(n);
    } catch (const std::exception&) {  // bad_alloc, or length_error past max_size()
        throw Error(fmt::format("{}: '{}': out of memory reading {} bytes", what_, path_, n));
    }
    for (uint64_t done = 0; done < n;) {
        const ssize_t got = ::pread(fd_, out.data() + done, n - done, off_t(offset + done));
        if (got < 0 && errno == EINTR) continue;
        QK_CHECK(got >= 0, "{}: cannot read '{}': {}", what_, path_, std::strerror(errno));
        QK_CHECK(got > 0, "{}: '{}' shrank to {} bytes while being read (expected {})", what_,
                 path_, offset + done, size_);
        done += static_cast<uint64_t>(got);
    }
    return out;
}

JsonExtent measure_json(std::string_view json) {
    JsonExtent extent;
    int64_t depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < json.size(); ++i) {
        const char c = json[i];
        if (in_string) {
            if (c == '\\') ++i;
            in_string = c != '"';
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            extent.max_depth = std::max(extent.max_depth, ++depth);
            ++extent.elements;
        } else if (c == ']' || c == '}') {
            --depth;
        } else if (c == ',') {
            ++extent.elements;
        }
    }
    return extent;
}

std::string json_error_text(const std::exception& e) {
    std::string text = e.what();
    if (text.rfind("[json.exception.", 0) == 0) {
        const size_t end = text.find("] ");
        if (end != std::string::npos) text.erase(0, end + 2);
    }
    return text;
}

void check_json_extent(std::string_view json, const std::string& what, int64_t max_depth,
                       uint64_t max_elements) {
    const size_t nul = json.find('\0');
    QK_CHECK(nul == std::string_view::npos,
             "{}: a NUL byte at offset {} (JSON text holds none; is this the right file?)", what,
             nul);
    const JsonExtent extent = measure_json(json);
    QK_CHECK(extent.max_depth <= max_depth && extent.elements <= max_elements,
             "{}: JSON nested {} deep with {} elements, past what this file holds (at most {} "
             "deep, {} elements)",
             what, extent.max_depth, extent.elements, max_depth, max_elements);
}

std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes) {
    RegularFile file(path, what);
    QK_CHECK(file.size() <= max_bytes, "{}: '{}' is {} bytes, more than the {} byte limit", what,
             path, file.size(), max_bytes);
    return file.read(0, file.size());
}

}  // namespace qk
