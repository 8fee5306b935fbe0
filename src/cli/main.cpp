// dpcheck: checks the promises of data-parallel training (see README.md).
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mutants/mutants.hpp"
#include "properties/properties.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"

namespace dpcheck {
namespace {

using Runners = std::vector<std::pair<const CLI::App*, cli::Runner>>;

// The app with every subcommand registered, and what runs each.
Runners register_commands(CLI::App& app) {
  app.require_subcommand(1);
  // One line naming the problem; subcommands inherit this from the app.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("dpcheck: error: ") + e.what() + " (see --help)\n";
  });
  app.set_version_flag("--version", "dpcheck " DPCHECK_VERSION);
  Runners runners;
  for (cli::Runner (*adder)(CLI::App&) :
       {cli::add_verify, cli::add_grad, cli::add_train, cli::add_bench, cli::add_audit, cli::add_conform,
        cli::add_replay, cli::add_diff, cli::add_drift, cli::add_plant_writes}) {
    cli::Runner r = adder(app);
    runners.emplace_back(app.get_subcommands([](CLI::App*) { return true; }).back(), std::move(r));
  }
  return runners;
}

// Parses the command line and runs its subcommand: UsageError for an unknown command; a parse error
// (or --help, --version) printed by rank 0 and its exit status returned.
int parse_and_run(CLI::App& app, const Runners& runners, const std::vector<std::string>& args, int argc, char** argv,
                  bool printing) {
  if (!args.empty() && args[0][0] != '-' &&
      runners.end() ==
          std::find_if(runners.begin(), runners.end(), [&](const auto& r) { return r.first->get_name() == args[0]; })) {
    std::string names;
    for (const auto& [sub, runner] : runners)
      if (!sub->get_group().empty()) names += (names.empty() ? "" : ", ") + sub->get_name();
    throw UsageError("unknown command '" + args[0] + "' (choose " + names + ")");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    const bool finished = dynamic_cast<const CLI::CallForHelp*>(&e) || dynamic_cast<const CLI::CallForAllHelp*>(&e) ||
                          dynamic_cast<const CLI::CallForVersion*>(&e);
    // A parse error may be one rank's alone (a file an option names, missing on its host): main says it
    // as it says every bad input.
    if (!finished) {
      std::string what = err.str().empty() ? std::string(e.what()) : err.str();
      if (what.starts_with("dpcheck: error: ")) what.erase(0, std::string_view("dpcheck: error: ").size());
      while (!what.empty() && what.back() == '\n') what.pop_back();
      throw UsageError(what);
    }
    if (printing) std::cout << out.str() << std::flush;
    return code;
  }
  cli::check_parsed_options(app);
  for (const CLI::App* sub : app.get_subcommands())
    for (const auto& [registered, runner] : runners)
      if (registered == sub) return runner();
  return cli::exit_usage;
}

// A path the checks up front could not foresee (a loop of links, a name too long, a file that came or
// went meanwhile): the path and the system's reason, not the library's wording. Bad input (exit 2)
// where the path is the user's to fix, a runtime fault otherwise.
int filesystem_fault(const std::filesystem::filesystem_error& e, MpiSession* mpi) {
  const std::error_code& code = e.code();
  std::string message = e.path1().string() + ": " + code.message();
  if (!e.path2().empty()) message = e.path1().string() + " -> " + e.path2().string() + ": " + code.message();
  const bool input = code == std::errc::too_many_symbolic_link_levels || code == std::errc::filename_too_long ||
                     code == std::errc::no_such_file_or_directory || code == std::errc::not_a_directory ||
                     code == std::errc::file_exists || code == std::errc::is_a_directory ||
                     code == std::errc::permission_denied || code == std::errc::read_only_file_system;
  if (mpi) cli::print_error("rank " + std::to_string(mpi->world().rank()) + ": " + message);
  else cli::print_error(message);
  if (mpi) mpi->abort(input ? cli::exit_usage : cli::exit_runtime_error);
  return input ? cli::exit_usage : cli::exit_runtime_error;
}

// Under a launcher, bad input that every rank met (the command line is the same on every rank, so most
// is) is said once, by rank 0, and every rank exits 2. Bad input that one rank met alone -- a file or a
// plugin missing on its host -- is said by that rank, naming itself, and ends the job at once: the others
// wait in a collective that it will never join, and would otherwise blame a missing message after
// --timeout.
int end_with_bad_input(MpiSession& mpi, const std::string& reason) {
  // Ranks that meet the same bad input arrive within milliseconds of each other (they agreed on the
  // command line a moment before, or met it in the same collective step).
  constexpr double kArrivalSeconds = 5;
  const std::optional<std::vector<std::string>> reasons = mpi.gather_bad_input(reason, kArrivalSeconds);
  if (!reasons) {
    cli::print_error("rank " + std::to_string(mpi.world().rank()) + ": " + reason);
    mpi.abort(cli::exit_usage);
  }
  if (mpi.world().rank() == 0) cli::print_error(cli::describe_rank_reasons(*reasons));
  return cli::exit_usage;
}

}  // namespace
}  // namespace dpcheck

int main(int argc, char** argv) {
  using namespace dpcheck;
  // Copied before MPI_Init, which may edit argv.
  const std::vector<std::string> args(argv + 1, argv + argc);
  {
    std::vector<std::string> words{"dpcheck"};
    words.insert(words.end(), args.begin(), args.end());
    cli::set_command_line(std::move(words));
  }
  CLI::App app{
      "dpcheck: checks that data-parallel training keeps its promises: averaged shard gradients\n"
      "equal the whole-batch gradient, replicas stay bitwise identical, shards are disjoint\n"
      "and cover the data, and only rank 0 writes files.",
      "dpcheck"};
  // A write past `ulimit -f` then fails with EFBIG, which the writer reports (naming the file, exit 3)
  // and cleans up after, instead of the signal ending the process with a temporary file left behind.
  ::signal(SIGXFSZ, SIG_IGN);
  // only_rank0_writes launches this very program, whatever its file is called.
  this_process_is_dpcheck();
  // Targets build their broken parts through the mutant table.
  register_mutants();
  const Runners runners = register_commands(app);

  // Under an MPI launcher every process joins the world before anything else, and the processes agree
  // on the command line: then every later decision, a parse error included, is the same on every rank,
  // and rank 0 alone says it.
  std::unique_ptr<MpiSession> mpi;
  try {
    if (launched_by_mpi() && mpi_available()) {
      mpi = std::make_unique<MpiSession>(&argc, &argv);
      cli::set_process_world(&mpi->world());
    }
  } catch (const std::exception& e) {
    cli::print_error(std::string("cannot start MPI: ") + e.what());
    return cli::exit_runtime_error;
  }
  const bool printing = cli::is_printing_rank();

  try {
    if (mpi) cli::require_same_command_line(mpi->world(), args);
    return parse_and_run(app, runners, args, argc, argv, printing);
  } catch (const UsageError& e) {
    if (mpi && mpi->world().size() > 1) return end_with_bad_input(*mpi, e.what());
    cli::print_error(e.what());
    return cli::exit_usage;
  } catch (const std::bad_alloc&) {
    // Said without allocating: the memory is gone. Sizes dpcheck can foresee are refused up front (exit
    // 2); this is what it could not foresee, a runtime fault.
    static const char line[] = "dpcheck: error: out of memory (a limit such as ulimit -v, or the machine's memory)\n";
    if (::write(STDERR_FILENO, line, sizeof line - 1) < 0) {
    }
    if (mpi) mpi->abort(cli::exit_runtime_error);
    return cli::exit_runtime_error;
  } catch (const std::filesystem::filesystem_error& e) {
    return filesystem_fault(e, mpi.get());
  } catch (const std::exception& e) {
    if (mpi) {
      // A dead or stuck peer: say which rank saw what, then end the whole job so that the launcher
      // returns instead of waiting for the stuck ranks.
      cli::print_error("rank " + std::to_string(mpi->world().rank()) + ": " + e.what());
      mpi->abort(cli::exit_runtime_error);
    }
    cli::print_error(e.what());
    return cli::exit_runtime_error;
  }
}
