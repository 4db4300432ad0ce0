// safetensors I/O: the format of Hugging Face's safetensors, read and written by hand.
//
// File layout: 8-byte little-endian header length N; N bytes of JSON, an object mapping each
// tensor name to {"dtype": "F32"|"F64"|"I32"|"BF16", "shape": [...], "data_offsets": [begin, end]}
// (offsets relative to the data buffer), plus an optional "__metadata__" object of strings;
// then the data buffer, raw little-endian values, row-major. "F16" is read too, widened to
// float32 (exactly), for Hugging Face checkpoints stored in float16.
//
// Reading treats the file as hostile input and makes the reference implementation's checks:
// the header length against the file size and a 100 MB cap, a JSON object, names unique, each
// range inside the buffer with length = dtype size × product of the shape (overflow-checked),
// ranges disjoint and together covering the buffer exactly. Before the JSON parser sees the
// header, a linear scan bounds its nesting (8 levels) and its elements (1,000,000), and only a
// regular file is read (core/file_io.h): a FIFO, a device or a directory is refused unopened.
// Writing is atomic: a temporary file in the same directory, flushed, then renamed over the
// target, so a crash never leaves a half-written checkpoint under the real name.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace qk {

struct SafetensorsFile {
    std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
    std::map<std::string, std::string> metadata;

    const Tensor& get(const std::string& name) const;  // throws naming the missing tensor
    bool contains(const std::string& name) const;
};

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
SafetensorsFile load_safetensors(const std::string& path);
// The __metadata__ of a file, reading its header only (the same checks on it as load_safetensors).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);
// The same checks on the bytes of a file; origin names them in errors (tests, fuzzing).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin);

// Writes `bytes` to path atomically (temporary file + fsync + rename).
void write_file_atomic(const std::string& path, const std::string& bytes);
// The temporary file write_file_atomic writes first: path + ".tmp." + this process's id. A kill
// between the write and the rename leaves it behind under exactly that name.
std::string temporary_path(const std::string& path);

}  // namespace qk
