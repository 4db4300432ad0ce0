#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <tuple>

#include "core/file_io.h"

namespace qk {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 deep (header -> tensor entry -> shape array) and has about 6 + rank
// elements per tensor; the bounds leave room for both yet keep nlohmann::json, which builds a
// node per level and per element, from spending seconds and gigabytes on a hostile header.
constexpr int64_t kMaxHeaderDepth = 8;
constexpr uint64_t kMaxHeaderElements = 1'000'000;

const char* dtype_code(DType d) {
    switch (d) {
        case DType::f32:
            return "F32";
        case DType::f64:
            return "F64";
        case DType::i32:
            return "I32";
        case DType::bf16:
            return "BF16";
        case DType::f16:
            return "F16";
    }
    return "?";
}

DType parse_dtype(const std::string& code, const std::string& name, const std::string& origin) {
    if (code == "F32") return kF32;
    if (code == "F64") return kF64;
    if (code == "I32") return kI32;
    if (code == "BF16") return kBF16;
    if (code == "F16") return kF16;
    throw Error(fmt::format(
        "safetensors {}: tensor '{}' has dtype '{}'; supported: F32, F64, I32, BF16, F16", origin,
        name, code));
}

Tensor tensor_from_bytes(const char* data, uint64_t nbytes, const Shape& shape, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype);
    if (nbytes) std::memcpy(t.raw_data(), data, nbytes);  // little-endian, as the host
    return t;
}

void put_u64_le(std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const std::string& bytes) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
    return v;
}

// Product of the shape times the element size, or throws if it overflows or a size is negative.
// The product of the non-zero sizes must fit in int64 too: an empty tensor of shape
// (0, 2^62, 2^62) has no bytes, but its row-major strides would overflow.
uint64_t checked_nbytes(const nlohmann::json& shape, uint64_t element_size, const std::string& name,
                        const std::string& origin, Shape& out_shape) {
    QK_CHECK(shape.is_array(), "safetensors {}: tensor '{}': shape must be an array", origin, name);
    constexpr uint64_t kMax = static_cast<uint64_t>(INT64_MAX);
    uint64_t extent = element_size;
    bool empty = false;
    for (const auto& s : shape) {
        QK_CHECK(s.is_number_unsigned(),
                 "safetensors {}: tensor '{}': shape entries must be "
                 "non-negative integers, got {}",
                 origin, name, s.dump());
        const uint64_t size = s.get<uint64_t>();
        QK_CHECK(size == 0 || extent <= kMax / size,
                 "safetensors {}: tensor '{}': shape {} overflows", origin, name, shape.dump());
        extent *= std::max<uint64_t>(size, 1);
        empty = empty || size == 0;
        out_shape.push_back(static_cast<int64_t>(size));
    }
    return empty ? 0 : extent;
}

void check_header_length(uint64_t header_len, uint64_t file_size, const std::string& origin) {
    QK_CHECK(header_len <= kMaxHeaderBytes,
             "safetensors {}: header length {} exceeds the {} byte cap", origin, header_len,
             kMaxHeaderBytes);
    QK_CHECK(header_len <= file_size - 8,
             "safetensors {}: header length {} runs past the end of "
             "the {} byte file (truncated?)",
             origin, header_len, file_size);
}

void check_header_extent(std::string_view json, const std::string& origin) {
    const JsonExtent extent = measure_json(json);
    QK_CHECK(extent.max_depth <= kMaxHeaderDepth,
             "safetensors {}: header nests JSON {} levels deep; at most {} allowed (a valid "
             "header nests 3)",
             origin, extent.max_depth, kMaxHeaderDepth);
    QK_CHECK(extent.elements <= kMaxHeaderElements,
             "safetensors {}: header has {} JSON elements (arrays, objects, commas); at most {} "
             "allowed",
             origin, extent.elements, kMaxHeaderElements);
}

std::map<std::string, std::string> metadata_of(const nlohmann::json& entry,
                                               const std::string& origin) {
    QK_CHECK(entry.is_object(), "safetensors {}: __metadata__ must be an object", origin);
    std::map<std::string, std::string> metadata;
    for (const auto& [k, v] : entry.items()) {
        QK_CHECK(v.is_string(), "safetensors {}: __metadata__ value of '{}' must be a string",
                 origin, k);
        metadata[k] = v.get<std::string>();
    }
    return metadata;
}

}  // namespace

const Tensor& SafetensorsFile::get(const std::string& name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return t;
    throw Error(fmt::format("safetensors: tensor '{}' is missing from the file", name));
}

bool SafetensorsFile::contains(const std::string& name) const {
    return std::any_of(tensors.begin(), tensors.end(),
                       [&](const auto& p) { return p.first == name; });
}

std::string temporary_path(const std::string& path) {
    return path + ".tmp." + std::to_string(::getpid());
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
    const std::string tmp = temporary_path(path);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0, "write {}: cannot create {}: {}", path, tmp, std::strerror(errno));
    size_t written = 0;
    while (written < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
        if (n < 0) {
            const std::string err = std::strerror(errno);
            ::close(fd);
            ::unlink(tmp.c_str());
            throw Error(
                fmt::format("write {}: {} after {} of {} bytes", path, err, written, bytes.size()));
        }
        written += static_cast<size_t>(n);
    }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw Error(
            fmt::format("write {}: could not flush and rename the temporary file: {}", path, err));
    }
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::string data;
    for (const auto& [name, t] : tensors) {
        QK_CHECK(name != "__metadata__" && !header.contains(name),
                 "save_safetensors {}: tensor name '{}' is reserved or repeated", path, name);
        const Tensor c = t.detach().to(Device::cpu).contiguous();  // a device tensor comes back
        const size_t begin = data.size();
        data.append(static_cast<const char*>(c.raw_data()), c.numel() * dtype_size(c.dtype()));
        header[name] = {{"dtype", dtype_code(c.dtype())},
                        {"shape", c.shape()},
                        {"data_offsets", {begin, data.size()}}};
    }
    std::string json = header.dump();
    json.append((8 - json.size() % 8) % 8, ' ');  // pad so the data buffer starts 8-aligned
    std::string bytes;
    bytes.reserve(8 + json.size() + data.size());
    put_u64_le(bytes, json.size());
    bytes += json;
    bytes += data;
    write_file_atomic(path, bytes);
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin) {
    QK_CHECK(bytes.size() >= 8,
             "safetensors {}: file is {} bytes, too short for the 8-byte header "
             "length",
             origin, bytes.size());
    const uint64_t header_len = get_u64_le(bytes);
    check_header_length(header_len, bytes.size(), origin);
    check_header_extent(std::string_view(bytes).substr(8, header_len), origin);
    nlohmann::json header;
    std::set<std::string> names;
    bool duplicate = false;
    std::string duplicate_name;
    // JSON objects keep the last of repeated keys; safetensors forbids them, so watch the parse.
    auto watch_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
            !names.insert(parsed.get<std::string>()).second) {
            duplicate = true;
            duplicate_name = parsed.get<std::string>();
        }
        return true;
    };
    try {
        header = nlohmann::json::parse(
            bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len), watch_keys);
    } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("safetensors {}: header is not valid JSON: {}", origin,
                                json_error_text(e)));
    }
    QK_CHECK(header.is_object(), "safetensors {}: header must be a JSON object", origin);
    QK_CHECK(!duplicate, "safetensors {}: tensor name '{}' appears twice", origin, duplicate_name);
    const uint64_t data_begin = 8 + header_len, data_size = bytes.size() - data_begin;

    SafetensorsFile file;
    // (begin, end, index into file.tensors): the JSON object iterates its keys sorted by name,
    // so the tensors are put back in the order of their data, the order they were written in.
    std::vector<std::tuple<uint64_t, uint64_t, size_t>> ranges;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            file.metadata = metadata_of(entry, origin);
            continue;
        }
        QK_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                     entry.contains("data_offsets") && entry["dtype"].is_string(),
                 "safetensors {}: tensor '{}' needs dtype, shape and data_offsets", origin, name);
        const DType stored = parse_dtype(entry["dtype"].get<std::string>(), name, origin);
        Shape shape;
        const uint64_t nbytes =
            checked_nbytes(entry["shape"], dtype_size(stored), name, origin, shape);
        const auto& offsets = entry["data_offsets"];
        QK_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                     offsets[1].is_number_unsigned(),
                 "safetensors {}: tensor '{}': data_offsets must be two non-negative integers",
                 origin, name);
        const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
        QK_CHECK(begin <= end && end <= data_size,
                 "safetensors {}: tensor '{}': range [{}, {}) is outside "
                 "the {} byte data buffer",
                 origin, name, begin, end, data_size);
        QK_CHECK(end - begin == nbytes,
                 "safetensors {}: tensor '{}': range holds {} bytes, but {} {} "
                 "needs {}",
                 origin, name, end - begin, dtype_name(stored), shape, nbytes);
        Tensor t = tensor_from_bytes(bytes.data() + data_begin + begin, nbytes, shape, stored);
        ranges.emplace_back(begin, end, file.tensors.size());
        file.tensors.emplace_back(name, t);
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t covered = 0;
    std::vector<std::pair<std::string, Tensor>> in_order;
    for (const auto& [begin, end, index] : ranges) {
        QK_CHECK(begin == covered, "safetensors {}: data ranges overlap or leave a gap at byte {}",
                 origin, std::min(begin, covered));
        covered = end;
        in_order.push_back(std::move(file.tensors[index]));
    }
    QK_CHECK(covered == data_size, "safetensors {}: tensors cover {} of the {} data bytes", origin,
             covered, data_size);
    file.tensors = std::move(in_order);
    return file;
}

SafetensorsFile load_safetensors(const std::string& path) {
    const RegularFile file(path, "safetensors");
    // The header length against the real size before the whole file is read: a corrupt length
    // fails at once, however large the file.
    if (file.size() >= 8) check_header_length(get_u64_le(file.read(0, 8)), file.size(), path);
    return parse_safetensors(file.read(0, file.size()), path);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
    const RegularFile file(path, "safetensors");
    QK_CHECK(file.size() >= 8,
             "safetensors {}: file is {} bytes, too short for the 8-byte header "
             "length",
             path, file.size());
    const uint64_t header_len = get_u64_le(file.read(0, 8));
    check_header_length(header_len, file.size(), path);
    const std::string text = file.read(8, header_len);
    check_header_extent(text, path);
    const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    QK_CHECK(header.is_object(), "safetensors {}: header must be a JSON object", path);
    return header.contains("__metadata__") ? metadata_of(header["__metadata__"], path)
                                           : std::map<std::string, std::string>{};
}

}  // namespace qk
