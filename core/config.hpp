#pragma once
// TOML configuration with command-line overrides, typed look-ups and errors that name the file,
// the line and the key. Every key read is remembered, so keys nobody reads are reported as
// unknown instead of being silently ignored.
//
//   Config cfg = Config::load("configs/quickstart.toml");
//   cfg.set("run.steps=4");                                  // like --set run.steps=4
//   int steps = cfg.get_int("run.steps", 28, 1, 10000);     // ConfigError if out of range
//   cfg.check_no_unknown_keys();                             // after every module has read

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

namespace cocodiff {

/// The candidate closest to `word` by edit distance, if at most `max_distance` edits away
/// (ties: the first in `candidates`); empty otherwise. For "did you mean" hints.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates,
                          std::size_t max_distance = 2);

class Config {
 public:
  Config() = default;
  /// Parses a TOML file; a missing file or a syntax error is a ConfigError naming file:line.
  static Config load(const std::filesystem::path& file);
  /// Parses TOML text; `source` names it in errors.
  static Config parse(std::string_view text, std::string source);
  /// A configuration built in code: `root` as if parsed from TOML; `source` names it in errors
  /// (in place of file:line). Relative paths in it are taken from the working directory.
  static Config from_table(toml::table root, std::string source);

  /// Applies "dotted.key=value"; value is read as TOML (number, bool, string, array), or as a
  /// bare string when it is not valid TOML. Later sets win.
  void set(std::string_view assignment);
  /// Copies every key of `preset` under `section` that is not already set here.
  void merge_under(std::string_view section, const Config& preset);

  /// Whether the key is present. A key a reader asks about is a key users may set: it counts
  /// among the known keys (did-you-mean hints, the known keys of a section).
  bool has(std::string_view key) const;
  /// Whether the key's value came from set() (--set) rather than the file.
  bool is_override(std::string_view key) const { return overridden_.count(key) > 0; }
  /// The places a relative path in key's (string) value is looked for, in order: the working
  /// directory when the value came from --set, else the config file's directory; then
  /// `fallback_dir` (the presets' directory). An absolute path is its one place.
  std::vector<std::filesystem::path> path_candidates(
      std::string_view key, const std::filesystem::path& fallback_dir) const;
  /// The first of path_candidates that exists; ConfigError naming the file, line and key,
  /// `expected` (what the file is) and every place looked otherwise.
  std::filesystem::path require_path(std::string_view key,
                                     const std::filesystem::path& fallback_dir,
                                     std::string_view expected) const;
  /// "file:line" of a key ("--set" for overrides), or the file alone when the key is absent.
  std::string where(std::string_view key) const;
  const std::string& source() const { return source_; }
  const std::filesystem::path& directory() const { return dir_; }

  std::int64_t get_int(std::string_view key, std::int64_t def, std::int64_t lo = INT64_MIN,
                       std::int64_t hi = INT64_MAX) const;
  std::int64_t require_int(std::string_view key, std::int64_t lo = INT64_MIN,
                           std::int64_t hi = INT64_MAX) const;
  double get_double(std::string_view key, double def, double lo = -1e300, double hi = 1e300) const;
  /// A size in bytes: an integer, or a string of a number and a unit ("8GiB", "512 MiB",
  /// "1.5GB"; B, KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB powers of 1024). At least `lo`.
  std::int64_t get_bytes(std::string_view key, std::int64_t def, std::int64_t lo = 0) const;
  double require_double(std::string_view key, double lo = -1e300, double hi = 1e300) const;
  bool get_bool(std::string_view key, bool def) const;
  std::string get_string(std::string_view key, std::string def) const;
  std::string require_string(std::string_view key) const;
  /// A string that must be one of `choices`.
  std::string get_choice(std::string_view key, std::string def,
                         std::initializer_list<std::string_view> choices) const;
  std::string get_choice(std::string_view key, std::string def,
                         std::span<const std::string> choices) const;
  std::vector<std::int64_t> get_int_list(std::string_view key, std::vector<std::int64_t> def) const;
  std::vector<double> get_double_list(std::string_view key, std::vector<double> def) const;
  std::vector<std::string> get_string_list(std::string_view key,
                                           std::vector<std::string> def) const;
  /// Keys of a sub-table ("cluster.links" -> names), in file order of the TOML library.
  std::vector<std::string> subkeys(std::string_view table_key) const;
  /// Marks a key (and everything under it) as read.
  void mark_used(std::string_view key) const;

  /// Every leaf key that exists but was never read.
  std::vector<std::string> unknown_keys() const;
  /// Throws ConfigError naming the first unknown key, where it is, the closest known key and
  /// the known keys of its section.
  void check_no_unknown_keys() const;
  /// Every key some reader asked for, present or not.
  std::vector<std::string> known_keys() const;

  /// The resolved configuration as TOML text.
  std::string dump() const;
  /// The effective configuration as TOML text: every key a reader asked for, with the value it
  /// got (from the file, a --set or the reader's default), plus what adopt_effective() added.
  std::string dump_effective() const;
  /// Adds the effective values of `layer` (a preset read beside this config) under `prefix`
  /// ("cluster" -> "cluster.<key>") where this config has none.
  void adopt_effective(std::string_view prefix, const Config& layer) const;
  /// Replaces key's effective value (e.g. a path made absolute, a value derived from others).
  void set_effective(std::string_view key, const toml::node& value);
  const toml::table& table() const { return root_; }

 private:
  const toml::node* find(std::string_view key) const;
  [[noreturn]] void type_error(std::string_view key, std::string_view expected) const;
  /// ConfigError naming the key when a string value holds a control character (a newline, a
  /// tab, an escape): names and paths never carry one, and nothing read here reaches an
  /// interpreter as code.
  void check_text(std::string_view key, const std::string& value) const;

  /// Records key's effective value unless one is recorded already.
  void note(std::string_view key, const toml::node& value) const;

  toml::table root_;
  mutable toml::table effective_;
  std::string source_;
  std::filesystem::path dir_;
  std::set<std::string, std::less<>> overridden_;
  mutable std::set<std::string, std::less<>> used_;
  mutable std::set<std::string, std::less<>> known_;
};

/// Describes a TOML node for error messages: "integer 3", "string \"abc\"", "table".
std::string describe_node(const toml::node& node);

}  // namespace cocodiff
