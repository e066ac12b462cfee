// cocodiff: emulate multi-node DiT inference on one machine, or run it on a cluster with MPI.
// Exit codes: 0 success, 1 internal error, 2 bad input (config, files, flags, collectives).

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "apps/commands.hpp"
#include "core/errors.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cocodiff: multi-node Diffusion Transformer inference emulator"};
  app.require_subcommand(1);
  // Sub-commands (one apps/cmd_*.cpp each):
  cocodiff::apps::add_run_command(app);
  cocodiff::apps::add_validate_command(app);
  cocodiff::apps::add_topo_command(app);
  cocodiff::apps::add_netbench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const cocodiff::RankError& e) {
    std::fprintf(stderr, "cocodiff: error: %s\n", e.what());
    return e.user_error() ? 2 : 1;
  } catch (const cocodiff::UserError& e) {
    std::fprintf(stderr, "cocodiff: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cocodiff: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
