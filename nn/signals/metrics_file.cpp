#include "nn/signals/metrics_file.h"

#include <filesystem>
#include <string_view>

#include "core/file_io.h"

namespace qk::nn {

namespace {

// A record is {"step": .., "layers": [{..}, ..]}: three levels; anything much deeper is not one,
// and measuring first keeps a hostile line from costing the parser a node per bracket.
constexpr int64_t kMaxRecordDepth = 8;

}  // namespace

MetricsFile read_metrics(const std::string& run_dir) {
    MetricsFile file;
    const std::string path = run_dir + "/metrics.jsonl";
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return file;
    const std::string text = read_regular_file(path, "metrics", kMaxMetricsBytes);
    int64_t number = 0;
    for (size_t begin = 0; begin < text.size();) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string_view line(text.data() + begin, end - begin);
        begin = end + 1, ++number;
        if (line.empty()) continue;
        nlohmann::json j;
        if (measure_json(line).max_depth <= kMaxRecordDepth)
            j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
            file.records.push_back({number, std::string(line), std::move(j)});
        else
            file.malformed_lines.push_back(number);
    }
    return file;
}

}  // namespace qk::nn
