// Reading files named by a user (checkpoints, data, configs) as hostile input: regular files
// only, so that a FIFO cannot block the reader and /dev/zero cannot fill memory.
//
// A path is stat'ed before it is opened (a device is never opened), opened with O_NONBLOCK (a
// FIFO swapped in meanwhile cannot block the open) and fstat'ed again, then read up to the size
// fstat gave. Each error is a qk::Error that names `what` (the op or role), the path and what it
// is, e.g. "data: 'x/' is a directory, not a regular file". measure_json bounds what a JSON text
// read that way would cost to parse.
#pragma once

#include <exception>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace qk {

inline constexpr uint64_t kNoSizeLimit = std::numeric_limits<uint64_t>::max();

// An open regular file. Reads are positioned (pread), so `read` can be called in any order.
class RegularFile {
  public:
    RegularFile(const std::string& path, const std::string& what);  // throws if not regular
    ~RegularFile();
    RegularFile(const RegularFile&) = delete;
    RegularFile& operator=(const RegularFile&) = delete;

    uint64_t size() const { return size_; }
    int descriptor() const { return fd_; }  // e.g. to mmap it
    // Exactly n bytes from offset, or throws (a file that shrank since it was opened).
    std::string read(uint64_t offset, uint64_t n) const;

  private:
    int fd_ = -1;
    uint64_t size_ = 0;
    std::string path_, what_;
};

// The whole of a regular file of at most max_bytes bytes.
std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes = kNoSizeLimit);

// How deep a JSON text nests and how many elements it has, by one linear pass that skips strings
// (and the escapes in them). nlohmann::json builds a node per level and per element, so hostile
// JSON is measured with this before it is parsed (20 MB of '[' took the parser 14 s and 1.5 GB).
struct JsonExtent {
    int64_t max_depth = 0;  // arrays and objects inside each other; brackets that do not match
                            // are left for the parser to report
    uint64_t elements = 0;  // arrays, objects and commas: a bound on the values they hold
};
JsonExtent measure_json(std::string_view json);

// Throws qk::Error naming `what` unless json nests at most max_depth deep, has at most
// max_elements elements and holds no NUL byte (the parser would stop there and take the text
// before it for the whole file). Call it before parsing text a user or a download supplied.
void check_json_extent(std::string_view json, const std::string& what, int64_t max_depth,
                       uint64_t max_elements);

// The JSON library's message without its error code: "[json.exception.parse_error.101] parse
// error at line 1, ..." -> "parse error at line 1, ...". For messages a user reads.
std::string json_error_text(const std::exception& e);

// "a directory", "a FIFO", "a character device", ... for an st_mode; used in messages.
const char* file_kind(unsigned mode);

}  // namespace qk
