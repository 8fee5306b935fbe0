// Options shared by the dpcheck subcommands, and their conversion to dpcheck's types. Every value is
// checked here, before any work starts, so bad input ends with one line and exit status 2.
#pragma once

#include <string>
#include <vector>

#include "properties/target.hpp"
#include "src/data.hpp"
#include "src/model.hpp"
#include "src/sampler.hpp"

namespace CLI {
class App;
}

namespace dpcheck::cli {

struct ModelOptions {
  std::string dims;
  std::string activation = "relu";
  std::string loss = "mse";

  void add_to(CLI::App& sub, bool required = true);
  ModelConfig config() const;  // UsageError on bad values
};

// Loads parameters from a directory of <name>.npy files (layers.0.weight.npy, ...), each with the
// shape of its slice; UsageError naming the file on any mismatch.
std::vector<float> load_params_dir(const std::string& dir, const ModelConfig& model);

// Fills target.comm-related fields from --comm and the launcher: with --comm mpi the world is this
// process's MPI world (UsageError without a launcher, or when --world-size disagrees with it);
// under a launcher with more than one process, --comm local is refused (every process would run a
// whole world of its own). Returns the world size to use.
int resolve_world(Target& target, int requested_world_size, bool world_size_given);

// Text for a float with all the digits that identify it.
std::string float_text(double v);

}  // namespace dpcheck::cli
