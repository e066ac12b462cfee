// cocodiff: emulate multi-node DiT inference on one machine, or run it on a cluster with MPI.
// Exit codes: 0 success, 1 internal error, 2 bad input (config, files, flags, collectives),
// 3 a run stopped by --inject-fault (report.json written, status "failed"), 128 + signal number
// when interrupted (130 for Ctrl-C / SIGINT, 143 for SIGTERM, 129 for SIGHUP: the terminal
// closed).

#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.hpp"
#include "core/atomic_file.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

// SIGINT, SIGTERM and SIGHUP are blocked in every thread (main blocks them before any thread
// exists, and threads inherit the mask: engine workers, MPI progress threads) and taken by one
// watcher thread with sigwait(). The watcher runs ordinary code, not an async signal handler, so it
// may lock a mutex; it writes its message with write(2) and leaves with _exit() so that no
// destructor or atexit handler races the still-running workers. Outputs are written only after a
// run succeeded and only while hold_interrupts() is held, so an interrupt leaves the out directory
// with either nothing or complete files, never a temporary.
// An interrupt while outputs are written asks them to stop (stop_outputs): the writer discards
// its staged set at its next checkpoint, within a file or a few thousand trace records, and the
// previous set stays. Once a set is moving into place it finishes.
std::mutex g_output_mutex;
std::atomic<bool> g_outputs_started{false};
std::atomic<bool> g_quiet{false};
// The handshake of the program's end with the watcher: a signal taken before main returns ends
// the process with 128 + signal (never exit 0 for an interrupted run); one taken after finds it
// ending with its work done.
std::mutex g_exit_mutex;
bool g_exiting = false;
int g_signal = 0;

void watch_interrupts(sigset_t set) {
  int sig = 0;
  if (::sigwait(&set, &sig) != 0) return;
  {
    std::lock_guard<std::mutex> lk(g_exit_mutex);
    if (g_exiting) return;  // the work is done and the process is ending with its code
    g_signal = sig;
  }
  stop_outputs(sig);
  std::lock_guard<std::mutex> lk(g_output_mutex);  // let an output file finish its rename
  if (g_quiet.load()) ::_exit(128 + sig);
  // Under mpirun, say which rank and that the launcher ended it: mpirun stops every rank when
  // one of them fails (or the job is cancelled), so this line is never the cause.
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string name = sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
  const std::string what = mpi_rank != nullptr ? std::string("cocodiff: rank ") + mpi_rank +
                                                     ": ended by the launcher (" + name +
                                                     "; another rank failed or the job was stopped)"
                                               : "cocodiff: interrupted by " + name;
  const std::string msg =
      what + (outputs_stopped() ? "; stopped, no outputs written (the previous ones kept)\n"
              : g_outputs_started.load() ? "; the outputs were already complete\n"
                                         : "; stopped, no outputs written\n");
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg.data(), msg.size());
  ::_exit(128 + sig);
}

void start_interrupt_watcher() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // SIGHUP too, unless the program was started to ignore it (nohup): a blocked signal is never
  // discarded, so taking it here would end a run nohup meant to keep alive.
  struct sigaction hup {};
  if (::sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&set, SIGHUP);
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;  // keep the default actions
  std::thread(watch_interrupts, set).detach();
}

}  // namespace

void quiet_interrupts() { g_quiet = true; }

void loud_interrupts() { g_quiet = false; }

std::unique_lock<std::mutex> hold_interrupts() {
  std::unique_lock<std::mutex> lk(g_output_mutex);
  g_outputs_started = true;
  return lk;
}

namespace {
/// "did you mean '--steps'?" for the first unexpected argument in CLI11's message that is
/// close to an option of the command being parsed; empty when none is.
std::string flag_hint(const CLI::App& app, const std::string& message) {
  std::vector<std::string> options;
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options())
      for (const std::string& name : opt->get_lnames()) options.push_back("--" + name);
  std::istringstream words(message.substr(message.find(':') + 1));
  std::string word;
  while (words >> word) {
    if (word.rfind("--", 0) != 0) continue;
    word = word.substr(0, word.find('='));
    const std::string best = closest_match(word, options);
    if (best.empty()) continue;
    std::string hint = "did you mean '";
    hint += best;
    hint += "' instead of '";
    hint += word;
    hint += "'?";
    return hint;
  }
  return {};
}
// Flushes standard output and says whether everything written to it arrived: a full disk or a
// closed pipe is an error (exit 2), not a silent empty file.
// The program's exit code, once the watcher cannot end it any more: when a signal was taken
// first, the watcher ends the process (128 + signal) and this never returns.
int exit_code(int code) {
  {
    std::lock_guard<std::mutex> lk(g_exit_mutex);
    if (g_signal == 0) {
      g_exiting = true;
      return code;
    }
  }
  for (;;) ::pause();
}

int finish_standard_output() {
  std::cout.flush();
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout;
  if (!failed) return 0;
  const int err = errno;
  std::fprintf(stderr, "cocodiff: error: cannot write standard output%s%s\n", err != 0 ? ": " : "",
               err != 0 ? std::strerror(err) : "");
  return 2;
}

}  // namespace

}  // namespace cocodiff::apps

namespace {
int run_main(int argc, char** argv);
}

int main(int argc, char** argv) {
  cocodiff::apps::start_interrupt_watcher();  // first: before any other thread starts
  return cocodiff::apps::exit_code(run_main(argc, argv));
}

namespace {
int run_main(int argc, char** argv) {
  CLI::App app{"cocodiff: multi-node Diffusion Transformer inference emulator"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every option's default
#ifndef COCODIFF_VERSION
#define COCODIFF_VERSION "unknown"
#endif
#ifdef COCODIFF_HAVE_MPI
  const char* mpi = "yes";
#else
  const char* mpi = "no";
#endif
#ifdef COCODIFF_PROFILE_GUIDED
  const char* pgo = "profile-guided (scripts/build_pgo.sh)";
#else
  const char* pgo = "without a profile";
#endif
  app.set_version_flag("--version", std::string("cocodiff ") + COCODIFF_VERSION +
                                        "\nconfigs: " + cocodiff::apps::config_dir().string() +
                                        "\nMPI backend: " + mpi + "\nbuild: " + pgo);
  // Sub-commands (one apps/cmd_*.cpp each):
  cocodiff::apps::add_run_command(app);
  cocodiff::apps::add_validate_command(app);
  cocodiff::apps::add_forward_command(app);
  cocodiff::apps::add_compare_command(app);
  cocodiff::apps::add_topo_command(app);
  cocodiff::apps::add_netbench_command(app);
  cocodiff::apps::add_calibrate_command(app);
  cocodiff::apps::add_weights_command(app);
  cocodiff::apps::add_tune_command(app);
  if (argc > 1 && argv[1][0] != '-') {  // CLI11 alone would only say "A subcommand is required"
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : " | ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr,
                   "cocodiff: error: unknown command '%s' (expected %s)\n"
                   "Run with --help for more information.\n",
                   argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    app.exit(e);
    const std::string hint = cocodiff::apps::flag_hint(app, e.what());
    if (!hint.empty()) std::fprintf(stderr, "cocodiff: %s\n", hint.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const cocodiff::OutputsStopped&) {
    // An interrupt stopped the outputs: the watcher says so and ends the process.
    for (;;) ::pause();
  } catch (const cocodiff::RankError& e) {
    std::fprintf(stderr, "cocodiff: error: %s\n", e.what());
    return e.user_error() ? 2 : 1;
  } catch (const cocodiff::UserError& e) {
    std::fprintf(stderr, "cocodiff: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {  // a resource error: exit 2, as for any input too large
    std::fprintf(stderr,
                 "cocodiff: error: out of memory while building the run (std::bad_alloc); use "
                 "run.math = \"skip\", a smaller model or resolution, or more memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cocodiff: internal error: %s\n", e.what());
    return 1;
  }
  return cocodiff::apps::finish_standard_output();
}
}  // namespace
