// Reading files named by a user (checkpoints, data, configs) as hostile input: regular files
// only, so that a FIFO cannot block the reader and /dev/zero cannot fill memory.
//
// A path is stat'ed before it is opened (a device is never opened), opened with O_NONBLOCK (a
// FIFO swapped in meanwhile cannot block the open) and fstat'ed again, then read up to the size
// fstat gave. Each error is a qk::Error that names `what` (the op or role), the path and what it
// is, e.g. "data: 'x/' is a directory, not a regular file".
#pragma once

#include <cstdint>
#include <limits>
#include <string>

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

// "a directory", "a FIFO", "a character device", ... for an st_mode; used in messages.
const char* file_kind(unsigned mode);

}  // namespace qk
