// `cocodiff validate CONFIG [--set key=value ...] [--dump]`: checks a config without running it
// and prints the resolved settings; --dump prints the fully resolved config as TOML.

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "apps/commands.hpp"
#include "core/errors.hpp"
#include "emulator/engine.hpp"
#include "runner/memory_estimate.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

void add_degree_options(CLI::App* cmd, std::vector<std::string>& sets) {
  // Each option is also spelt as xDiT and diffusers spell it (--ulysses_degree,
  // --num_inference_steps), so their users' command lines work as they are.
  const auto int_option = [&](const std::string& names, const std::string& key,
                              const std::string& help) {
    return cmd->add_option_function<int>(
        names, [&sets, key](int n) { sets.push_back(key + "=" + std::to_string(n)); }, help);
  };
  int_option("--ulysses-degree,--ulysses_degree", "parallel.ulysses_degree",
             "Ulysses (all-to-all) degree; x --ring-degree = ranks (parallel.ulysses_degree)")
      ->check(CLI::PositiveNumber);
  int_option("--ring-degree,--ring_degree", "parallel.ring_degree",
             "Ring-attention degree over outer topology levels: above 1 runs usp (Ulysses x "
             "Ring) in place of the config's flat (parallel.ring_degree)")
      ->check(CLI::PositiveNumber);
  int_option("--cfg-degree,--cfg_degree", "parallel.cfg_degree",
             "CFG-parallel degree, 1 or 2: conditional and unconditional passes on two halves of "
             "the ranks (parallel.cfg_degree)")
      ->check(CLI::Range(1, 2));
  int_option("--batch-size,--batch_size", "run.batch_size",
             "Images per run, image i seeded with run.seed + i (run.batch_size)")
      ->check(CLI::PositiveNumber);
  int_option("--height", "run.height",
             "Image height in pixels (run.height; replaces the config's run.resolution)")
      ->check(CLI::PositiveNumber);
  int_option("--width", "run.width",
             "Image width in pixels (run.width; replaces the config's run.resolution)")
      ->check(CLI::PositiveNumber);
  int_option("--num-inference-steps,--num_inference_steps", "run.steps",
             "Denoising steps (run.steps)")
      ->check(CLI::PositiveNumber);
  cmd->add_option_function<std::uint64_t>(
      "--seed", [&sets](std::uint64_t n) { sets.push_back("run.seed=" + std::to_string(n)); },
      "Seed of the noise and of seeded inputs (run.seed)");
  cmd->add_flag_callback(
      "--use-cfg-parallel,--use_cfg_parallel", [&sets] { sets.push_back("parallel.cfg_degree=2"); },
      "xDiT's spelling of --cfg-degree 2 (parallel.cfg_degree = 2)");
  cmd->add_option_function<double>(
      "--guidance-scale,--guidance_scale",
      [&sets](double g) { sets.push_back("run.cfg_scale=" + std::to_string(g)); },
      "Classifier-free guidance scale (run.cfg_scale; 1 runs no unconditional pass). A "
      "guidance-distilled model (FLUX.1-dev) takes guidance as an input of its transformer: "
      "its time does not depend on it");
  int_option("--pipefusion-parallel-degree,--pipefusion_parallel_degree",
             "parallel.pipefusion_degree",
             "PipeFusion's pipeline stages: above 1 runs \"pipefusion\" in place of the config's "
             "flat, each stage a Ulysses group of the other ranks (parallel.pipefusion_degree)")
      ->check(CLI::PositiveNumber);
  int_option("--num-pipeline-patch,--num_pipeline_patch", "pipefusion.patches",
             "PipeFusion's patches of the image (pipefusion.patches; default: the degree)")
      ->check(CLI::PositiveNumber);
  int_option("--warmup-steps,--warmup_steps", "pipefusion.warmup_steps",
             "PipeFusion's first steps run whole and exact (pipefusion.warmup_steps; 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option_function<std::string>(
      "--prompt",
      [](const std::string&) {
        std::fprintf(stderr,
                     "cocodiff: note: --prompt is not encoded: there is no text encoder here. The "
                     "text stream is the model's text_tokens of seeded random embeddings (the "
                     "time depends on their count, not their words); the trained flux1-fmnist "
                     "model is conditioned on a class, run.class_label\n");
      },
      "Accepted for xDiT's command lines; a note says what text conditioning is here");
}

void add_validate_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> sets;
    bool dump = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("validate", "Check a run config and print what it resolves to");
  cmd->add_option("config", opt->config, "Run config (TOML)")->required();
  cmd->add_option("--set", opt->sets, "Override a config key: --set run.steps=4 (repeatable)");
  cmd->add_flag("--dump", opt->dump,
                "Print the fully resolved config instead: every key with its effective value "
                "(defaults and preset values included) as TOML that `run` accepts, the summary "
                "as comments");
  add_degree_options(cmd, opt->sets);
  cmd->callback([opt] {
    RunPlan plan = resolve_run_plan(opt->config, opt->sets);
    check_memory_limit(plan, estimate_memory(plan, "emulator"));  // what `run` would refuse
    emu::check_fiber_stack_limit(plan.ranks());
    check_weight_values(plan);
    if (!opt->dump) {
      std::cout << describe(plan) << opt->config << ": valid\n";
      return;
    }
    std::istringstream summary(describe(plan));
    for (std::string line; std::getline(summary, line);) std::cout << "# " << line << "\n";
    std::cout << "# " << opt->config << ": valid; every key below is resolved\n\n"
              << plan.cfg.dump_effective() << "\n";
  });
}

}  // namespace cocodiff::apps
