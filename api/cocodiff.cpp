// The facade of include/cocodiff/: a RunSpec made into the config a file would hold, resolved
// by apps::resolve_run_plan, run by apps::run_emulated (or apps::run_on_mpi).
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cocodiff/cocodiff.hpp"
#include "core/config.hpp"
#include "runner/mpi_exec.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff {
namespace apps {
/// What a Plan is resolved from: a spec's table or a config file and its --set values, with
/// the program's strategies.
struct PlanSource {
  std::function<RunPlan()> resolve;
};
}  // namespace apps

namespace {

// The name errors give a spec's keys, where a file's would give file:line.
constexpr const char* kSpecSource = "cocodiff::RunSpec";

// The sub-table `name` of `t`, made when absent.
toml::table& section(toml::table& t, const char* name) {
  return *t.emplace<toml::table>(name).first->second.as_table();
}

toml::array int_array(const std::vector<int>& values) {
  toml::array a;
  for (const int v : values) a.push_back(static_cast<std::int64_t>(v));
  return a;
}

// The parallel layout's keys: [parallel], [ulysses], [pipeline], [v_major].
void parallel_tables(const RunSpec& spec, toml::table& root) {
  toml::table parallel;
  const auto degree = [&](const char* key, int value) {
    if (value != 0) parallel.insert_or_assign(key, static_cast<std::int64_t>(value));
  };
  degree("ulysses_degree", spec.ulysses_degree);
  degree("ring_degree", spec.ring_degree);
  degree("cfg_degree", spec.cfg_degree);
  degree("pipefusion_degree", spec.pipefusion_degree);
  if (spec.shard_text) parallel.insert_or_assign("shard_text", *spec.shard_text);
  if (!parallel.empty()) root.insert_or_assign("parallel", std::move(parallel));
  if (spec.uneven_heads)
    section(root, "ulysses").insert_or_assign("uneven_heads", *spec.uneven_heads);
  if (spec.pipeline_chunks != 0)
    section(root, "pipeline")
        .insert_or_assign("chunks", static_cast<std::int64_t>(spec.pipeline_chunks));
  if (spec.v_major_threshold)
    section(root, "v_major").insert_or_assign("threshold", *spec.v_major_threshold);
}

// The keys a config file of this run would set; a field left at zero / empty sets none.
toml::table spec_table(const RunSpec& spec) {
  toml::table root;
  if (!spec.model.empty()) section(root, "model").insert_or_assign("preset", spec.model);
  toml::table& cluster = section(root, "cluster");
  if (!spec.cluster.empty()) cluster.insert_or_assign("preset", spec.cluster);
  if (spec.nodes != 0) cluster.insert_or_assign("nodes", static_cast<std::int64_t>(spec.nodes));
  if (!spec.topology_sizes.empty())
    section(cluster, "topology").insert_or_assign("sizes", int_array(spec.topology_sizes));
  if (!spec.rank_nic.empty())
    section(cluster, "nic").insert_or_assign("rank_nic", int_array(spec.rank_nic));
  if (cluster.empty()) root.erase("cluster");

  toml::table& run = section(root, "run");
  if (spec.resolution != 0)
    run.insert_or_assign("resolution", static_cast<std::int64_t>(spec.resolution));
  if (spec.height != 0) run.insert_or_assign("height", static_cast<std::int64_t>(spec.height));
  if (spec.width != 0) run.insert_or_assign("width", static_cast<std::int64_t>(spec.width));
  if (spec.frames != 0) run.insert_or_assign("frames", static_cast<std::int64_t>(spec.frames));
  if (spec.steps != 0) run.insert_or_assign("steps", static_cast<std::int64_t>(spec.steps));
  // A seed above INT64_MAX stays out of range once signed, as the file's would: the resolver
  // names it.
  run.insert_or_assign("seed", static_cast<std::int64_t>(spec.seed));
  run.insert_or_assign("math", spec.math == Math::kSkip ? "skip" : "real");
  if (!spec.strategy.empty()) run.insert_or_assign("strategy", spec.strategy);
  if (spec.cfg_scale) run.insert_or_assign("cfg_scale", *spec.cfg_scale);
  if (spec.class_label >= 0)
    run.insert_or_assign("class_label", static_cast<std::int64_t>(spec.class_label));
  if (spec.batch_size != 0)
    run.insert_or_assign("batch_size", static_cast<std::int64_t>(spec.batch_size));
  if (!spec.weights.empty()) run.insert_or_assign("weights", spec.weights);
  parallel_tables(spec, root);

  toml::table& emulator = section(root, "emulator");
  if (spec.workers != 0)
    emulator.insert_or_assign("workers", static_cast<std::int64_t>(spec.workers));
  if (spec.trace) emulator.insert_or_assign("trace", *spec.trace);
  if (!spec.all_to_all.empty()) emulator.insert_or_assign("all_to_all", spec.all_to_all);
  if (spec.replay) emulator.insert_or_assign("replay", *spec.replay);
  if (emulator.empty()) root.erase("emulator");
  return root;
}

}  // namespace

int Plan::ranks() const { return plan_->ranks(); }

std::int64_t Plan::tokens() const { return plan_->tokens(); }

std::string Plan::describe() const { return apps::describe(*plan_); }

std::string Plan::effective_config() const { return plan_->cfg.dump_effective(); }

Plan::Plan(std::shared_ptr<const apps::PlanSource> source)
    : source_(std::move(source)),
      plan_(std::make_shared<const apps::RunPlan>(source_->resolve())) {}

apps::RunPlan Plan::resolve_again() const { return source_->resolve(); }

Plan make_plan(const RunSpec& spec, const Extensions* extensions) {
  auto source = std::make_shared<apps::PlanSource>();
  source->resolve = [table = spec_table(spec), sets = spec.sets,
                     strategies = extensions != nullptr ? extensions->strategies() : nullptr] {
    Config cfg = Config::from_table(table, kSpecSource);
    for (const std::string& s : sets) cfg.set(s);
    return apps::resolve_run_plan(std::move(cfg), strategies);
  };
  return Plan(std::move(source));
}

Plan load_plan(const std::filesystem::path& config_file, const std::vector<std::string>& sets,
               const Extensions* extensions) {
  auto source = std::make_shared<apps::PlanSource>();
  source->resolve = [config_file, sets,
                     strategies = extensions != nullptr ? extensions->strategies() : nullptr] {
    return apps::resolve_run_plan(config_file, sets, strategies);
  };
  return Plan(std::move(source));
}

RunResult run(const Plan& plan) {
  auto record = std::make_shared<apps::RunRecord>(apps::run_emulated(plan.resolved()));
  const nlohmann::ordered_json& report = record->report;
  RunResult r;
  r.strategy = report.at("strategy").get<std::string>();
  r.ranks = plan.ranks();
  r.virtual_time_s = report.at("virtual_time_s").get<double>();
  r.wall_time_s = report.at("wall_time_s").get<double>();
  for (const auto& [tier, bytes] : report.at("bytes_by_tier").items())
    r.bytes_by_tier.push_back({tier, bytes.get<std::int64_t>()});
  if (const nlohmann::ordered_json& out = report.at("output_sha256"); out.is_string())
    r.output_sha256 = out.get<std::string>();
  r.timeline_sha256 = report.at("timeline_sha256").get<std::string>();
  const std::span<const float> latent = record->latent.data();
  r.latent.assign(latent.begin(), latent.end());
  r.latent_channels = static_cast<int>(record->latent.rows());
  r.latent_frames = record->latent_frames;
  r.latent_height = record->latent_height;
  r.latent_width = record->latent_width;
  r.report_json = report.dump(2);
  r.record = std::move(record);
  return r;
}

std::filesystem::path write_outputs(const Plan& plan, const RunResult& result,
                                    const std::filesystem::path& out_dir, bool force) {
  if (result.record == nullptr)
    throw UserError(
        "cocodiff::write_outputs: the RunResult holds no run record (it was not "
        "returned by cocodiff::run)");
  apps::write_outputs(plan.resolved(), *result.record, out_dir, force);
  std::error_code ec;
  const std::filesystem::path image = out_dir / "image.png";
  return std::filesystem::is_regular_file(image, ec) ? image : std::filesystem::path();
}

int run_mpi(const Plan& plan, const std::filesystem::path& out_dir, bool force) {
  apps::MpiRunOptions opt;
  opt.out = out_dir.string();
  opt.force = force;
  opt.quiet = true;
  return apps::run_on_mpi([&] { return plan.resolve_again(); }, opt);
}

Extensions::Extensions() : strategies_(std::make_shared<dit::StrategyRegistry>()) {}

void Extensions::add_strategy(const std::string& name, StrategyFactory factory, bool lossy,
                              StrategyMemory memory) {
  strategies_->add(name, std::move(factory), lossy, std::move(memory));
}

void Extensions::add_strategy(const std::string& name, StrategyEntry entry) {
  strategies_->add(name, std::move(entry));
}

void Extensions::add_search(const std::string& name, StrategySearch search) {
  strategies_->add_search(name, std::move(search));
}

AlgorithmId register_all_to_all(const std::string& name, const std::string& summary,
                                ScheduleFactory make, const std::string& fallback,
                                bool equal_counts_only) {
  emu::collectives::Algorithm a;
  a.kind = emu::collectives::CollectiveKind::kAllToAll;
  a.name = name;
  a.summary = summary;
  a.make = std::move(make);
  a.fallback = fallback;
  a.equal_counts_only = equal_counts_only;
  return emu::collectives::register_algorithm(std::move(a));
}

void register_model_family(ModelFamily f) { dit::register_model_family(std::move(f)); }

}  // namespace cocodiff
