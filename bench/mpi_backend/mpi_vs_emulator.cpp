// The same run on both backends: flux1-tiny (random weights, real math) on P ranks of one
// Aurora node, under `mpirun -np P cocodiff run --backend mpi` and on the emulator, repeated and
// reduced to medians. Prints wall times (the mpirun process, MPI's sampling phase, the emulator
// run), the emulator's virtual time, and checks that both backends report the same output_sha256.
// Writes <out>/mpi_vs_emulator.{csv,json,png}.
//
//   mpi_vs_emulator [--out DIR] [--smoke] [--workers W] [--ranks 2,4,8] [--repeats 3]
//                   [--steps S] [--strategy flat]
//
// P ranks are laid out as 2 tiles x P/2 GPUs on one node (P = 2, 4, 8, ... up to 12). On a
// machine with fewer cores than ranks mpirun oversubscribes, and MPI's busy-polling ranks
// compete for the cores: that is part of what the table measures.

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "bench/common/bench_util.hpp"

namespace cocodiff::bench {
namespace {

struct Options {
  std::vector<int> ranks = {2, 4, 8};
  int repeats = 3;
  int steps = 0;  // 0: the config's own
  std::string strategy = "flat";
  std::string mpiexec;
};

Options parse(const Args& a) {
  Options o;
#ifdef COCODIFF_MPIEXEC
  o.mpiexec = COCODIFF_MPIEXEC;
#endif
  if (a.smoke) {
    o.ranks = {2};
    o.repeats = 1;
    o.steps = 1;
  }
  for (size_t i = 0; i < a.rest.size(); ++i) {
    const std::string& k = a.rest[i];
    if (i + 1 >= a.rest.size()) throw std::runtime_error("missing value after " + k);
    const std::string v = a.rest[++i];
    if (k == "--ranks") {
      o.ranks = int_list(v);
    } else if (k == "--repeats") {
      o.repeats = std::stoi(v);
    } else if (k == "--steps") {
      o.steps = std::stoi(v);
    } else if (k == "--strategy") {
      o.strategy = v;
    } else if (k == "--mpiexec") {
      o.mpiexec = v;
    } else {
      throw std::runtime_error("unknown option " + k);
    }
  }
  for (int p : o.ranks)
    if (p < 2 || p % 2 != 0 || p > 12)
      throw std::runtime_error("--ranks: " + std::to_string(p) +
                               " is not an even count from 2 to 12 (2 tiles x P/2 GPUs)");
  if (o.repeats < 1) throw std::runtime_error("--repeats must be at least 1");
  if (o.mpiexec.empty()) throw std::runtime_error("no mpiexec known: pass --mpiexec PATH");
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[noreturn]] void fail(const ChildRun& r, const std::string& what) {
  std::fprintf(stderr, "%s failed (exit %d): %s\n", what.c_str(), r.exit_code, r.error.c_str());
  std::exit(1);
}

// The --set overrides that cut one Aurora node down to p ranks (2 tiles x p/2 GPUs).
std::vector<std::string> layout_sets(const Options& o, int p) {
  std::string nics = "[";
  for (int r = 0; r < p; ++r) nics += (r ? "," : "") + std::to_string(r);
  nics += "]";
  std::vector<std::string> sets = {
      "--set", "cluster.nodes=1",
      "--set", "cluster.topology.sizes=[2," + std::to_string(p / 2) + "]",
      "--set", "cluster.nic.rank_nic=" + nics,
      "--set", "run.strategy=" + o.strategy,
      "--set", "emulator.trace=false"};
  if (o.steps > 0) {
    sets.push_back("--set");
    sets.push_back("run.steps=" + std::to_string(o.steps));
  }
  return sets;
}

ChildRun run_mpi(const Args& a, const Options& o, int p, const std::string& name) {
  const std::filesystem::path dir = a.out / "runs" / name;
  std::vector<std::string> argv = {o.mpiexec};
  if (geteuid() == 0) argv.emplace_back("--allow-run-as-root");
  for (const std::string& s :
       {std::string("--oversubscribe"), std::string("-np"), std::to_string(p), a.cocodiff.string(),
        std::string("run"), a.config.string(), std::string("--backend"), std::string("mpi"),
        std::string("--out"), dir.string(), std::string("-q")})
    argv.push_back(s);
  const std::vector<std::string> sets = layout_sets(o, p);
  argv.insert(argv.end(), sets.begin(), sets.end());
  return run_report(argv, dir);
}

int main_impl(int argc, char** argv) {
  const Args a = parse_args(
      argc, argv, " [--ranks 2,4,8] [--repeats 3] [--steps S] [--strategy flat] [--mpiexec PATH]");
  Options o;
  try {
    o = parse(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  Table t({"ranks", "emulator run s", "emulator CPU s", "mpirun process s", "mpi run s",
           "mpi sampling s", "mpi / emulator", "virtual ms", "same output"});
  Progress progress(o.ranks.size() * static_cast<size_t>(o.repeats) * 2);
  std::string dat = "# ranks emu_run_s mpi_run_s mpi_process_s\n";
  for (int p : o.ranks) {
    std::vector<double> emu_run, emu_cpu, mpi_proc, mpi_run, mpi_sampling;
    double virtual_s = 0;
    std::string emu_sha, mpi_sha;
    for (int rep = 0; rep < o.repeats; ++rep) {
      progress.step(fmt("%d ranks, emulator, run %d/%d", p, rep + 1, o.repeats));
      const ChildRun e = run_cocodiff(a, layout_sets(o, p), fmt("emu_np%d_%d", p, rep));
      if (!e.ok()) fail(e, fmt("emulator run on %d ranks", p));
      emu_run.push_back(e.report["wall_time_s"].get<double>());
      emu_cpu.push_back(e.cpu_s);
      virtual_s = e.report["virtual_time_s"].get<double>();
      emu_sha = e.report["output_sha256"].get<std::string>();
      progress.step(fmt("%d ranks, mpirun, run %d/%d", p, rep + 1, o.repeats));
      const ChildRun m = run_mpi(a, o, p, fmt("mpi_np%d_%d", p, rep));
      if (!m.ok()) fail(m, fmt("mpirun -np %d", p));
      mpi_proc.push_back(m.wall_s);
      mpi_run.push_back(m.report["wall_time_s"].get<double>());
      mpi_sampling.push_back(m.report["phases_wall_s"]["sampling_s"].get<double>());
      mpi_sha = m.report["output_sha256"].get<std::string>();
      if (mpi_sha != emu_sha) {
        std::fprintf(stderr, "%d ranks: the backends disagree: emulator output_sha256 %s, mpi %s\n",
                     p, emu_sha.c_str(), mpi_sha.c_str());
        return 1;
      }
    }
    const double er = median(emu_run), mr = median(mpi_run), mp = median(mpi_proc);
    t.add({std::to_string(p), fmt("%.3f", er), fmt("%.2f", median(emu_cpu)), fmt("%.3f", mp),
           fmt("%.3f", mr), fmt("%.3f", median(mpi_sampling)), fmt("%.2f", mr / er),
           fmt("%.3f", virtual_s * 1e3), "yes"},
          {{"ranks", p},
           {"emulator_run_wall_s", er},
           {"emulator_cpu_s", median(emu_cpu)},
           {"mpirun_process_wall_s", mp},
           {"mpi_run_wall_s", mr},
           {"mpi_sampling_wall_s", median(mpi_sampling)},
           {"mpi_over_emulator", mr / er},
           {"virtual_time_s", virtual_s},
           {"output_sha256", emu_sha},
           {"emulator_run_wall_s_all", emu_run},
           {"mpi_run_wall_s_all", mpi_run}});
    dat += fmt("%d %.6g %.6g %.6g\n", p, er, mr, mp);
  }
  progress.done();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  t.finish(a, "mpi_vs_emulator",
           {{"config", a.config.string()},
            {"strategy", o.strategy},
            {"steps", o.steps > 0 ? nlohmann::json(o.steps) : nlohmann::json("config")},
            {"repeats", o.repeats},
            {"workers", a.workers},
            {"host_cores", cores},
            {"note",
             "medians over the repeats; emulator run s and mpi run s are report.json wall_time_s "
             "(config, weights and sampling, without process start); mpirun process s includes "
             "mpirun's start-up; mpi sampling s is the denoising loop alone"}});
  plot(a, "mpi_vs_emulator", dat,
       fmt("set title 'flux1-tiny, real math, one node: wall time of the same run "
           "(%d-core host, medians of %d)'\n",
           static_cast<int>(cores), o.repeats) +
           "set style data histogram\nset style histogram cluster gap 1\n"
           "set style fill solid 0.8 border -1\nset grid ytics\nset key top left\n"
           "set xlabel 'ranks'\nset ylabel 'wall seconds'\nset yrange [0:*]\n"
           "plot $DATA using 2:xtic(1) title 'emulator (one process, fibers)' lc rgb '#0072B2', "
           "'' using 3 title 'mpirun (one process per rank)' lc rgb '#E69F00', "
           "'' using 4 title 'mpirun incl. start-up' lc rgb '#999999'\n",
       900, 500);
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) { return cocodiff::bench::main_impl(argc, argv); }
