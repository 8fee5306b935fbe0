// `dpcheck bench scaling` and `bench rounding` (src/cli/cmd_bench_scaling.cpp, cmd_bench_rounding.cpp),
// registered under `dpcheck bench`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dpcheck::cli {

// A benchmark registered on `bench`: its names for the list of benchmarks, and what runs it (nullopt
// when none of its subcommands was given).
struct BenchCommand {
  std::vector<std::string> names;
  std::function<std::optional<int>()> run;
};

BenchCommand add_bench_scaling(CLI::App& bench);
BenchCommand add_bench_rounding(CLI::App& bench);

}  // namespace dpcheck::cli
