// Config and data files as hostile input: the strict TOML check that runs before CLI11's lax
// reader (nn/toml_check.h), and read_text_file, which reads only a regular, non-empty file and
// names the path in every refusal.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "error_in_child.h"
#include "helpers.h"
#include "nn/data.h"
#include "nn/toml_check.h"

using namespace qk;
using namespace qk::nn;
using qk::test::error_in_child;
using qk::test::read_file;
using qk::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string toml_error(const std::string& text) {
    return qk::test::error_message([&] { check_toml_syntax(text, "sweep.toml"); });
}

}  // namespace

TEST_CASE("every committed stability config passes the TOML check") {
    int seen = 0;
    for (const auto& e : fs::directory_iterator(QK_SOURCE_DIR "/examples/stability")) {
        if (e.path().extension() != ".toml") continue;
        CAPTURE(e.path());
        CHECK(toml_error(read_file(e.path().string())) == "(no error)");
        ++seen;
    }
    CHECK(seen >= 3);
}

TEST_CASE("the TOML subset: what it accepts") {
    const char* good = R"(# a comment
top = 1

[sweep]
variants = ["baseline", 'lp:p=1', "tab\there \"q\" \u00e9"]  # trailing comment
lrs = [1e-3, 3E+2, -0.5, +7, 1_000, inf, -nan,
       2.5,  # a comment inside an array
]
nested = [[1, 2], [], [[true]]]
flag = false
"quoted key" = 'x'
dotted.key = 0
[other]
lrs = [1]
)";
    CHECK(toml_error(good) == "(no error)");
    CHECK(toml_error("a = 1\r\n[s]\r\nb = [1,\r\n 2]\r\n") == "(no error)");  // CRLF line ends
    CHECK(toml_error("") == "(no error)");
    CHECK(toml_error("a = 1") == "(no error)");  // no final newline
}

TEST_CASE("the TOML subset: each error names the file, the line and the fault") {
    struct Case {
        const char* text;
        const char* message;
    };
    const Case cases[] = {
        {"[sweep]\nlrs = [1e-3, 3e-3\nseeds = [1]\n",
         "sweep.toml:2: unclosed array: the '[' of 'lrs' has no ']' before line 3"},
        {"[sweep]\nlrs = [1e-3,\n  3e-3\n",
         "sweep.toml:2: unclosed array: the '[' of 'lrs' has no ']' before the end of the file"},
        {"a = [1 2]\n", "sweep.toml:1: expected ',' or ']' in the array of 'a', found '2]'"},
        {"out = \"sweeps/x\n", "sweep.toml:1: unclosed string: no closing \" on the line"},
        {"out = 'sweeps/x\n", "sweep.toml:1: unclosed string: no closing ' on the line"},
        {"x = \"\\q\"\n", "sweep.toml:1: bad escape '\\q' in a string"},
        {"a = 1\njust some words\n", "sweep.toml:2: expected '=' after the key 'just', found"},
        {"= 3\n", "sweep.toml:1: expected a [section], a key = value or a comment, found '= 3'"},
        {"[s]\njobs = 2\nsteps = 9\njobs = 3\n",
         "sweep.toml:4: the key 'jobs' is set twice in [s] (first at line 2)"},
        {"[s]\n[t]\n[s]\n", "sweep.toml:3: section [s] appears twice (first at line 1)"},
        {"[sweep\nx = 1\n", "sweep.toml:1: bad section header '[sweep' (expected [name])"},
        {"[[runs]]\n", "sweep.toml:1: bad section header '[[runs]]' (expected [name])"},
        {"[]\n", "sweep.toml:1: bad section header '[]' (expected [name])"},
        {"out = sweeps/x\n",
         "sweep.toml:1: the value 'sweeps/x' of 'out' is not a string, number, boolean or array"},
        {"bias = True\n", "the value 'True' of 'bias' is not a string, number, boolean or array"},
        {"n = 01\n", "the value '01' of 'n' is not a string, number, boolean or array"},
        {"n = 1__0\n", "the value '1__0' of 'n' is not a string, number, boolean or array"},
        {"n = 1.\n", "the value '1.' of 'n' is not a string, number, boolean or array"},
        {"t = {a = 1}\n", "the value '{a' of 't' is not a string, number, boolean or array"},
        {"steps =\n", "sweep.toml:1: the key 'steps' has no value"},
        {"a = [,]\n", "sweep.toml:1: expected a value for 'a', found ',]'"},
        {"a = 1 2\n", "sweep.toml:1: unexpected '2' after the value of 'a'"},
        {"[s] x\n", "sweep.toml:1: unexpected 'x' after the section header [s]"},
        {"s = \"\"\"x\"\"\"\n", "sweep.toml:1: multi-line strings (\"\"\") are not supported"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.text);
        const std::string msg = toml_error(c.text);
        CAPTURE(msg);
        CHECK(msg.find(c.message) != std::string::npos);
    }
    // Nesting is bounded, so that hostile input cannot run the recursion out of stack.
    CHECK(toml_error("a = " + std::string(100'000, '[')).find("arrays nested deeper than 32") !=
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
