// The dpcheck subcommands. Each add_* registers a subcommand and its options on the app and returns
// the function that runs it once the command line has been parsed. Exit status: 0 all checks passed,
// 1 a check failed, 2 bad usage (UsageError, unknown flag), 3 a runtime error (a dead rank, an I/O
// failure).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dpcheck {
class Communicator;
}

namespace dpcheck::cli {

inline constexpr int exit_ok = 0;
inline constexpr int exit_check_failed = 1;
inline constexpr int exit_usage = 2;
inline constexpr int exit_runtime_error = 3;

using Runner = std::function<int()>;

// This process's communicator over all ranks when an MPI launcher started it, else nullptr. Set by
// main before any subcommand runs.
Communicator* process_world();
void set_process_world(Communicator* world);

// The command line as given ("dpcheck", then the arguments as main received them, before MPI_Init).
const std::vector<std::string>& command_line();
void set_command_line(std::vector<std::string> words);

// The rank whose output a command prints: 0, or this process's rank under a launcher.
bool is_printing_rank();

Runner add_verify(CLI::App& app);
Runner add_grad(CLI::App& app);
Runner add_train(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_audit(CLI::App& app);
Runner add_conform(CLI::App& app);
Runner add_replay(CLI::App& app);
Runner add_diff(CLI::App& app);
Runner add_drift(CLI::App& app);
Runner add_plant_writes(CLI::App& app);  // hidden: the ranks of audit_sees_every_write

}  // namespace dpcheck::cli
