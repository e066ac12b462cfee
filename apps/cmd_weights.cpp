// `cocodiff weights MODEL [--check FILE]`: the tensors a model's checkpoint must hold (name,
// shape, dtype), and with --check, every missing, mis-shaped and extra tensor of a checkpoint
// (a .safetensors file or a sharded *.safetensors.index.json) at once. MODEL is a model preset
// name (flux1-tiny, flux1-dev, ...) or a run config whose [model] section names one.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/errors.hpp"
#include "dit/model.hpp"
#include "dit/model_config.hpp"
#include "dit/safetensors.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

struct WeightsOptions {
  std::string model;
  std::string check;
};

dit::ModelConfig model_of(const std::string& name_or_config) {
  const std::filesystem::path p(name_or_config);
  if (p.extension() == ".toml") {
    Config cfg = Config::load(p);
    return dit::load_model_config(cfg, config_dir() / "models");
  }
  return dit::load_model_preset(name_or_config, config_dir() / "models");
}

void run_weights(const WeightsOptions& o) {
  const dit::ModelConfig mc = model_of(o.model);
  const std::vector<dit::TensorSpec> specs = dit::make_model(mc)->tensor_specs();
  if (o.check.empty()) {
    std::int64_t params = 0;
    std::printf("# %s: %zu tensors; dtype F32, F16 or BF16 (each is read as fp32)\n",
                mc.name.c_str(), specs.size());
    std::printf("# %-58s %-20s %s\n", "name", "shape", "dtype");
    for (const dit::TensorSpec& s : specs) {
      std::printf("  %-58s %-20s %s\n", s.name.c_str(), s.shape_str().c_str(), "F32|F16|BF16");
      params += s.numel();
    }
    std::printf("# %lld parameters\n", static_cast<long long>(params));
    return;
  }
  const dit::SafetensorsCheckpoint ckpt(o.check);
  const dit::CheckpointCheck c = dit::check_checkpoint(ckpt, specs);
  std::fputs(c.describe().c_str(), stdout);
  // The values too, one tensor at a time, as `run` reads them: a NaN or an infinity (or data
  // that cannot be read) fails here rather than at the start of a run.
  std::vector<std::string> bad_values;
  for (const dit::TensorSpec& s : specs) {
    const dit::SafetensorsEntry* e = ckpt.find(s.name);
    if (e == nullptr || e->shape != s.shape) continue;
    try {
      (void)ckpt.read(s.name);
    } catch (const InputError& err) {
      bad_values.emplace_back(err.what());
      std::printf("bad values: %s\n", err.what());
    }
  }
  std::printf(
      "%s against %s: %zu expected, %zu missing, %zu mis-shaped, %zu with bad values, %zu "
      "extra\n",
      o.check.c_str(), mc.name.c_str(), specs.size(), c.missing.size(), c.wrong_shape.size(),
      bad_values.size(), c.extra.size());
  std::fflush(stdout);
  if (!c.ok() || !bad_values.empty())
    throw InputError(o.check + ": " + std::to_string(c.missing.size()) + " missing, " +
                     std::to_string(c.wrong_shape.size()) + " mis-shaped and " +
                     std::to_string(bad_values.size()) +
                     " tensor(s) with values that are not finite or not readable, listed above");
}

}  // namespace

void add_weights_command(CLI::App& app) {
  auto o = std::make_shared<WeightsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "weights", "List the tensors a model's checkpoint holds, or check a checkpoint against them");
  cmd->add_option("model", o->model, "model preset name (flux1-tiny, ...) or a run config")
      ->required();
  CLI::Option* check =
      cmd->add_option("--check", o->check,
                      "checkpoint to check: a .safetensors file or a *.safetensors.index.json");
  cmd->callback([o, check] {
    if (check->count() > 0 && o->check.empty())
      throw ConfigError("--check: expected a checkpoint file, found an empty name");
    run_weights(*o);
  });
}

}  // namespace cocodiff::apps
