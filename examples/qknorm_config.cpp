#include "examples/qknorm_config.h"

#include <fmt/format.h>

#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "nn/lab/config_file.h"
#include "qknorm_presets.h"  // generated from examples/presets/*.toml

namespace qk::cli {

namespace {

using nn::ConfigSetting;

// A config is a page of settings: 1 MB is far beyond one, and bounds what parsing it costs (a
// 200 MB file once took 2.7 GB).
constexpr uint64_t kMaxConfigBytes = 1 << 20;

// What a flag takes, from CLI11's type name ("INT", "UINT", "FLOAT", "BOOLEAN", "TEXT", each
// maybe followed by ":" and its check) and whether it takes a list.
struct FlagType {
    std::string name;  // "an integer", "a number", "a boolean", "a string"
    bool array = false;
    bool accepts(const ConfigSetting& s) const {
        if (s.array != array) return false;
        switch (s.kind) {
            case ConfigSetting::Kind::integer:
                return name == "an integer" || name == "a number";
            case ConfigSetting::Kind::floating:
                return name == "a number";
            case ConfigSetting::Kind::boolean:
                return name == "a boolean";
            case ConfigSetting::Kind::string:
                return name == "a string";
        }
        return false;
    }
};

FlagType type_of(const CLI::Option* option) {
    FlagType t;
    t.array = option->get_items_expected_max() > 1;
    if (option->get_type_size() == 0) return {"a boolean", false};  // a switch: --quiet
    const std::string type = option->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    t.name = base == "INT" || base == "UINT" ? "an integer"
             : base == "FLOAT"               ? "a number"
             : base == "BOOLEAN"             ? "a boolean"
                                             : "a string";
    return t;
}

std::string flag_names(const CLI::App* cmd) {
    std::string names;
    for (const CLI::Option* o : cmd->get_options())
        if (o->get_configurable() && !o->get_lnames().empty() && o->get_lnames()[0] != "help" &&
            o->get_lnames()[0] != "config")
            names += (names.empty() ? "" : ", ") + o->get_lnames()[0];
    return names;
}

void check_setting(const ConfigSetting& s, CLI::App& app) {
    CLI::App* cmd = &app;
    if (!s.section.empty()) {
        cmd = nullptr;
        for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
            if (sub->get_name() == s.section) cmd = sub;
        QK_CHECK(cmd != nullptr,
                 "{}: [{}] is not a command of qknorm; the sections are [train] "
                 "and [sweep]",
                 s.where, s.section);
    }
    const CLI::Option* option = cmd->get_option_no_throw("--" + s.key);
    const std::string in = s.section.empty() ? "before any section" : "in [" + s.section + "]";
    QK_CHECK(
        option != nullptr && option->get_configurable() && s.key != "help" && s.key != "config",
        "{}: unknown key '{}' {}; the keys are the flags of the command without their "
        "dashes: {}",
        s.where, s.key, in, flag_names(cmd));
    const FlagType type = type_of(option);
    const std::string wanted = type.array ? type.name + " array" : type.name;
    const std::string shown = s.array ? fmt::format("[{}]", fmt::join(s.values, ", "))
                                      : fmt::format("{}", fmt::join(s.values, ", "));
    QK_CHECK(type.accepts(s), "{}: '{}' {} is {} ({}), but --{} takes {}", s.where, s.key, in,
             nn::describe(s), shown, s.key, wanted);
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const EmbeddedPreset& p : kPresets) names.push_back(p.name);
    return names;
}

std::string preset_text(const std::string& name) {
    for (const EmbeddedPreset& p : kPresets)
        if (name == p.name) return p.text;
    throw Error(fmt::format("train: --preset '{}' is not a preset; the presets are: {}", name,
                            fmt::join(preset_names(), ", ")));
}

}  // namespace

void check_config_file(const std::string& path, CLI::App& app) {
    const std::string text = read_regular_file(path, "--config", kMaxConfigBytes);
    for (const ConfigSetting& setting : nn::parse_config_toml(text, path))
        check_setting(setting, app);
}

CLI::Option* add_preset_flag(CLI::App* train_cmd, std::string& preset) {
    return train_cmd
        ->add_option("--preset", preset,
                     fmt::format("start from a recipe's settings (examples/presets/NAME.toml; "
                                 "flags given too win): {}",
                                 fmt::join(preset_names(), ", ")))
        ->check(CLI::IsMember(preset_names()));
}

std::vector<std::string> flag_values(int argc, char** argv, const std::string& flag) {
    std::vector<std::string> values;
    const std::string with_value = flag + "=";
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == flag && i + 1 < argc) values.push_back(argv[i + 1]);
        if (arg.rfind(with_value, 0) == 0) values.push_back(arg.substr(with_value.size()));
    }
    return values;
}

void apply_preset_flag(int argc, char** argv, CLI::App& app, CLI::App* train_cmd) {
    const std::vector<std::string> given = flag_values(argc, argv, "--preset");
    const std::string name = given.empty() ? "" : given.back();
    if (name.empty()) return;
    const std::string origin = "--preset " + name;
    for (const ConfigSetting& s : nn::parse_config_toml(preset_text(name), origin)) {
        check_setting(s, app);
        QK_CHECK(s.section == "train",
                 "{}: a preset sets train flags only, in [train]; got '{}' {}", s.where, s.key,
                 s.section.empty() ? "before any section" : "in [" + s.section + "]");
        CLI::Option* option = train_cmd->get_option("--" + s.key);
        option->run_callback_for_default();     // the new default reaches the flag's variable
        option->default_val(s.values.front());  // no train flag takes a list (check_setting)
    }
}

std::string TomlConfig::to_config(const CLI::App*, bool, bool, std::string) const {
    throw Error("qknorm: writing a --config file is not supported");
}

std::vector<CLI::ConfigItem> TomlConfig::from_config(std::istream& input) const {
    const std::string text{std::istreambuf_iterator<char>(input), {}};
    std::vector<CLI::ConfigItem> items;
    for (const ConfigSetting& s : nn::parse_config_toml(text, "--config")) {
        CLI::ConfigItem item;
        if (!s.section.empty()) item.parents.push_back(s.section);
        item.name = s.key;
        item.inputs = s.values;
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace qk::cli
