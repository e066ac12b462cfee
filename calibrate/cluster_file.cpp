#include "calibrate/cluster_file.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/errors.hpp"

namespace cocodiff::calibrate {

namespace {

// Every key of `over` into `base`: tables merged key by key, other values replaced.
void merge_into(toml::table& base, const toml::table& over) {
  for (const auto& [k, v] : over) {
    toml::node* mine = base.get(k.str());
    if (mine != nullptr && mine->is_table() && v.is_table())
      merge_into(*mine->as_table(), *v.as_table());
    else
      base.insert_or_assign(k.str(), v);
  }
}

}  // namespace

void set_key(toml::table& t, std::string_view key, const toml::node& value) {
  toml::table* at = &t;
  for (;;) {
    const size_t dot = key.find('.');
    if (dot == std::string_view::npos) break;
    const std::string part(key.substr(0, dot));
    toml::node* n = at->get(part);
    if (n == nullptr || !n->is_table()) {
      at->insert_or_assign(part, toml::table{});
      n = at->get(part);
    }
    at = n->as_table();
    key.remove_prefix(dot + 1);
  }
  at->insert_or_assign(std::string(key), value);
}

namespace {
// device.grid's and device.host.reference's directories made absolute against `dir` (the file
// that names them), so that the flattened table reads the same files wherever it is loaded from.
void absolute_grid(toml::table& cluster, const std::filesystem::path& dir) {
  const auto absolute = [&](toml::value<std::string>* d) {
    if (d == nullptr) return;
    const std::filesystem::path p(d->get());
    if (p.is_relative()) *d = std::filesystem::absolute(dir / p).lexically_normal().string();
  };
  if (toml::array* grid = cluster["device"]["grid"].as_array())
    for (toml::node& n : *grid) absolute(n.as_string());
  absolute(cluster["device"]["host"]["reference"].as_string());
}
}  // namespace

toml::table complete_cluster_table(const Config& cfg, const std::filesystem::path& preset_dir) {
  toml::table out;
  const toml::table* run = cfg.table()["cluster"].as_table();
  if (run == nullptr) throw ConfigError(cfg.source() + ": expected a [cluster] section");
  toml::table over = *run;
  if (const toml::node* p = run->get("preset"); p != nullptr) {
    const std::optional<std::string> name = p->value<std::string>();
    if (!name)
      throw ConfigError(cfg.where("cluster.preset"), "cluster.preset", "a string",
                        describe_node(*p));
    const std::filesystem::path file =
        resolve_cluster_preset(*name, cfg.directory(), preset_dir, cfg.where("cluster.preset"));
    out = Config::load(file).table();
    absolute_grid(out, file.parent_path());
    over.erase("preset");
  }
  absolute_grid(over, cfg.directory());
  merge_into(out, over);
  // The library preset's keys, under the cluster's own [library] keys.
  if (toml::table* lib = out["library"].as_table(); lib != nullptr && lib->contains("preset")) {
    const std::optional<std::string> name = (*lib)["preset"].value<std::string>();
    const std::filesystem::path file =
        preset_dir.parent_path() / "libraries" / (name.value_or("") + ".toml");
    std::error_code ec;
    if (!name || name->find('/') != std::string::npos || !std::filesystem::exists(file, ec))
      throw ConfigError(cfg.where("cluster.library.preset"), "cluster.library.preset",
                        "a library preset of " + file.parent_path().string(),
                        describe_node(*(*lib)["preset"].node()));
    toml::table merged = Config::load(file).table();
    merged.erase("description");
    merged.erase("source");
    if (!merged.contains("name")) merged.insert("name", *name);
    lib->erase("preset");
    merge_into(merged, *lib);
    *lib = std::move(merged);
  }
  return out;
}

Cluster load_cluster_table(const toml::table& t, const std::string& source,
                           const std::filesystem::path& preset_dir, int min_nodes) {
  toml::table root;
  root.insert("cluster", t);
  std::ostringstream os;
  os << root;
  Config cfg = Config::parse(os.str(), source);
  if (cfg.get_int("cluster.nodes", 1) < min_nodes)
    cfg.set("cluster.nodes=" + std::to_string(min_nodes));
  return load_cluster(cfg, preset_dir);
}

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_quoted(std::string_view k) {
  std::string out = "\"";
  for (const char c : k) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string key_text(std::string_view k) {
  const bool bare = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  return bare ? std::string(k) : toml_quoted(k);
}

// The shortest text that reads back as the same double, still a TOML float.
std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const toml::node& n) {
  if (const auto* v = n.as_string()) return toml_quoted(v->get());
  if (const auto* v = n.as_integer()) return std::to_string(v->get());
  if (const auto* v = n.as_floating_point()) return float_text(v->get());
  if (const auto* v = n.as_boolean()) return v->get() ? "true" : "false";
  if (const auto* a = n.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + value_text(*a->get(i));
    return out + "]";
  }
  std::ostringstream os;  // dates and times: as toml++ writes them
  n.visit([&](const auto& x) { os << x; });
  return os.str();
}

// Plain keys of t, then each sub-table under its own [path] header.
void emit(const toml::table& t, const std::string& path, std::ostringstream& os) {
  bool any = false;
  for (const auto& [k, v] : t) {
    if (v.is_table()) continue;
    if (!any && !path.empty()) os << "\n[" << path << "]\n";
    any = true;
    if (const auto* a = v.as_array(); a != nullptr && !a->empty() && a->get(0)->is_table())
      throw ConfigError("calibrate: key '" + path + (path.empty() ? "" : ".") +
                        std::string(k.str()) + "' holds tables, which a cluster file never does");
    os << key_text(k.str()) << " = " << value_text(v) << "\n";
  }
  if (t.empty() && !path.empty()) os << "\n[" << path << "]\n";
  for (const auto& [k, v] : t)
    if (const toml::table* sub = v.as_table(); sub != nullptr)
      emit(*sub, (path.empty() ? "" : path + ".") + key_text(k.str()), os);
}

}  // namespace

std::string cluster_file_text(const toml::table& t, const std::string& header) {
  std::ostringstream os;
  os << header;
  emit(t, "", os);
  return os.str();
}

}  // namespace cocodiff::calibrate
