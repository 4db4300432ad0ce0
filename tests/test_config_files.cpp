// Config and data files as hostile input: TOML settings files as toml++ reads them and qknorm
// accepts them (nn/lab/config_file.h: sections one level deep, plain values or arrays of one kind,
// every setting with its file:line:column), and read_text_file, which reads only a regular,
// non-empty file and names the path in every refusal.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "error_in_child.h"
#include "helpers.h"
#include "nn/lab/config_file.h"
#include "nn/text/data.h"

using namespace qk;
using namespace qk::nn;
using qk::test::error_in_child;
using qk::test::read_file;
using qk::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string toml_error(const std::string& text) {
    return qk::test::error_message([&] { parse_config_toml(text, "sweep.toml"); });
}

}  // namespace

// Parses every .toml file of dir (a committed folder): each has settings, all in [section].
// Returns how many files it read.
static int check_committed_configs(const std::string& dir, const std::string& section) {
    int seen = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".toml") continue;
        CAPTURE(e.path());
        const std::vector<ConfigSetting> settings =
            parse_config_toml(read_file(e.path().string()), e.path().string());
        CHECK(!settings.empty());
        for (const ConfigSetting& s : settings) CHECK(s.section == section);
        ++seen;
    }
    return seen;
}

TEST_CASE("every committed stability config parses, every setting in its [sweep] section") {
    CHECK(check_committed_configs(QK_SOURCE_DIR "/examples/stability", "sweep") >= 3);
}

TEST_CASE("every committed preset parses, every setting in its [train] section") {
    // Nothing but presets there (test_cli checks that the program knows each by name).
    CHECK(check_committed_configs(QK_SOURCE_DIR "/examples/presets", "train") ==
          std::distance(fs::directory_iterator(QK_SOURCE_DIR "/examples/presets"),
                        fs::directory_iterator{}));
}

TEST_CASE("TOML settings: kinds, arrays, sections and where each was written") {
    const char* text = R"(# a comment
top = 1

[sweep]
variants = ["baseline", 'lp:p=1', "tab\there"]  # trailing comment
lrs = [1e-3, 3E+2, -0.5, 7,
       2.5,  # a comment inside an array
]
flag = false
"quoted key" = 'x'
[train]
steps = 1_000
lr = 1e-3
)";
    const std::vector<ConfigSetting> s = parse_config_toml(text, "sweep.toml");
    REQUIRE(s.size() == 7);
    CHECK((s[0].section == "" && s[0].key == "top" && s[0].kind == ConfigSetting::Kind::integer));
    CHECK(s[0].where == "sweep.toml:2:1");
    CHECK((s[1].key == "variants" && s[1].array && s[1].kind == ConfigSetting::Kind::string));
    CHECK(s[1].values == std::vector<std::string>{"baseline", "lp:p=1", "tab\there"});
    CHECK(s[1].where == "sweep.toml:5:1");
    // Integers among floats make a number array; every value reads back exactly.
    CHECK((s[2].array && s[2].kind == ConfigSetting::Kind::floating));
    CHECK(s[2].values == std::vector<std::string>{"0.001", "300", "-0.5", "7", "2.5"});
    CHECK((s[3].kind == ConfigSetting::Kind::boolean && s[3].values[0] == "false"));
    CHECK((s[4].key == "quoted key" && s[4].values[0] == "x"));
    CHECK((s[5].section == "train" && s[5].values[0] == "1000"));
    CHECK(s[6].values[0] == "0.001");
    CHECK(describe(s[2]) == "a number array");
    CHECK(parse_config_toml("", "x").empty());
    CHECK(parse_config_toml("a = 1\r\n[s]\r\nb = [1,\r\n 2]\r\n", "x").size() == 2);  // CRLF
}

TEST_CASE("TOML settings: each error names the file, the line, the column and the fault") {
    struct Case {
        const char* text;
        std::vector<const char*> fragments;
    };
    const std::vector<Case> cases = {
        {"[sweep]\nlrs = [1e-3, 3e-3\nseeds = [1]\n", {"sweep.toml:3:"}},
        {"[sweep]\nlrs = [1e-3,\n  3e-3\n", {"sweep.toml:"}},
        {"a = [1 2]\n", {"sweep.toml:1:"}},
        {"out = \"sweeps/x\n", {"sweep.toml:1:"}},
        {"x = \"\\q\"\n", {"sweep.toml:1:", "escape"}},
        {"a = 1\njust some words\n", {"sweep.toml:2:"}},
        {"[s]\njobs = 2\nsteps = 9\njobs = 3\n", {"sweep.toml:4:", "jobs"}},
        {"[s]\n[t]\n[s]\n", {"sweep.toml:3:"}},
        {"out = sweeps/x\n", {"sweep.toml:1:"}},
        {"bias = True\n", {"sweep.toml:1:"}},
        {"steps =\n", {"sweep.toml:1:"}},
        // What TOML allows and a config never holds:
        {"[sweep.inner]\nx = 1\n", {"sweep.toml:1:", "[sweep] holds the table 'inner'"}},
        {"[sweep]\na.b = 1\n", {"sweep.toml:2:1", "[sweep] holds the table 'a'"}},
        {"[[runs]]\nx = 1\n", {"sweep.toml:1:1", "'runs' holds a table"}},
        {"lrs = []\n", {"sweep.toml:1:1", "'lrs' is an empty array"}},
        {"a = [[1, 2]]\n", {"sweep.toml:1:6", "'a' holds an array"}},
        {"[s]\na = [1, \"x\"]\n", {"sweep.toml:2:9", "'s.a' mixes an integer and a string"}},
        {"t = 1979-05-27\n", {"sweep.toml:1:1", "'t' is a date"}},
        {"[s]\nt = {a = 1}\n", {"sweep.toml:2:1", "[s] holds the table 't'"}},
    };
    for (const auto& c : cases) {
        CAPTURE(c.text);
        const std::string msg = toml_error(c.text);
        CAPTURE(msg);
        for (const char* fragment : c.fragments) CHECK(msg.find(fragment) != std::string::npos);
    }
    // Deep nesting is refused, never a stack overflow.
    CHECK(toml_error("a = " + std::string(100'000, '[')).find("sweep.toml:1:") !=
          std::string::npos);
}

TEST_CASE("read_text_file reads a regular, non-empty file and names the path when it cannot") {
    TempDir dir("text_files");
    const std::string text = dir / "corpus.txt", empty = dir / "empty.txt";
    std::ofstream(text) << "hello";
    std::ofstream{empty};
    CHECK(read_text_file(text, "data") == "hello");
    CHECK(error_in_child([&] { read_text_file(empty, "data"); }) ==
          "data: '" + empty + "' is empty");
    CHECK(error_in_child([&] { read_text_file(dir / "absent.txt", "data"); }) ==
          "data: cannot open '" + (dir / "absent.txt") + "': No such file or directory");
    CHECK(error_in_child([&] { read_text_file(dir.path.string() + "/", "data"); }) ==
          "data: '" + dir.path.string() + "/' is a directory, not a regular file");
    // A FIFO blocked the reader before the fix, and /dev/zero filled memory: a child with a
    // deadline turns either regression into a failure rather than a hung suite.
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(error_in_child([&] { read_text_file(fifo, "data"); }) ==
          "data: '" + fifo + "' is a FIFO, not a regular file");
    CHECK(error_in_child([&] { read_text_file("/dev/zero"); }) ==
          "read_text_file: '/dev/zero' is a character device, not a regular file");
}
