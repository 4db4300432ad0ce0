#include "nn/lab/config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include <toml++/toml.h>

#include "core/error.h"

namespace qk::nn {

namespace {

std::string place(const std::string& origin, const toml::source_region& at) {
    return fmt::format("{}:{}:{}", origin, at.begin.line, at.begin.column);
}

// The kind of a scalar node and its value as text, or nothing for a table, array, date or time.
bool scalar_of(const toml::node& node, ConfigSetting::Kind& kind, std::string& text) {
    if (const auto* s = node.as_string()) {
        kind = ConfigSetting::Kind::string, text = s->get();
    } else if (const auto* i = node.as_integer()) {
        kind = ConfigSetting::Kind::integer, text = std::to_string(i->get());
    } else if (const auto* f = node.as_floating_point()) {
        kind = ConfigSetting::Kind::floating, text = fmt::format("{}", f->get());  // round-trips
    } else if (const auto* b = node.as_boolean()) {
        kind = ConfigSetting::Kind::boolean, text = b->get() ? "true" : "false";
    } else {
        return false;
    }
    return true;
}

const char* type_name(const toml::node& node) {
    switch (node.type()) {
        case toml::node_type::table:
            return "a table";
        case toml::node_type::array:
            return "an array";
        case toml::node_type::date:
            return "a date";
        case toml::node_type::time:
            return "a time";
        case toml::node_type::date_time:
            return "a date-time";
        default:
            return "a value";
    }
}

ConfigSetting setting_of(const std::string& origin, const std::string& section,
                         const toml::key& key, const toml::node& node) {
    ConfigSetting s{section, std::string(key.str()), {}, false, {}, place(origin, key.source())};
    const std::string name = section.empty() ? s.key : section + "." + s.key;
    std::string text;
    if (scalar_of(node, s.kind, text)) {
        s.values.push_back(text);
        return s;
    }
    const auto* array = node.as_array();
    QK_CHECK(array != nullptr,
             "{}: '{}' is {}; a setting is a string, a number, a boolean or an array of one of "
             "these{}",
             s.where, name, type_name(node),
             node.is_table() ? " (a [section] holds key = value lines, one level deep)" : "");
    QK_CHECK(!array->empty(), "{}: '{}' is an empty array", s.where, name);
    s.array = true;
    for (const toml::node& element : *array) {
        ConfigSetting::Kind kind{};
        QK_CHECK(scalar_of(element, kind, text), "{}: '{}' holds {}; an array holds plain values",
                 place(origin, element.source()), name, type_name(element));
        // Integers among floats are numbers too: lrs = [1e-3, 1].
        const bool numbers =
            (kind == ConfigSetting::Kind::integer || kind == ConfigSetting::Kind::floating) &&
            (s.kind == ConfigSetting::Kind::integer || s.kind == ConfigSetting::Kind::floating);
        QK_CHECK(s.values.empty() || kind == s.kind || numbers, "{}: '{}' mixes {} and {} values",
                 place(origin, element.source()), name, describe(s.kind, false),
                 describe(kind, false));
        if (s.values.empty() || kind == ConfigSetting::Kind::floating) s.kind = kind;
        s.values.push_back(text);
    }
    return s;
}

}  // namespace

std::string describe(ConfigSetting::Kind kind, bool array) {
    const char* kinds[] = {"a string", "an integer", "a number", "a boolean"};
    const std::string s = kinds[static_cast<int>(kind)];
    return array ? s + " array" : s;
}

std::string describe(const ConfigSetting& setting) { return describe(setting.kind, setting.array); }

std::vector<ConfigSetting> parse_config_toml(const std::string& text, const std::string& origin) {
    toml::table root;
    try {
        root = toml::parse(text, origin);
    } catch (const toml::parse_error& e) {
        throw Error(fmt::format("{}: {}", place(origin, e.source()), e.description()));
    }
    // toml++ keeps a table's keys sorted; the settings come back in the order they were written.
    std::vector<std::pair<toml::source_position, ConfigSetting>> settings;
    auto add = [&](const std::string& section, const toml::key& key, const toml::node& node) {
        settings.emplace_back(key.source().begin, setting_of(origin, section, key, node));
    };
    for (const auto& [key, node] : root) {
        if (!node.is_table()) {
            add("", key, node);
            continue;
        }
        for (const auto& [inner_key, inner] : *node.as_table()) {
            QK_CHECK(!inner.is_table(),
                     "{}: [{}] holds the table '{}' ([{}.{}] or a dotted key); a config's sections "
                     "hold key = value lines, one level deep",
                     place(origin, inner_key.source()), key.str(), inner_key.str(), key.str(),
                     inner_key.str());
            add(std::string(key.str()), inner_key, inner);
        }
    }
    std::sort(settings.begin(), settings.end(), [](const auto& a, const auto& b) {
        return std::pair(a.first.line, a.first.column) < std::pair(b.first.line, b.first.column);
    });
    std::vector<ConfigSetting> in_order;
    for (auto& [at, setting] : settings) in_order.push_back(std::move(setting));
    return in_order;
}

}  // namespace qk::nn
