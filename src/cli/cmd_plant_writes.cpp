// `dpcheck plant-writes`: hidden, the ranks of the property audit_sees_every_write. Each rank makes the
// planted calls of its rank (src/audit/planted.hpp) and exits; the property compares what the write audit
// recorded with the plan. Not for users, so hidden from --help, and it refuses to run anywhere a training
// run could start it by accident: outside the write audit, outside an MPI launcher, or on a directory
// the property did not prepare.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "src/audit/planted.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/comm.hpp"
#include "src/error.hpp"

namespace dpcheck::cli {

namespace {

struct PlantArgs {
  std::string dir;
  std::vector<std::string> plants;
};

int run_plant_writes(const PlantArgs& args) {
  std::vector<audit::Plant> plants;
  for (const std::string& text : args.plants) plants.push_back(audit::parse_plant(text));
  const char* log = std::getenv("DPCHECK_AUDIT_LOG");
  if (log == nullptr || *log == '\0')
    throw UsageError("plant-writes runs only under the write audit (DPCHECK_AUDIT_LOG is not set)");
  Communicator* world = process_world();
  if (world == nullptr) throw UsageError("plant-writes runs only under an MPI launcher (mpirun -np N)");
  audit::make_plants(args.dir, plants, world->rank());
  return exit_ok;
}

}  // namespace

Runner add_plant_writes(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("plant-writes", "One rank of the property audit_sees_every_write");
  sub->group("");
  auto args = std::make_shared<PlantArgs>();
  sub->add_option("--dir", args->dir, "The directory the property prepared")->required();
  sub->add_option("--plant", args->plants, "RANK:KIND:abs|rel:NAME (repeatable)");
  return [args]() -> int { return run_plant_writes(*args); };
}

}  // namespace dpcheck::cli
