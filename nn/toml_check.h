// A strict syntax check for the subset of TOML that qknorm's configs use
// (examples/stability/*.toml), run before CLI11's reader, which is lax: it accepts an unclosed
// array or a stray line and then runs with default values.
//
// The subset: blank lines and # comments; [section] headers (a bare or dotted name, each once);
// key = value lines (bare, dotted or quoted keys, each once per section); values that are
// strings ("..." with TOML escapes, or '...', on one line), numbers (decimal integers and floats,
// inf, nan, with _ between digits), booleans, or arrays of these, which may span lines and hold
// comments and a trailing comma.
#pragma once

#include <string>

namespace qk::nn {

// Throws qk::Error "<origin>:<line>: <what is wrong>" at the first thing outside the subset.
void check_toml_syntax(const std::string& text, const std::string& origin);

}  // namespace qk::nn
