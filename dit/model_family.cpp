#include "dit/model_family.hpp"

#include <deque>
#include <mutex>

#include "core/errors.hpp"

namespace cocodiff::dit {

// The built-in families, each defined in its file of dit/models/: a new family is its file, its
// line in each of these two lists and its preset (configs/models/).
ModelFamily dit_family();
ModelFamily sd3_family();
ModelFamily flux_family();
ModelFamily flux2_family();
ModelFamily qwen_image_family();
ModelFamily wan_family();

namespace {

struct Registry {
  std::mutex mu;
  std::deque<ModelFamily> list;  // deque: references stay valid as families are added
};

const ModelFamily* find_locked(const Registry& r, std::string_view name) {
  for (const ModelFamily& f : r.list)
    if (f.name == name) return &f;
  return nullptr;
}

void add_locked(Registry& r, ModelFamily f) {
  if (f.name.empty() || !f.make)
    throw ConfigError("model family \"" + f.name + "\": needs a name and a make function");
  if (find_locked(r, f.name) != nullptr)
    throw ConfigError("model family \"" + f.name + "\" is registered already");
  r.list.push_back(std::move(f));
}

/// The registry, holding the built-ins from its first use on.
Registry& registry() {
  static Registry r;
  static const bool ready = [] {
    std::lock_guard<std::mutex> lock(r.mu);
    for (ModelFamily (*builtin)() :
         {dit_family, sd3_family, flux_family, flux2_family, qwen_image_family, wan_family})
      add_locked(r, builtin());
    return true;
  }();
  (void)ready;
  return r;
}

}  // namespace

std::optional<ModelConfigProblem> rope_axes_problem(const ModelConfig& m, std::size_t axes,
                                                    std::string_view names) {
  if (m.rope_axes.size() == axes) return std::nullopt;
  return ModelConfigProblem{"rope_axes",
                            std::to_string(axes) + " RoPE axis widths (" + std::string(names) +
                                ") for family " + m.family,
                            std::to_string(m.rope_axes.size()) + " axes"};
}

void register_model_family(ModelFamily f) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  add_locked(r, std::move(f));
}

const ModelFamily* find_model_family(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return find_locked(r, name);
}

const ModelFamily& model_family(std::string_view name) {
  if (const ModelFamily* f = find_model_family(name)) return *f;
  std::string list;
  for (const std::string& n : model_family_names()) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError("model.family: no family is called \"" + std::string(name) +
                    "\" (registered: " + list + ")");
}

std::vector<std::string> model_family_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const ModelFamily& f : r.list) out.push_back(f.name);
  return out;
}

}  // namespace cocodiff::dit
