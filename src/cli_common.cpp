#include "src/cli_common.hpp"

#include "src/commands.hpp"
#include "src/comm.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "src/error.hpp"
#include "src/npy.hpp"

namespace dpcheck::cli {

void ModelOptions::add_to(CLI::App& sub, bool required) {
  CLI::Option* m = sub.add_option("--model", dims, "Layer widths, input first, e.g. 784,256,10");
  if (required) m->required();
  sub.add_option("--activation", activation, "relu (default), tanh or identity");
  sub.add_option("--loss", loss, "mse (default) or cross-entropy");
}

ModelConfig ModelOptions::config() const {
  ModelConfig c;
  c.dims = parse_dims(dims);
  c.activation = parse_activation(activation);
  c.loss = parse_loss(loss);
  return c;
}

std::vector<float> load_params_dir(const std::string& dir, const ModelConfig& model) {
  if (!std::filesystem::is_directory(dir)) throw UsageError(dir + ": not a directory of .npy parameter files");
  const ParamLayout layout(model);
  std::vector<float> params(layout.size());
  for (const Slice& s : layout.slices()) {
    const NpyArray a = read_npy_expect(std::filesystem::path(dir) / (s.name + ".npy"), s.shape);
    if (a.dtype == DType::i64) throw UsageError(dir + "/" + s.name + ".npy: parameters must be float32 or float64");
    const std::vector<float> v = a.as_float32();
    std::copy(v.begin(), v.end(), params.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  return params;
}

int resolve_world(Target& target, int requested, bool given) {
  Communicator* world = process_world();
  // nccl runs one process per GPU under a launcher, or ranks as threads of one process without one.
  if (target.comm == "mpi" || (target.comm == "nccl" && world)) {
    if (!world)
      throw UsageError("--comm mpi runs one process per rank: start it with a launcher, e.g. mpirun -np 4 dpcheck ...");
    if (given && requested != world->size())
      throw UsageError("--world-size " + std::to_string(requested) + " disagrees with the launcher's " +
                       std::to_string(world->size()) + " processes");
    target.process_world = world;
    return world->size();
  }
  if (world && world->size() > 1)
    throw UsageError("started by a launcher with " + std::to_string(world->size()) +
                     " processes but --comm is " + target.comm + ": add --comm mpi");
  if (given && requested < 1) throw UsageError("--world-size must be at least 1");
  return requested;
}

std::string float_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace dpcheck::cli

namespace dpcheck::cli {

namespace {
Communicator* g_process_world = nullptr;
}

Communicator* process_world() { return g_process_world; }
void set_process_world(Communicator* world) { g_process_world = world; }
bool is_printing_rank() { return !g_process_world || g_process_world->rank() == 0; }

}  // namespace dpcheck::cli
