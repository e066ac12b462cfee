// `cocodiff compare CONFIG --strategies flat,tapa,v_first,cocodiff [--set k=v ...] [--out DIR]`
// Runs one config under several attention strategies on the emulator and prints one table:
// virtual time, speedup over flat, exposed communication, bytes per tier and (real math only)
// quality against the exact run (flat; made on demand when not in the list). compare.json holds
// one entry per strategy: the report.json fields plus speedup_vs_flat and quality. Entries that
// run V-Major show the V bytes it saved and the fraction of blocks it sent; notes under the table
// say when a lossy V-Major saved nothing and when an entry loses to one running only some of its
// mechanisms. Progress goes
// to stderr one whole line at a time: "[strategy] step i/N" as each entry starts a step, then
// "[k/n] strategy done in ..." as it ends.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/commands.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "dit/image.hpp"
#include "dit/parallel/strategies.hpp"
#include "runner/compare.hpp"
#include "runner/memory_estimate.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// What V-Major did in one entry, summed over its tiers: bytes of V it did not send (negative when
// the block masks cost more than the blocks it left out) and the fraction of blocks it sent.
struct VMajorSum {
  bool present = false;
  double saved_bytes = 0, full_bytes = 0;
  double blocks = 0, active_blocks = 0;
};

VMajorSum v_major_sum(const nlohmann::ordered_json& report) {
  VMajorSum v;
  if (!report.contains("strategy_stats") || !report["strategy_stats"].contains("v_major")) return v;
  v.present = true;
  for (const auto& [tier, t] : report["strategy_stats"]["v_major"]["tiers"].items()) {
    v.saved_bytes += t["bytes_saved"].get<double>();
    v.full_bytes += t["v_full_bytes"].get<double>();
    v.blocks += t["blocks"].get<double>();
    v.active_blocks += t["active_block_fraction"].get<double>() * t["blocks"].get<double>();
  }
  return v;
}

// Notes under the table: a lossy V-Major that saved nothing, and an entry slower than another
// entry that runs only some of its mechanisms (cocodiff against tapa alone, say).
std::string compare_notes(const std::vector<std::string>& order,
                          const std::vector<std::string>& strategy,
                          const std::vector<std::string>& technique,
                          const std::vector<nlohmann::ordered_json>& reports,
                          const std::vector<RunPlan>& plans) {
  std::ostringstream notes;
  for (size_t i = 0; i < order.size(); ++i) {
    const VMajorSum v = v_major_sum(reports[i]);
    const dit::StrategyOptions& so = plans[i].settings.strategy_options;
    const double threshold = so.v_major_threshold;
    if (!v.present || threshold <= 0) continue;
    const double active = v.blocks > 0 ? 100 * v.active_blocks / v.blocks : 0.0;
    const int steps = plans[i].settings.steps;
    if (so.v_major_warmup_steps >= steps) {
      // No step after the warm-up: V went in full everywhere, whatever the threshold.
      notes << "note: " << order[i]
            << ": V-Major's warm-up (v_major.warmup_steps = " << so.v_major_warmup_steps
            << ") covers all " << steps
            << " steps, which send V in full: run more steps than the warm-up to see what "
               "v_major.threshold = "
            << threshold << " selects\n";
      continue;
    }
    if (v.saved_bytes <= 0)
      notes << "note: " << order[i] << ": V-Major at v_major.threshold = " << threshold
            << " saved nothing: it sent " << human_bytes(static_cast<std::int64_t>(-v.saved_bytes))
            << " more than V in full (block masks; " << fmt("%.1f", active)
            << "% of blocks active): raise v_major.threshold, or leave v_major out\n";
    // Lossy for little: quality lost where the bytes saved were a small share of V.
    const nlohmann::ordered_json* q =
        reports[i].contains("quality") ? &reports[i]["quality"] : nullptr;
    // (An entry with a technique loses quality to it too: not V-Major's to answer for.)
    if (q != nullptr && q->is_object() && q->contains("preview_psnr_db") &&
        (*q)["preview_psnr_db"].is_number() && v.full_bytes > 0 && technique[i].empty()) {
      const double psnr = (*q)["preview_psnr_db"].get<double>();
      const double saved = v.saved_bytes / v.full_bytes;
      if (psnr < 35)
        notes << "note: " << order[i] << ": V-Major at v_major.threshold = " << threshold
              << " is lossy: it left out " << fmt("%.1f", 100 * std::max(0.0, saved))
              << "% of V's bytes on its tiers and the preview fell to " << fmt("%.1f", psnr)
              << " dB PSNR against the exact run; what it saves in time is this entry against "
                 "the same strategy at v_major.threshold = 0 (compare again with --set "
                 "v_major.threshold=0), and a lower threshold keeps more quality\n";
    }
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<std::string> fi = dit::attention_strategy_features(strategy[i]);
    for (size_t j = 0; j < order.size(); ++j) {
      if (i == j || technique[i] != technique[j]) continue;
      const std::vector<std::string> fj = dit::attention_strategy_features(strategy[j]);
      // j runs a strict subset of i's mechanisms, on the same exchange.
      const bool subset = !fi.empty() && !fj.empty() && fj.size() < fi.size() &&
                          fi.front() == fj.front() &&
                          std::all_of(fj.begin(), fj.end(), [&](const std::string& f) {
                            return std::find(fi.begin(), fi.end(), f) != fi.end();
                          });
      const double ti = reports[i]["virtual_time_s"].get<double>();
      const double tj = reports[j]["virtual_time_s"].get<double>();
      if (subset && ti > tj) {
        std::string missing;
        for (const std::string& f : fi)
          if (std::find(fj.begin(), fj.end(), f) == fj.end())
            missing += (missing.empty() ? "" : " + ") + f;
        notes << "note: " << order[i] << " (" << fmt("%.6f", ti) << " s) is slower than "
              << order[j] << " alone (" << fmt("%.6f", tj) << " s): " << missing
              << " cost more than they save here\n";
      }
    }
  }
  return notes.str();
}

// --lossy: the fastest listed entry whose preview keeps `db` dB PSNR against the exact run
// (exact entries keep any), printed and as compare.json's "lossy".
nlohmann::ordered_json fastest_within(const nlohmann::ordered_json& entries,
                                      const std::vector<std::string>& order, double db) {
  size_t best = entries.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i]["reference_only"].get<bool>()) continue;
    const nlohmann::ordered_json& q = entries[i]["quality"];
    const bool keeps = q["preview_psnr_db"].is_string() || q["preview_psnr_db"].get<double>() >= db;
    if (keeps && (best == entries.size() || entries[i]["virtual_time_s"].get<double>() <
                                                entries[best]["virtual_time_s"].get<double>()))
      best = i;
  }
  nlohmann::ordered_json l = {{"psnr_db", db}, {"fastest", nullptr}};
  if (best < entries.size()) {
    l["fastest"] = order[best];
    std::cout << "fastest with a preview of at least " << fmt("%.1f", db)
              << " dB PSNR: " << order[best] << " ("
              << fmt("%.6f", entries[best]["virtual_time_s"].get<double>()) << " s, "
              << fmt("%.3f", entries[best]["speedup_vs_flat"].get<double>()) << "x flat)\n";
  } else {
    std::cout << "no entry keeps a preview of " << fmt("%.1f", db) << " dB PSNR\n";
  }
  return l;
}

/// Which optional columns the compare table has.
struct TableColumns {
  bool host = false;     // the host's wait, where a device has one
  bool v_major = false;  // V-Major's saving, where an entry runs it
  bool real = false;     // quality, with real math
};

/// The optional columns that the runs `recs` of `plans` call for.
TableColumns table_columns(const std::vector<RunRecord>& recs, const std::vector<RunPlan>& plans) {
  TableColumns c;
  for (const RunRecord& rec : recs)
    c.host = c.host || rec.report["breakdown"].value("host_wait_s", 0.0) > 0;
  for (const RunRecord& rec : recs) c.v_major = c.v_major || v_major_sum(rec.report).present;
  c.real = plans[0].math == "real";
  return c;
}

/// The compare table's header line.
std::string table_header(const TableColumns& cols, const Topology& topo) {
  std::ostringstream tab;
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %12s %8s %12s %6s", "strategy", "virtual_s", "speedup",
                "exposed_s", "exp%");
  tab << line;
  // The host's column when a device has one: the critical tile waiting for its host.
  if (cols.host) {
    std::snprintf(line, sizeof line, " %12s %6s", "host_wait_s", "host%");
    tab << line;
  }
  for (int k = 0; k < topo.num_tiers(); ++k) {
    std::snprintf(line, sizeof line, " %12s", (topo.tier_name(k) + "_GB").c_str());
    tab << line;
  }
  // V-Major's columns when an entry runs it: V bytes saved (negative: sent more) and the
  // fraction of V blocks sent.
  if (cols.v_major) {
    std::snprintf(line, sizeof line, " %11s %7s", "V_saved_GB", "active");
    tab << line;
  }
  if (cols.real) {
    std::snprintf(line, sizeof line, " %11s %9s %7s", "rel_l2", "psnr_db", "ssim");
    tab << line;
  }
  tab << "\n";
  return tab.str();
}

/// Entry i's compare.json record: its report, its speedup over flat, quality and names.
nlohmann::ordered_json entry_record(const std::vector<RunRecord>& recs, size_t i, bool listed,
                                    const std::string& name, const std::string& technique) {
  const double flat_s = recs[0].report["virtual_time_s"].get<double>();
  nlohmann::ordered_json e = recs[i].report;
  const double vt = e["virtual_time_s"].get<double>();
  e["speedup_vs_flat"] = vt > 0 ? flat_s / vt : 0.0;
  e["quality"] = quality_json(recs[0], recs[i], "flat (exact)");
  e["reference_only"] = !listed;
  e["entry"] = name;
  e["technique"] =
      technique.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(technique);
  return e;
}

/// One row of the compare table, from entry `name`'s compare.json record `e`.
std::string table_row(nlohmann::ordered_json& e, const std::string& name, const TableColumns& cols,
                      const Topology& topo) {
  std::ostringstream tab;
  char line[512];
  const nlohmann::ordered_json& b = e["breakdown"];
  std::snprintf(line, sizeof line, "%-24s %12.6f %8.3f %12.6f %5.1f%%", name.c_str(),
                e["virtual_time_s"].get<double>(), e["speedup_vs_flat"].get<double>(),
                b["exposed_comm_s"].get<double>(), 100 * b["exposed_comm_fraction"].get<double>());
  tab << line;
  if (cols.host) {
    std::snprintf(line, sizeof line, " %12.6f %5.1f%%", b.value("host_wait_s", 0.0),
                  100 * b.value("host_wait_fraction", 0.0));
    tab << line;
  }
  for (int k = 0; k < topo.num_tiers(); ++k) {
    std::snprintf(line, sizeof line, " %12.4f",
                  e["bytes_by_tier"][topo.tier_name(k)].get<double>() / 1e9);
    tab << line;
  }
  if (cols.v_major) {
    const VMajorSum v = v_major_sum(e);
    if (v.present)
      std::snprintf(line, sizeof line, " %11.4f %6.1f%%",
                    std::abs(v.saved_bytes) < 5e4 ? 0.0 : v.saved_bytes / 1e9,  // no -0.0000
                    v.blocks > 0 ? 100 * v.active_blocks / v.blocks : 0.0);
    else
      std::snprintf(line, sizeof line, " %11s %7s", "-", "-");
    tab << line;
  }
  if (cols.real) {
    const nlohmann::ordered_json& q = e["quality"];
    const std::string psnr = q["preview_psnr_db"].is_string()
                                 ? std::string("inf")
                                 : fmt("%.2f", q["preview_psnr_db"].get<double>());
    std::snprintf(line, sizeof line, " %11.3e %9s %7.4f", q["latent_relative_l2"].get<double>(),
                  psnr.c_str(), q["preview_ssim"].get<double>());
    tab << line;
  }
  tab << "\n";
  return tab.str();
}

// The compare table, one row an entry (virtual time, speedup over flat, exposed communication,
// the host's wait where a device has one, bytes per tier, V-Major's saving where an entry runs
// it, quality with real math), and each entry's compare.json record appended to `entries`.
std::string entries_table(const std::vector<RunRecord>& recs, const std::vector<RunPlan>& plans,
                          const std::vector<std::string>& names,
                          const std::vector<std::string>& order,
                          const std::vector<std::string>& technique,
                          nlohmann::ordered_json& entries) {
  const Topology& topo = plans[0].cluster.topology;
  const TableColumns cols = table_columns(recs, plans);
  std::string tab = table_header(cols, topo);
  for (size_t i = 0; i < recs.size(); ++i) {
    const bool listed =
        !technique[i].empty() || std::find(names.begin(), names.end(), order[i]) != names.end();
    nlohmann::ordered_json e = entry_record(recs, i, listed, order[i], technique[i]);
    tab += table_row(e, order[i], cols, topo);
    entries.push_back(std::move(e));
  }
  return tab;
}

/// `cocodiff compare`'s options, as the command line gives them.
struct CompareOptions {
  std::string config;
  std::string strategies = "flat,tapa,v_first,pipeline,cocodiff";
  std::vector<std::string> sets;
  std::string out = "out/compare";
  bool outputs = false;
  bool force = false;
  std::string techniques;
  double lossy_db = -1;
};

/// The names of --strategies, refused when it names none.
std::vector<std::string> strategy_names(const std::string& strategies) {
  std::vector<std::string> names;
  std::stringstream ss(strategies);
  for (std::string n; std::getline(ss, n, ',');)
    if (!n.empty()) names.push_back(n);
  if (names.empty()) throw ConfigError("--strategies: expected at least one strategy name");
  return names;
}

/// Every entry's plan, resolved before anything runs: a bad config fails at once.
std::vector<RunPlan> resolve_plans(const CompareOptions& o, const CompareEntries& en) {
  std::vector<RunPlan> plans;
  for (size_t i = 0; i < en.order.size(); ++i) {
    std::vector<std::string> sets = {"emulator.trace=" + std::string(o.outputs ? "true" : "false")};
    sets.insert(sets.end(), o.sets.begin(), o.sets.end());
    sets.push_back("run.strategy=" + en.strategy[i]);
    sets.insert(sets.end(), en.extra[i].begin(), en.extra[i].end());
    plans.push_back(resolve_run_plan(o.config, sets));
    // Each entry shows its steps, one whole line each: entries run side by side, and a pipe
    // or a log file must get lines, not one line rewritten with \r.
    plans.back().progress = true;
    plans.back().progress_lines = true;
    plans.back().progress_label = "[" + en.order[i] + "] ";
  }
  return plans;
}

/// Prints the table and the notes under it; returns the entries' compare.json records.
nlohmann::ordered_json print_results(const std::vector<RunRecord>& recs,
                                     const std::vector<RunPlan>& plans,
                                     const std::vector<std::string>& names,
                                     const CompareEntries& en) {
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  const std::string tab = entries_table(recs, plans, names, en.order, en.technique, entries);
  const bool real = plans[0].math == "real";
  std::cout << tab;
  if (!real) std::cout << "(phantom math: no quality columns; outputs have no values)\n";
  std::vector<nlohmann::ordered_json> reports;
  reports.reserve(recs.size());
  for (const nlohmann::ordered_json& e : entries) reports.push_back(e);  // with quality
  std::cout << compare_notes(en.order, en.strategy, en.technique, reports, plans);
  return entries;
}

/// Writes OUT: compare.json and (--outputs) every strategy's run outputs, as one output set.
void write_output_set(const CompareOptions& o, const std::vector<RunPlan>& plans,
                      const std::vector<RunRecord>& recs, const std::vector<std::string>& order,
                      const nlohmann::ordered_json& doc) {
  // OUT is one output set: compare.json and (--outputs) every strategy's OUT/STRATEGY/ are
  // staged together and moved into place in one step, so a full disk or a kill leaves the
  // previous set whole or the new one, never strategies of two runs side by side.
  try {
    auto lock = hold_interrupts();
    OutputSet set(o.out, o.force);
    if (o.outputs)
      for (size_t i = 0; i < plans.size(); ++i)
        write_outputs(plans[i], recs[i], set.dir() / order[i]);
    write_file_atomic(set.dir() / "compare.json", doc.dump(2) + "\n");
    output_test_point();
    set.commit();
  } catch (const InputError& e) {
    throw InputError(o.out + ": the new output set could not be written, the previous one " +
                     "(if any) is unchanged: " + e.what());
  }
}

/// `cocodiff compare`: every entry resolved, run side by side, printed and written.
void run_compare(const CompareOptions& o) {
  const std::vector<std::string> names = strategy_names(o.strategies);
  check_output_target(o.out, o.force);  // before any strategy runs
  for (const std::string& n : names)
    if (const std::string e = dit::attention_strategy_error(n); !e.empty())
      throw ConfigError("--strategies: " + e);
  const CompareEntries en = compare_entries(names, o.techniques);
  std::vector<RunPlan> plans = resolve_plans(o, en);
  if (o.lossy_db >= 0 && plans[0].math != "real")
    throw ConfigError(
        "--lossy: quality needs real math (run.math = \"real\"); this config "
        "runs phantom");
  std::cout << describe(plans[0], "emulator", en.order) << std::flush;
  std::vector<RunRecord> recs = run_plans_side_by_side(plans, en.order);
  const nlohmann::ordered_json entries = print_results(recs, plans, names, en);
  nlohmann::ordered_json doc;
  doc["config"] = o.config;
  doc["sets"] = o.sets;
  doc["reference"] = dit::kDefaultStrategy;
  doc["techniques"] = o.techniques;
  if (o.lossy_db >= 0) doc["lossy"] = fastest_within(entries, en.order, o.lossy_db);
  doc["entries"] = entries;
  write_output_set(o, plans, recs, en.order, doc);
  std::cout << "compare.json in " << o.out << "/\n";
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto opt = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Run one config under several attention strategies and compare them");
  cmd->add_option("config", opt->config, "Run config (TOML)")->required();
  cmd->add_option("--strategies", opt->strategies,
                  "Comma-separated strategies (flat is run as the reference when absent)");
  cmd->add_option("--set", opt->sets, "Override a config key: --set run.steps=4 (repeatable)");
  cmd->add_option("--out", opt->out,
                  "Output directory (compare.json), replaced as a whole by the new set");
  cmd->add_flag("--force", opt->force,
                "Replace --out even when it is not an earlier output set of cocodiff");
  cmd->add_option("--techniques", opt->techniques,
                  "Also run each strategy with each of these data-dependent accelerations, "
                  "comma-separated: fp8, residual (compressed exchanges), teacache[=T], "
                  "first_block[=T] (step caching); entries STRATEGY+TECHNIQUE");
  cmd->add_option("--lossy", opt->lossy_db,
                  "Name the fastest entry whose preview keeps at least this PSNR (dB) against "
                  "the exact run (real math)");
  cmd->add_flag("--outputs", opt->outputs,
                "Also write each strategy's run outputs (report.json, image.png, trace.json) to "
                "OUT/STRATEGY/ (OUT is replaced as one set)");
  cmd->callback([opt] { run_compare(*opt); });
}

}  // namespace cocodiff::apps
