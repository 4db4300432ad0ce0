#include "nn/text/shards.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"

namespace qk::nn {

namespace fs = std::filesystem;

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       int token_bytes) {
    QK_CHECK(token_bytes == 2 || token_bytes == 4, "write_token_shard: token_bytes {} (2 or 4)",
             token_bytes);
    QK_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX),
             "write_token_shard: {} tokens do not fit the header's int32 count", tokens.size());
    std::string bytes(static_cast<size_t>(kShardHeaderBytes) + tokens.size() * token_bytes, '\0');
    const int32_t header[3] = {token_bytes == 2 ? kShardMagic16 : kShardMagic32,
                               token_bytes == 2 ? kShardVersion16 : kShardVersion32,
                               static_cast<int32_t>(tokens.size())};
    std::memcpy(bytes.data(), header, sizeof header);  // little-endian hosts only, as llm.c
    char* out = bytes.data() + kShardHeaderBytes;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (token_bytes == 2) {
            QK_CHECK(tokens[i] <= 0xffff, "write_token_shard: token {} does not fit uint16",
                     tokens[i]);
            const auto t = static_cast<uint16_t>(tokens[i]);
            std::memcpy(out + 2 * i, &t, 2);
        } else {
            std::memcpy(out + 4 * i, &tokens[i], 4);
        }
    }
    write_file_atomic(path, bytes);
}

namespace {

// One token file, mapped read-only.
class MappedTokens {
  public:
    MappedTokens(const std::string& path, int64_t vocab_size) : path_(path), vocab_(vocab_size) {
        const RegularFile file(path, "data");  // a regular file, checked as any user's file is
        bytes_ = file.size();
        if (bytes_ > 0) {
            void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, file.descriptor(), 0);
            QK_CHECK(p != MAP_FAILED, "data: cannot map '{}': {}", path, std::strerror(errno));
            base_ = static_cast<const unsigned char*>(p);
            ::madvise(p, bytes_, MADV_RANDOM);  // windows land anywhere: no read-ahead
        }
        try {
            read_layout();
            check_ids();
        } catch (...) {  // the destructor does not run for a constructor that throws
            if (base_) ::munmap(const_cast<unsigned char*>(base_), bytes_);
            throw;
        }
    }
    ~MappedTokens() {
        if (base_) ::munmap(const_cast<unsigned char*>(base_), bytes_);
    }
    MappedTokens(const MappedTokens&) = delete;
    MappedTokens& operator=(const MappedTokens&) = delete;

    int64_t size() const { return count_; }
    const std::string& path() const { return path_; }
    void read(int64_t start, int64_t n, int32_t* out) const {
        const unsigned char* p = base_ + data_offset_ + start * token_bytes_;
        for (int64_t i = 0; i < n; ++i) {
            uint32_t id = 0;
            std::memcpy(&id, p + i * token_bytes_, static_cast<size_t>(token_bytes_));
            QK_CHECK(static_cast<int64_t>(id) < vocab_,
                     "data: token {} at position {} of '{}' is outside the tokenizer's "
                     "vocabulary of {} ids (a shard made with another tokenizer?)",
                     id, start + i, path_, vocab_);
            out[i] = static_cast<int32_t>(id);
        }
    }

  private:
    // Every id below the vocabulary's size, checked once when the file is opened: an id past it
    // found only when a window happened to read it stopped a run at step 28, without a checkpoint.
    // One sequential pass (read-ahead on for it), the largest id first and its position only when
    // it is too large; uint16 files under a vocabulary of 65,536 or more need none.
    void check_ids() const {
        if (token_bytes_ == 2 && vocab_ >= 65536) return;
        ::madvise(const_cast<unsigned char*>(base_), bytes_, MADV_SEQUENTIAL);
        const unsigned char* data = base_ + data_offset_;
        uint32_t largest = 0;
        for (int64_t i = 0; i < count_; ++i) {
            uint32_t id = 0;
            std::memcpy(&id, data + i * token_bytes_, static_cast<size_t>(token_bytes_));
            largest = std::max(largest, id);
        }
        ::madvise(const_cast<unsigned char*>(base_), bytes_, MADV_RANDOM);
        if (static_cast<int64_t>(largest) < vocab_) return;
        std::vector<int32_t> one(1);
        for (int64_t i = 0; i < count_; ++i) read(i, 1, one.data());  // throws, naming where
    }

    void read_layout() {
        const std::string name = fs::path(path_).filename().string();
        int32_t header[3] = {0, 0, 0};
        if (bytes_ >= sizeof header) std::memcpy(header, base_, sizeof header);
        const bool llmc = header[0] == kShardMagic16 || header[0] == kShardMagic32;
        if (!llmc) {
            QK_CHECK(name == "train.bin" || name == "val.bin",
                     "data: '{}' does not start with an llm.c shard's magic ({} or {}; it has {}), "
                     "and only nanoGPT's train.bin and val.bin are read without one",
                     path_, kShardMagic16, kShardMagic32, bytes_ >= 4 ? header[0] : -1);
            QK_CHECK(bytes_ % 2 == 0, "data: '{}' holds {} bytes, not a whole number of uint16",
                     path_, bytes_);
            token_bytes_ = 2, data_offset_ = 0, count_ = static_cast<int64_t>(bytes_ / 2);
        } else {
            QK_CHECK(bytes_ >= static_cast<uint64_t>(kShardHeaderBytes),
                     "data: '{}' is {} bytes, shorter than llm.c's {}-byte header (truncated)",
                     path_, bytes_, kShardHeaderBytes);
            const bool u16 = header[0] == kShardMagic16;
            const int32_t version = u16 ? kShardVersion16 : kShardVersion32;
            QK_CHECK(header[1] == version,
                     "data: '{}' has magic {} with version {}; llm.c pairs it with version {}",
                     path_, header[0], header[1], version);
            token_bytes_ = u16 ? 2 : 4, data_offset_ = kShardHeaderBytes, count_ = header[2];
            const uint64_t data_bytes = bytes_ - static_cast<uint64_t>(kShardHeaderBytes);
            QK_CHECK(count_ >= 0 &&
                         static_cast<uint64_t>(count_) * static_cast<uint64_t>(token_bytes_) ==
                             data_bytes,
                     "data: '{}' says it holds {} tokens of {} bytes, but {} bytes follow its "
                     "header{}",
                     path_, header[2], token_bytes_, data_bytes,
                     count_ * token_bytes_ > static_cast<int64_t>(data_bytes)
                         ? " (the count runs past the end of the file: truncated?)"
                         : "");
        }
        QK_CHECK(count_ > 0, "data: '{}' holds no tokens", path_);
    }

    std::string path_;
    int64_t vocab_;
    const unsigned char* base_ = nullptr;
    uint64_t bytes_ = 0;
    int64_t data_offset_ = 0, count_ = 0;
    int token_bytes_ = 2;
};

class MappedSequence final : public TokenSequence {
  public:
    MappedSequence(const std::vector<std::string>& paths, int64_t vocab_size) {
        QK_CHECK(!paths.empty(), "data: no token files");
        for (const std::string& p : paths) {
            files_.push_back(std::make_unique<MappedTokens>(p, vocab_size));
            starts_.push_back(total_);
            total_ += files_.back()->size();
        }
    }
    int64_t size() const override { return total_; }
    void read(int64_t start, int64_t n, int32_t* out) const override {
        QK_CHECK(start >= 0 && n >= 0 && start + n <= total_,
                 "data: tokens [{}, {}) are past the {} there are", start, start + n, total_);
        while (n > 0) {  // a window may run from one file into the next
            const size_t f = file_at(start);
            const int64_t local = start - starts_[f];
            const int64_t take = std::min(n, files_[f]->size() - local);
            files_[f]->read(local, take, out);
            start += take, out += take, n -= take;
        }
    }
    std::string where(int64_t position) const override {
        const size_t f = file_at(position);
        return fmt::format("{}, token {}", files_[f]->path(), position - starts_[f]);
    }

  private:
    size_t file_at(int64_t position) const {
        return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), position) -
                                   starts_.begin() - 1);
    }
    std::vector<std::unique_ptr<MappedTokens>> files_;
    std::vector<int64_t> starts_;
    int64_t total_ = 0;
};

class MemorySequence final : public TokenSequence {
  public:
    explicit MemorySequence(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
    int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
    void read(int64_t start, int64_t n, int32_t* out) const override {
        std::copy_n(tokens_.begin() + start, n, out);
    }
    std::string where(int64_t position) const override { return fmt::format("token {}", position); }

  private:
    std::vector<int32_t> tokens_;
};

}  // namespace

std::shared_ptr<const TokenSequence> tokens_in_memory(std::vector<int32_t> tokens) {
    return std::make_shared<MemorySequence>(std::move(tokens));
}

std::shared_ptr<const TokenSequence> map_token_files(const std::vector<std::string>& paths,
                                                     int64_t vocab_size) {
    return std::make_shared<MappedSequence>(paths, vocab_size);
}

TokenFiles find_token_files(const std::string& dir) {
    QK_CHECK(fs::is_directory(dir), "data: '{}' is not a directory of token files", dir);
    TokenFiles files;
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        if (entry.path().extension() != ".bin") continue;
        if (name.find("val") != std::string::npos)
            files.val.push_back(entry.path().string());
        else if (name.find("train") != std::string::npos)
            files.train.push_back(entry.path().string());
    }
    std::sort(files.train.begin(), files.train.end());
    std::sort(files.val.begin(), files.val.end());
    QK_CHECK(!files.train.empty() && !files.val.empty(),
             "data: '{}' has {} train and {} val token files (*train*.bin, *val*.bin); it needs "
             "both (qknorm prepare writes them)",
             dir, files.train.size(), files.val.size());
    return files;
}

}  // namespace qk::nn
