// A settings file in TOML (`qknorm sweep --config examples/stability/exp1_logit_growth.toml`),
// parsed by toml++ and checked for the shape qknorm's configs have: [section] headers, each
// holding `key = value` lines whose value is a string, a number, a boolean or an array of one of
// these. Every setting keeps the place it was written, so that what rejects it later (an unknown
// key, a string where a number belongs) can say "file:line:column".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qk::nn {

struct ConfigSetting {
    enum class Kind { string, integer, floating, boolean };
    std::string section;  // "" for a key before any [section]
    std::string key;
    Kind kind = Kind::string;         // of the value, or of every element of an array
    bool array = false;               // an array of values (even with one element)
    std::vector<std::string> values;  // as text: strings as written, numbers read back exactly
    std::string where;                // "file:line:column" of the key
};

// "a string", "an integer", "a number", "a boolean" (with " array" appended for an array).
std::string describe(const ConfigSetting& setting);
std::string describe(ConfigSetting::Kind kind, bool array);

// The settings in file order. Throws qk::Error "origin:line:column: what is wrong" on TOML that
// does not parse (toml++'s own message) and on what qknorm's configs never hold: a table inside
// a section ([a.b], dotted keys), an array of arrays or tables, an empty array, an array mixing
// kinds, or a date or time.
std::vector<ConfigSetting> parse_config_toml(const std::string& text, const std::string& origin);

}  // namespace qk::nn
