// `--config FILE`: a TOML file whose [train] and [sweep] sections set the flags of those commands
// (examples/stability/*.toml), read by toml++ (nn/lab/config_file.h) and checked against the flags
// themselves before anything runs. Flags on the command line win over the file.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace qk::cli {

// Reads and checks the file (a regular file of at most 1 MB): every key must be a flag of its
// section's command (keys before any section: the program's own, --threads), and every value of
// the flag's type: an integer for INT, a number for FLOAT, true/false for a switch, a string
// for a word or a path, an array for a list (--lrs, --variants, --seeds). Throws qk::Error
// "FILE:line:column: ..." naming the key, what it holds and what the flag takes.
void check_config_file(const std::string& path, CLI::App& app);

// Every value argv gives the flag (`--flag VALUE` or `--flag=VALUE`), in order: what --config and
// --preset name, read before CLI11 parses argv.
std::vector<std::string> flag_values(int argc, char** argv, const std::string& flag);

// `qknorm train --preset NAME`: the settings of examples/presets/NAME.toml (compiled into the
// program, so an installed qknorm has them) become the defaults of the train flags, as if the
// program had been built with them: flags on the command line and a --config file still win, and
// `--preset NAME --help` shows the preset's values as the defaults.
//
// apply_preset_flag applies the --preset named in argv, if any, to train_cmd's flags (checked as a
// --config file is: every key a train flag, every value of its type). Call it before CLI11 parses
// argv; the --preset option itself (add_preset_flag) only names the choice for --help and the
// parser.
void apply_preset_flag(int argc, char** argv, CLI::App& app, CLI::App* train_cmd);
CLI::Option* add_preset_flag(CLI::App* train_cmd, std::string& preset);

// CLI11's reader of --config files, on toml++: one item per setting, the section as the parent.
// It sees the file after check_config_file has accepted it.
class TomlConfig : public CLI::Config {
  public:
    std::string to_config(const CLI::App*, bool, bool, std::string) const override;
    std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
};

}  // namespace qk::cli
