// Reading a run's metrics.jsonl back (resume, the run's plot, the sweep's tables) as hostile
// input, with the rules every other file gets: a regular file (a FIFO would block the reader,
// /dev/zero or /dev/urandom would never end), of bounded size, each line bounded in depth.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qk::nn {

// A metrics.jsonl of a 10^6-step run with a dozen layers' signals is ~1 GB.
inline constexpr uint64_t kMaxMetricsBytes = uint64_t{1} << 30;

struct MetricsRecord {
    int64_t line = 0;       // 1-based line number in the file
    std::string text;       // the line as written
    nlohmann::json record;  // a JSON object with a whole "step"
};

struct MetricsFile {
    std::vector<MetricsRecord> records;
    // Lines that are not a record: cut by a kill, edited, or nested past any record's depth.
    std::vector<int64_t> malformed_lines;
};

// The records of run_dir/metrics.jsonl in file order; none if the file does not exist. Throws
// qk::Error naming the file when it is not a regular file or is over kMaxMetricsBytes.
MetricsFile read_metrics(const std::string& run_dir);

}  // namespace qk::nn
