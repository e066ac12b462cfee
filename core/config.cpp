#include "core/config.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

std::vector<std::string> split_key(std::string_view key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    parts.emplace_back(key.substr(start, dot == std::string_view::npos ? key.npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

void collect_leaves(const toml::table& t, const std::string& prefix,
                    std::vector<std::string>& out) {
  for (const auto& [k, v] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = v.as_table(); sub != nullptr)
      collect_leaves(*sub, key, out);  // an empty table has no leaves: nothing unknown in it
    else
      out.push_back(key);
  }
}

void merge_missing(toml::table& dst, const toml::table& src) {
  for (const auto& [k, v] : src) {
    toml::node* existing = dst.get(k);
    if (existing == nullptr) {
      dst.insert(k, v);
    } else if (existing->is_table() && v.is_table()) {
      merge_missing(*existing->as_table(), *v.as_table());
    }
  }
}

// Puts `value` at the dotted `key` of `t`, creating the tables on the way; an existing value is
// kept unless `replace`.
void insert_at(toml::table& t, std::string_view key, const toml::node& value, bool replace) {
  const std::vector<std::string> parts = split_key(key);
  toml::table* cur = &t;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = cur->get(parts[i]);
    if (n == nullptr) n = &cur->insert(parts[i], toml::table{}).first->second;
    if (!n->is_table()) return;  // a leaf where a table would be: keep the leaf
    cur = n->as_table();
  }
  if (replace)
    cur->insert_or_assign(parts.back(), value);
  else
    cur->insert(parts.back(), value);
}

// A config is a few kilobytes; a larger limit than any real one keeps a stray huge file (which
// toml++ would hold in memory many times over) from exhausting memory.
constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{16} << 20;

std::string file_kind(std::filesystem::file_type t) {
  switch (t) {
    case std::filesystem::file_type::directory:
      return "directory";
    case std::filesystem::file_type::fifo:
      return "FIFO";
    case std::filesystem::file_type::character:
    case std::filesystem::file_type::block:
      return "device";
    case std::filesystem::file_type::socket:
      return "socket";
    default:
      return "special file";
  }
}

// A key as printed in messages: control characters escaped, so a newline shows as \n.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      out += "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 0xf]) +
             std::string(1, "0123456789abcdef"[c & 0xf]);
    else
      out += c;
  }
  return out;
}

// Keys are addressed by dotted paths ("run.seed"), so a key whose own name holds a dot (the
// quoted key "run.seed" = 3, which TOML reads as one key of that name, not as seed in [run])
// could never be read: it is refused by name and line, wherever it is.
void check_key_names(const toml::table& t, const std::string& source, const std::string& prefix) {
  for (const auto& [k, v] : t) {
    const std::string name(k.str());
    std::string path = prefix;
    if (!path.empty()) path += ".";
    path += name;
    if (name.find('.') != std::string::npos) {
      std::string msg = source;
      if (k.source().begin.line > 0) msg.append(":").append(std::to_string(k.source().begin.line));
      msg.append(": quoted key \"").append(printable(name)).append("\"");
      if (!prefix.empty()) msg.append(" in [").append(prefix).append("]");
      msg.append(
          " holds a dot: TOML reads it as one key of that name, which no setting has; write the "
          "dotted key unquoted (");
      msg.append(printable(name)).append(" = ...) or the last part under its table");
      throw ConfigError(msg);
    }
    if (const toml::table* sub = v.as_table(); sub != nullptr)
      check_key_names(*sub, source, path);
    else if (const toml::array* a = v.as_array(); a != nullptr)
      for (const toml::node& e : *a)
        if (const toml::table* sub = e.as_table(); sub != nullptr)
          check_key_names(*sub, source, path);
  }
}

}  // namespace

std::string describe_node(const toml::node& node) {
  std::ostringstream os;
  switch (node.type()) {
    case toml::node_type::string:
      os << "string \"" << node.value<std::string>().value_or("") << '"';
      break;
    case toml::node_type::integer:
      os << "integer " << node.value<std::int64_t>().value_or(0);
      break;
    case toml::node_type::floating_point:
      os << "float " << node.value<double>().value_or(0);
      break;
    case toml::node_type::boolean:
      os << "boolean " << (node.value<bool>().value_or(false) ? "true" : "false");
      break;
    case toml::node_type::array:
      os << "an array";
      break;
    case toml::node_type::table:
      os << "a table";
      break;
    default:
      os << "a date/time";
      break;
  }
  return os.str();
}

Config Config::load(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (st.type() == fs::file_type::not_found || st.type() == fs::file_type::none)
    throw ConfigError(file.string() + ": no such config file");
  if (st.type() != fs::file_type::regular)
    throw ConfigError(file.string() + ": not a regular file (a " + file_kind(st.type()) +
                      "); a config is a TOML file");
  const std::uintmax_t size_bytes = fs::file_size(file, ec);
  if (!ec && size_bytes > kMaxConfigBytes)
    throw ConfigError(file.string() + ": " + std::to_string(size_bytes) +
                      " bytes; a config file may hold at most " + std::to_string(kMaxConfigBytes) +
                      " bytes");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(file.string() + ": cannot be read (" + std::strerror(errno) + ")");
  Config c;
  try {
    c.root_ = toml::parse(in, file.string());
  } catch (const toml::parse_error& e) {
    throw ConfigError(file.string() + ":" + std::to_string(e.source().begin.line) + ":" +
                      std::to_string(e.source().begin.column) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  check_key_names(c.root_, file.string(), "");
  c.source_ = file.string();
  c.dir_ = file.parent_path();
  return c;
}

Config Config::parse(std::string_view text, std::string source) {
  Config c;
  try {
    c.root_ = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(source + ":" + std::to_string(e.source().begin.line) + ":" +
                      std::to_string(e.source().begin.column) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  check_key_names(c.root_, source, "");
  c.source_ = std::move(source);
  return c;
}

Config Config::from_table(toml::table root, std::string source) {
  check_key_names(root, source, "");
  Config c;
  c.root_ = std::move(root);
  c.source_ = std::move(source);
  return c;
}

void Config::set(std::string_view assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw ConfigError("--set '" + std::string(assignment) +
                      "': expected key=value, e.g. --set run.steps=4");
  // One key = value per --set: a line break would let TOML read the rest of the value as more
  // keys, which the parse below would drop without a word.
  if (assignment.find_first_of("\n\r") != std::string_view::npos)
    throw ConfigError("--set '" + printable(assignment) +
                      "': holds a line break; give one key=value per --set");
  std::string key(assignment.substr(0, eq));
  std::string value(assignment.substr(eq + 1));
  while (!key.empty() && key.back() == ' ') key.pop_back();
  std::vector<std::string> parts = split_key(key);
  for (const std::string& p : parts)
    if (p.empty()) throw ConfigError("--set '" + std::string(assignment) + "': empty key part");
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert("v", value);  // a bare word such as flat or aurora
  }
  toml::table* t = &root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (n == nullptr) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
    }
    if (!n->is_table())
      throw ConfigError("--set " + key + ": '" + parts[i] + "' is " + describe_node(*n) +
                        ", not a table");
    t = n->as_table();
  }
  toml::node* existing = t->get(parts.back());
  const toml::node& v = *parsed.get("v");
  if (const toml::table* inline_table = v.as_table(); inline_table != nullptr)
    check_key_names(*inline_table, "--set " + key, key);
  if (existing != nullptr && existing->is_table())
    throw ConfigError("--set " + key + ": that key is a table; set one of its keys instead");
  if (existing != nullptr && existing->type() != v.type() &&
      !(existing->is_number() && v.is_number()))
    throw ConfigError("--set " + key + ": expected " +
                      describe_node(*existing).substr(0, describe_node(*existing).find(' ')) +
                      " like the config's " + describe_node(*existing) + ", found " +
                      describe_node(v));
  t->insert_or_assign(parts.back(), v);
  overridden_.insert(key);
}

void Config::merge_under(std::string_view section, const Config& preset) {
  toml::node* n = root_.get(section);
  if (n == nullptr) {
    root_.insert(section, toml::table{});
    n = root_.get(section);
  }
  if (!n->is_table())
    throw ConfigError(where(section), section, "a table ([" + std::string(section) + "])",
                      describe_node(*n));
  merge_missing(*n->as_table(), preset.root_);
}

const toml::node* Config::find(std::string_view key) const {
  toml::node_view<const toml::node> v = root_.at_path(key);
  return v.node();
}

bool Config::has(std::string_view key) const {
  if (known_.find(key) == known_.end()) known_.insert(std::string(key));
  return find(key) != nullptr;
}

std::vector<std::filesystem::path> Config::path_candidates(
    std::string_view key, const std::filesystem::path& fallback_dir) const {
  namespace fs = std::filesystem;
  const fs::path value(require_string(key));
  if (value.is_absolute()) return {value};
  std::error_code ec;
  const fs::path first = is_override(key) ? fs::current_path(ec) / value : dir_ / value;
  std::vector<fs::path> out = {first.lexically_normal()};
  const fs::path second = (fallback_dir / value).lexically_normal();
  if (!fallback_dir.empty() && second != out.front()) out.push_back(second);
  return out;
}

std::filesystem::path Config::require_path(std::string_view key,
                                           const std::filesystem::path& fallback_dir,
                                           std::string_view expected) const {
  const std::vector<std::filesystem::path> places = path_candidates(key, fallback_dir);
  std::error_code ec;
  for (const std::filesystem::path& p : places)
    if (std::filesystem::exists(p, ec)) return p;
  std::string found = "\"" + require_string(key) + "\": no such file (looked for ";
  for (size_t i = 0; i < places.size(); ++i)
    found += (i == 0 ? "" : i + 1 == places.size() ? " and " : ", ") + places[i].string();
  found += is_override(key) ? "; a --set path is relative to the working directory, then to the "
                              "presets' directory)"
                            : "; a path in a config is relative to its file, then to the "
                              "presets' directory)";
  throw ConfigError(where(key), key, expected, found);
}

std::string Config::where(std::string_view key) const {
  if (overridden_.count(key) > 0) return "--set " + std::string(key);
  const toml::node* n = find(key);
  if (n != nullptr && n->source().begin.line > 0) {
    std::string path = n->source().path ? std::string(*n->source().path) : source_;
    return path + ":" + std::to_string(n->source().begin.line);
  }
  return source_.empty() ? std::string("<config>") : source_;
}

void Config::type_error(std::string_view key, std::string_view expected) const {
  const toml::node* n = find(key);
  throw ConfigError(where(key), key, expected, n ? describe_node(*n) : "nothing (key missing)");
}

void Config::mark_used(std::string_view key) const {
  used_.insert(std::string(key));
  known_.insert(std::string(key));
}

std::int64_t Config::get_int(std::string_view key, std::int64_t def, std::int64_t lo,
                             std::int64_t hi) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    if (def >= lo && def <= hi) note(key, toml::value<std::int64_t>(def));
    return def;
  }
  return require_int(key, lo, hi);
}

std::int64_t Config::require_int(std::string_view key, std::int64_t lo, std::int64_t hi) const {
  mark_used(key);
  const toml::node* n = find(key);
  std::optional<std::int64_t> v;
  if (n != nullptr) {
    v = n->value_exact<std::int64_t>();  // 384.0 is a float, not an integer: refused
  }
  std::string range = (lo == INT64_MIN && hi == INT64_MAX)
                          ? "an integer"
                          : "an integer in [" + std::to_string(lo) + ", " +
                                (hi == INT64_MAX ? std::string("inf") : std::to_string(hi)) + "]";
  if (!v) type_error(key, range);
  if (*v < lo || *v > hi) throw ConfigError(where(key), key, range, std::to_string(*v));
  note(key, *n);
  return *v;
}

std::int64_t Config::get_bytes(std::string_view key, std::int64_t def, std::int64_t lo) const {
  known_.insert(std::string(key));
  if (!has(key)) return def;
  mark_used(key);
  const std::string expected = "a size in bytes of at least " + std::to_string(lo) +
                               ": an integer or a string such as \"8GiB\" or \"512MB\"";
  const toml::node* n = find(key);
  if (const std::optional<std::int64_t> v = n->value_exact<std::int64_t>()) {
    if (*v < lo) throw ConfigError(where(key), key, expected, std::to_string(*v));
    note(key, *n);
    return *v;
  }
  const std::optional<std::string> text = n->value_exact<std::string>();
  if (!text) type_error(key, expected);
  // number, optional blanks, unit
  const std::string& t = *text;
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) != 0 || t[i] == '.')) ++i;
  size_t u = i;
  while (u < t.size() && t[u] == ' ') ++u;
  std::string unit = t.substr(u);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},      {"B", 1},        {"KB", 1e3},     {"MB", 1e6},     {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 0x1p10}, {"MIB", 0x1p20}, {"GIB", 0x1p30}, {"TIB", 0x1p40}};
  double scale = 0;
  for (const auto& [name, s] : kUnits)
    if (unit == name) scale = s;
  double number = -1;
  if (i > 0 && scale > 0) {
    char* end = nullptr;
    const std::string digits = t.substr(0, i);
    number = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size()) number = -1;
  }
  const double bytes = number * scale;
  if (!(number >= 0) || !(bytes < 9.2e18) || bytes < static_cast<double>(lo))
    throw ConfigError(where(key), key, expected, describe_node(*n));
  note(key, *n);  // as written ("8GiB"); without the key the default is the machine's
  return static_cast<std::int64_t>(bytes);
}

double Config::get_double(std::string_view key, double def, double lo, double hi) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    if (std::isfinite(def) && def >= lo && def <= hi) note(key, toml::value<double>(def));
    return def;
  }
  return require_double(key, lo, hi);
}

double Config::require_double(std::string_view key, double lo, double hi) const {
  mark_used(key);
  const toml::node* n = find(key);
  std::optional<double> v;
  if (n != nullptr && n->is_number()) v = n->value<double>();
  std::ostringstream range;
  range << "a number";
  if (lo > -1e300 || hi < 1e300) range << " in [" << lo << ", " << hi << "]";
  if (!v) type_error(key, range.str());
  if (!std::isfinite(*v) || !(*v >= lo && *v <= hi)) {
    std::ostringstream f;
    f << *v;
    throw ConfigError(where(key), key, range.str(), f.str());
  }
  note(key, *n);
  return *v;
}

bool Config::get_bool(std::string_view key, bool def) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    note(key, toml::value<bool>(def));
    return def;
  }
  mark_used(key);
  std::optional<bool> v = find(key)->value_exact<bool>();
  if (!v) type_error(key, "true or false");
  note(key, *find(key));
  return *v;
}

std::string Config::get_string(std::string_view key, std::string def) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    note(key, toml::value<std::string>(def));
    return def;
  }
  return require_string(key);
}

void Config::check_text(std::string_view key, const std::string& value) const {
  for (const char ch : value) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02X", u);
      throw ConfigError(where(key), key, "text without control characters (a name, a path)",
                        "a string holding the control character " + std::string(code) +
                            (u == '\n' ? " (a newline)" : ""));
    }
  }
}

std::string Config::require_string(std::string_view key) const {
  mark_used(key);
  const toml::node* n = find(key);
  std::optional<std::string> v = n ? n->value_exact<std::string>() : std::nullopt;
  if (!v) type_error(key, "a string");
  check_text(key, *v);
  note(key, *n);
  return *v;
}

std::string Config::get_choice(std::string_view key, std::string def,
                               std::initializer_list<std::string_view> choices) const {
  const std::vector<std::string> list(choices.begin(), choices.end());
  return get_choice(key, std::move(def), list);
}

std::string Config::get_choice(std::string_view key, std::string def,
                               std::span<const std::string> choices) const {
  std::string v = get_string(key, std::move(def));
  std::string list;
  for (const std::string& c : choices) {
    if (c == v) return v;
    list += (list.empty() ? "" : " | ") + c;
  }
  throw ConfigError(where(key), key, "one of " + list, "\"" + v + "\"");
}

namespace {
template <typename T>
std::vector<T> get_list(const Config& cfg, const toml::node* n, std::string_view key,
                        std::string_view expected) {
  std::vector<T> out;
  const toml::array* a = n ? n->as_array() : nullptr;
  if (a == nullptr)
    throw ConfigError(cfg.where(key), key, expected, n ? describe_node(*n) : "nothing");
  for (const toml::node& e : *a) {
    std::optional<T> v;
    if constexpr (std::is_same_v<T, double>) {
      if (e.is_number()) v = e.value<double>();
      if (v && !std::isfinite(*v))
        throw ConfigError(cfg.where(key), key, "an array of finite numbers",
                          "an element that is " + describe_node(e));
    } else {
      v = e.value_exact<T>();
    }
    if (!v)
      throw ConfigError(cfg.where(key), key, expected, "an element that is " + describe_node(e));
    out.push_back(*v);
  }
  return out;
}
}  // namespace

std::vector<std::int64_t> Config::get_int_list(std::string_view key,
                                               std::vector<std::int64_t> def) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    toml::array a;
    for (const std::int64_t& v : def) a.push_back(v);
    note(key, a);
    return def;
  }
  mark_used(key);
  std::vector<std::int64_t> v =
      get_list<std::int64_t>(*this, find(key), key, "an array of integers");
  note(key, *find(key));
  return v;
}

std::vector<double> Config::get_double_list(std::string_view key, std::vector<double> def) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    toml::array a;
    for (const double& v : def) a.push_back(v);
    note(key, a);
    return def;
  }
  mark_used(key);
  std::vector<double> v = get_list<double>(*this, find(key), key, "an array of numbers");
  note(key, *find(key));
  return v;
}

std::vector<std::string> Config::get_string_list(std::string_view key,
                                                 std::vector<std::string> def) const {
  known_.insert(std::string(key));
  if (!has(key)) {
    toml::array a;
    for (const std::string& v : def) a.push_back(v);
    note(key, a);
    return def;
  }
  mark_used(key);
  std::vector<std::string> v = get_list<std::string>(*this, find(key), key, "an array of strings");
  for (const std::string& e : v) check_text(key, e);
  note(key, *find(key));
  return v;
}

std::vector<std::string> Config::subkeys(std::string_view table_key) const {
  std::vector<std::string> out;
  const toml::node* n = find(table_key);
  if (n == nullptr) return out;
  const toml::table* t = n->as_table();
  if (t == nullptr) type_error(table_key, "a table");
  for (const auto& [k, v] : *t) {
    out.emplace_back(k.str());
    check_text(std::string(table_key) + "." + out.back(), out.back());
  }
  return out;
}

std::vector<std::string> Config::unknown_keys() const {
  std::vector<std::string> leaves;
  collect_leaves(root_, "", leaves);
  std::vector<std::string> unknown;
  for (const std::string& leaf : leaves) {
    bool used = false;
    // A leaf is known when it, or a table above it, was read.
    std::string k = leaf;
    while (true) {
      if (used_.count(k) > 0) {
        used = true;
        break;
      }
      size_t dot = k.rfind('.');
      if (dot == std::string::npos) break;
      k.resize(dot);
    }
    if (!used) unknown.push_back(leaf);
  }
  return unknown;
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates,
                          std::size_t max_distance) {
  std::string best;
  std::size_t best_d = max_distance + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(c, word);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

void Config::check_no_unknown_keys() const {
  std::vector<std::string> unknown = unknown_keys();
  if (unknown.empty()) return;
  const std::string& key = unknown.front();
  const std::string section =
      key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
  const std::string best = closest_match(key, known_keys());
  std::string in_section;
  for (const std::string& k : known_) {
    const std::size_t dot = k.rfind('.');
    if (dot != std::string::npos && k.substr(0, dot) == section)
      in_section += (in_section.empty() ? "" : ", ") + k.substr(dot + 1);
  }
  std::string msg = where(key) + ": unknown key '" + key + "'";
  if (!best.empty()) msg += "; did you mean '" + best + "'?";
  if (!in_section.empty()) msg += " (known keys of [" + section + "]: " + in_section + ")";
  throw ConfigError(msg);
}

std::vector<std::string> Config::known_keys() const {
  return std::vector<std::string>(known_.begin(), known_.end());
}

void Config::note(std::string_view key, const toml::node& value) const {
  insert_at(effective_, key, value, false);
}

void Config::set_effective(std::string_view key, const toml::node& value) {
  insert_at(effective_, key, value, true);
}

void Config::adopt_effective(std::string_view prefix, const Config& layer) const {
  const std::function<void(const toml::table&, const std::string&)> walk =
      [&](const toml::table& t, const std::string& at) {
        for (const auto& [k, v] : t) {
          const std::string key = at + "." + std::string(k.str());
          if (const toml::table* sub = v.as_table(); sub != nullptr)
            walk(*sub, key);
          else
            note(key, v);
        }
      };
  walk(layer.effective_, std::string(prefix));
}

namespace {

// The shortest decimal that reads back as exactly `v` ("0.6", not "0.59999999999999998"), with a
// decimal point or exponent so that TOML reads a float.
std::string shortest_float(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // n: inf, nan
  return s;
}

// TOML text with every float written shortest (see shortest_float); strings, comments and table
// headers are copied as they are.
std::string shorten_floats(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto word_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-';
  };
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"' || c == '\'') {  // a string: to its closing quote
      size_t j = i + 1;
      while (j < text.size() && text[j] != c) j += (c == '"' && text[j] == '\\') ? 2 : 1;
      j = std::min(j + 1, text.size());
      out.append(text, i, j - i);
      i = j;
      continue;
    }
    if (c == '#' || (c == '[' && (i == 0 || text[i - 1] == '\n'))) {  // a comment or a header
      const size_t j = std::min(text.find('\n', i), text.size());
      out.append(text, i, j - i);
      i = j;
      continue;
    }
    const bool starts_number = (std::isdigit(static_cast<unsigned char>(c)) != 0 ||
                                ((c == '-' || c == '+') && i + 1 < text.size() &&
                                 std::isdigit(static_cast<unsigned char>(text[i + 1])) != 0)) &&
                               (i == 0 || !word_char(text[i - 1]));
    if (!starts_number) {
      out += c;
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() && (word_char(text[j]) || text[j] == '+')) ++j;
    const std::string token = text.substr(i, j - i);
    const bool is_float = token.find_first_of(".eE") != std::string::npos &&
                          token.find_first_of(":T") == std::string::npos;  // not a date
    char* end = nullptr;
    const double v = is_float ? std::strtod(token.c_str(), &end) : 0;
    if (is_float && end == token.c_str() + token.size())
      out += shortest_float(v);
    else
      out += token;
    i = j;
  }
  return out;
}

}  // namespace

std::string Config::dump_effective() const {
  std::ostringstream os;
  os << effective_;
  return shorten_floats(os.str());
}

std::string Config::dump() const {
  std::ostringstream os;
  os << root_;
  return os.str();
}

}  // namespace cocodiff
