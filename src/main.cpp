// dpcheck: checks the promises of data-parallel training (see README.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <iostream>
#include <utility>
#include <vector>

#include "src/commands.hpp"
#include "src/mpi_comm.hpp"
#include "src/error.hpp"

int main(int argc, char** argv) {
  using namespace dpcheck;
  CLI::App app{"dpcheck: checks that data-parallel training keeps its promises: averaged shard gradients\n"
               "equal the whole-batch gradient, replicas stay bitwise identical, shards are disjoint\n"
               "and cover the data, and only rank 0 writes files.",
               "dpcheck"};
  app.require_subcommand(1);
  // One line naming the problem; subcommands inherit this from the app.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("dpcheck: error: ") + e.what() + " (see --help)\n";
  });
  app.set_version_flag("--version", "dpcheck 0.1.0");

  std::vector<std::pair<const CLI::App*, cli::Runner>> runners;
  const auto add = [&](cli::Runner (*adder)(CLI::App&)) {
    cli::Runner r = adder(app);
    runners.emplace_back(app.get_subcommands([](CLI::App*) { return true; }).back(), std::move(r));
  };
  add(cli::add_verify);
  add(cli::add_grad);
  add(cli::add_train);
  add(cli::add_bench);
  add(cli::add_audit);

  if (argc > 1 && argv[1][0] != '-' && runners.end() == std::find_if(runners.begin(), runners.end(), [&](const auto& r) {
        return r.first->get_name() == argv[1];
      })) {
    std::string names;
    for (const auto& [sub, runner] : runners) names += (names.empty() ? "" : ", ") + sub->get_name();
    std::cerr << "dpcheck: error: unknown command '" << argv[1] << "' (choose " << names << ")\n";
    return cli::exit_usage;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return cli::exit_usage;
  }

  // Under an MPI launcher every process joins the world before any command runs; --comm mpi uses it.
  std::unique_ptr<MpiSession> mpi;
  try {
    if (launched_by_mpi() && mpi_available()) {
      mpi = std::make_unique<MpiSession>(&argc, &argv);
      cli::set_process_world(&mpi->world());
    }
  } catch (const std::exception& e) {
    std::cerr << "dpcheck: error: cannot start MPI: " << e.what() << "\n";
    return cli::exit_runtime_error;
  }

  try {
    for (const CLI::App* sub : app.get_subcommands())
      for (const auto& [registered, runner] : runners)
        if (registered == sub) return runner();
  } catch (const UsageError& e) {
    // Every rank meets the same bad input; one of them says so.
    std::fflush(stdout);
    if (cli::is_printing_rank()) std::cerr << "dpcheck: error: " << e.what() << "\n";
    return cli::exit_usage;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (mpi) {
      // A dead or stuck peer: say which rank saw what, then end the whole job so that the launcher
      // returns instead of waiting for the stuck ranks.
      std::cerr << "dpcheck: error: rank " << mpi->world().rank() << ": " << e.what() << "\n";
      std::cerr.flush();
      mpi->abort(cli::exit_runtime_error);
    }
    std::cerr << "dpcheck: error: " << e.what() << "\n";
    return cli::exit_runtime_error;
  }
  return cli::exit_usage;
}
