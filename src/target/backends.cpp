// The table of engines and communicator backends (src/target/backends.hpp): the built-in rows, their lookup
// and validation, and the help texts made from them.
#include "src/target/backends.hpp"
#include "src/builtin_names.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>

#include "src/choice.hpp"
#include "src/comm/collective.hpp"
#include "src/comm/local_comm.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/target/cuda_plugin.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck {

namespace {

void require_cuda_device() { (void)require_cuda(); }

std::unique_ptr<Engine> make_host_engine(const ModelConfig& model, const EngineSpec& spec, int rank) {
  return make_cpu_engine(model, make_kernels(spec.kernels, rank, spec.timeout), spec);
}

std::unique_ptr<Optimizer> make_host_optimizer(const OptimizerConfig& config, std::size_t size, void*,
                                               const EngineSpec& spec, int rank) {
  return make_cpu_optimizer(config, size, make_kernels(spec.kernels, rank, spec.timeout));
}

std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& model, const EngineSpec& spec, int rank);

std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerConfig& config, std::size_t size, void* stream,
                                               const EngineSpec& spec, int rank) {
  return require_cuda().make_optimizer(config, size, stream, make_kernels(spec.kernels, rank, spec.timeout));
}

const EngineRow kEngines[] = {
    {.name = builtin::cpu,
     .memory = MemorySpace::host,
     .help = "Eigen, float32",
     .require = nullptr,
     .low_precision = true,
     .low_precision_with_kernels = true,
     .bf16_allreduce = true,
     .draws_formats = true,
     .make_engine = &make_host_engine,
     .make_optimizer = &make_host_optimizer},
    {.name = builtin::cuda,
     .memory = MemorySpace::device,
     .help = "cuBLAS and dpcheck's kernels, from the CUDA plugin",
     .require = &require_cuda_device,
     .tf32 = true,
     .low_precision = true,
     .products_may_truncate = true,
     .make_engine = &make_cuda_engine,
     .make_optimizer = &make_cuda_optimizer},
};

std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& model, const EngineSpec& spec, int rank) {
  if (!spec.kernels.empty())
    require_kernels_for_engine(load_kernel_plugin(spec.kernels), engine_for_memory(MemorySpace::device));
  return require_cuda().make_engine(model, spec, make_kernels(spec.kernels, rank, spec.timeout));
}

std::deque<Backend> built_in_rows() {
  // The launcher the process backends run under (main joins an MPI world when one started it): the
  // one of the MPI this program is built against.
  const std::string kMpiLauncher = mpi_launcher();
  std::deque<Backend> rows;

  Backend local;
  local.name = builtin::local;
  local.engine = builtin::cpu;
  local.engine_default = true;
  local.memory = MemorySpace::host;
  local.help = "ranks as threads of this process";
  local.rank_order = true;
  local.bench.runs = true;
  local.run_threads = [](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
    run_local(n, fn, timeout);
  };
  local.thresholds = [](int n, Communicator*) { return host_reduction_thresholds(n, DType::f32); };
  rows.push_back(std::move(local));

  // The local backend's reduction, rank by rank on one replica: worlds of thousands of ranks.
  Backend simulated;
  simulated.name = builtin::simulated;
  simulated.engine = builtin::cpu;
  simulated.memory = MemorySpace::host;
  simulated.help = "up to 2^20 ranks played one at a time on one replica, summed as local sums";
  simulated.rank_order = true;
  simulated.simulated = true;
  simulated.run_threads = [](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
    SimulatedComm comm(n);
    comm.set_timeout(timeout);
    fn(comm);
  };
  rows.push_back(std::move(simulated));

  Backend mpi;
  mpi.name = builtin::mpi;
  mpi.engine = builtin::cpu;
  mpi.memory = MemorySpace::host;
  mpi.help = "one process per rank, under mpirun";
  mpi.rank_order = true;
  mpi.mpi = MpiUse::transport;
  mpi.bench.runs = true;
  // The launcher's world is dpcheck's mpi communicator itself (src/comm/mpi_comm.hpp).
  mpi.run_processes = [](Communicator& world, const RankFunction& fn) { fn(world); };
  mpi.launcher = kMpiLauncher;
  mpi.thresholds = [](int, Communicator* world) {
    return world ? world->algorithm_thresholds(DType::f32) : std::vector<std::size_t>{};
  };
  rows.push_back(std::move(mpi));

  // MPI's own collectives, whose all-reduce algorithm Open MPI's MCA parameters choose: what a user's
  // MPI_Allreduce does, checked as a plugin is. Its sums are in the order its algorithm takes.
  Backend mpi_native;
  mpi_native.name = builtin::mpi_native;
  mpi_native.engine = builtin::cpu;
  mpi_native.memory = MemorySpace::host;
  mpi_native.help =
      "one process per rank, under mpirun, with MPI's own MPI_Allreduce (the algorithm MPI picks, or "
      "the one its MCA parameters force)";
  mpi_native.run_processes = [](Communicator& world, const RankFunction& fn) {
    const std::unique_ptr<Communicator> native = make_mpi_native_communicator(&world);  // collective
    native->set_timeout(world.timeout());
    fn(*native);
  };
  mpi_native.launcher = kMpiLauncher;
  mpi_native.mpi = MpiUse::collectives;
  // The baseline of bench allreduce's table.
  mpi_native.bench = {
      .runs = true, .name = "MPI_Allreduce", .help = "Open MPI's own, the baseline", .aliases = {"native"}};
  rows.push_back(std::move(mpi_native));

  Backend cuda_local;
  cuda_local.name = builtin::cuda_local;
  cuda_local.engine = builtin::cuda;
  cuda_local.engine_default = true;
  cuda_local.memory = MemorySpace::device;
  cuda_local.help = "replicas on one GPU, a thread each";
  cuda_local.rank_order = true;
  cuda_local.run_threads = [](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
    require_cuda().run_cuda_local(n, fn, timeout);
  };
  rows.push_back(std::move(cuda_local));

  Backend nccl;
  nccl.name = builtin::nccl;
  nccl.engine = builtin::cuda;
  nccl.memory = MemorySpace::device;
  nccl.help = "one GPU per rank: ranks as threads, or one process per GPU under mpirun";
  nccl.run_threads = [](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
    require_cuda().run_nccl_threads(n, fn, timeout);
  };
  nccl.run_processes = [](Communicator& world, const RankFunction& fn) {
    // One GPU per process: the launcher's local rank picks it.
    const cuda::Plugin& gpu = require_cuda();
    const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const int devices = gpu.device_count();
    const int device = (local_rank ? std::atoi(local_rank) : world.rank()) % (devices > 0 ? devices : 1);
    const std::unique_ptr<Communicator> comm = gpu.make_nccl_communicator(world, device);
    fn(*comm);
  };
  nccl.launcher = kMpiLauncher;
  rows.push_back(std::move(nccl));
  return rows;
}

std::deque<Backend>& table() {
  static std::deque<Backend> rows = built_in_rows();
  return rows;
}

// The names of the rows that carry `engine`'s buffers, in table order; with only those that may run
// under a launcher when `launched` is set.
std::vector<std::string_view> comms_of(std::string_view engine, bool launched = false) {
  std::vector<std::string_view> names;
  for (const Backend& b : table())
    if (b.engine == engine && (!launched || b.may_run_under_launcher())) names.push_back(b.name);
  return names;
}

// "<a> or <b> for the cpu engine<separator><c> or <d> for the cuda engine", with item(row) for each row.
template <class Item> std::string by_engine(const Item& item, std::string_view separator) {
  std::string out;
  for (const EngineRow& e : engines()) {
    std::vector<std::string> items;
    for (const Backend& b : table())
      if (b.engine == e.name) items.push_back(item(b));
    if (items.empty()) continue;
    out += (out.empty() ? "" : std::string(separator)) + or_list(items) + " for the " + std::string(e.name) + " engine";
  }
  return out;
}

}  // namespace

std::span<const EngineRow> engines() { return kEngines; }

std::string_view default_engine() { return kEngines[0].name; }
const EngineRow& default_engine_row() { return kEngines[0]; }

const EngineRow& find_engine(std::string_view name) {
  for (const EngineRow& e : kEngines)
    if (e.name == name) return e;
  std::vector<std::string_view> names;
  for (const EngineRow& e : kEngines) names.push_back(e.name);
  throw UsageError("unknown engine '" + std::string(name) + "' (choose " + or_list(names) + ")");
}

const EngineRow& engine_for_memory(MemorySpace memory) {
  for (const EngineRow& e : kEngines)
    if (e.memory == memory) return e;
  throw Error("no engine keeps its buffers in " + std::string(memory == MemorySpace::host ? "host" : "device") +
              " memory");
}

std::string engines_with(bool EngineRow::*has) {
  std::vector<std::string_view> names;
  for (const EngineRow& e : kEngines)
    if (e.*has) names.push_back(e.name);
  return "the " + and_list(names) + (names.size() == 1 ? " engine" : " engines");
}

void require_kernels_for_engine(const KernelPlugin& plugin, const EngineRow& engine) {
  const MemorySpace memory = plugin.memory() == DPCHECK_CUDA ? MemorySpace::device : MemorySpace::host;
  if (memory == engine.memory) return;
  const std::string plugin_is = plugin.what() + ": plugin '" + std::string(plugin.name()) + "' works on ";
  if (memory == MemorySpace::host)
    throw UsageError(plugin_is + "host memory (DPCHECK_HOST): it runs with --engine " +
                     std::string(engine_for_memory(memory).name) + ", not the " + std::string(engine.name) + " engine");
  throw UsageError(plugin_is + "device memory (DPCHECK_CUDA), which the " + std::string(engine.name) +
                   " engine does not have: run it with --engine " + std::string(engine_for_memory(memory).name));
}

std::string Backend::launch_prefix(int processes) const {
  if (!may_run_under_launcher() || launcher.empty()) return {};
  return launcher + " " + std::to_string(processes) + " ";
}

const std::deque<Backend>& backends() { return table(); }

const Backend* find_registered_backend(std::string_view name) {
  for (const Backend& b : table())
    if (b.name == name) return &b;
  return nullptr;
}

namespace {
std::vector<BackendFinder>& finders() {
  static std::vector<BackendFinder> all;
  return all;
}
}  // namespace

void add_backend_finder(BackendFinder finder) { finders().push_back(finder); }

const Backend* find_backend(std::string_view name) {
  if (const Backend* b = find_registered_backend(name)) return b;
  for (const BackendFinder finder : finders())
    if (const Backend* b = finder(name)) return b;
  return nullptr;
}

const Backend& backend_for(std::string_view engine, std::string_view comm) {
  const EngineRow& e = find_engine(engine);
  const Backend* b = find_backend(comm);
  if (!b)
    throw UsageError("unknown --comm '" + std::string(comm) + "' (choose " +
                     by_engine([](const Backend& row) { return row.name; }, ", ") + ")");
  require_same_engine(e, *b);
  return *b;
}

void require_same_engine(const EngineRow& e, const Backend& b) {
  if (b.engine != e.name)
    throw UsageError("engine " + std::string(e.name) + " runs with --comm " + or_list(comms_of(e.name)) + ", not '" +
                     b.name + "' (" + b.name + " is for --engine " + b.engine + ")");
}

const Backend& default_backend(const EngineRow& engine) {
  for (const Backend& b : table())
    if (b.engine == engine.name && b.engine_default) return b;
  throw Error("the " + std::string(engine.name) + " engine has no default communicator");
}

const Backend* process_backend(const EngineRow& engine) {
  for (const Backend& b : table())
    if (b.engine == engine.name && b.may_run_under_launcher()) return &b;
  return nullptr;
}

const Backend* simulated_backend(const EngineRow& engine) {
  for (const Backend& b : table())
    if (b.engine == engine.name && b.simulated) return &b;
  return nullptr;
}

Communicator* world_of_processes(const Backend& b, Communicator* launcher_world) {
  if (launcher_world && b.may_run_under_launcher()) return launcher_world;
  if (!launcher_world && b.needs_launcher())
    throw UsageError("--comm " + b.name + " runs one process per rank: start it with a launcher, e.g. " +
                     b.launch_prefix(4) + dpcheck_program() + " ...");
  if (launcher_world && launcher_world->size() > 1) {
    const std::vector<std::string_view> instead = comms_of(b.engine, true);
    throw UsageError("started by a launcher with " + std::to_string(launcher_world->size()) +
                     " processes but --comm is " + b.name +
                     (instead.empty() ? "" : ": add --comm " + or_list(instead)));
  }
  return nullptr;
}

const Backend& register_backend(Backend row) {
  const std::string what = "backend '" + row.name + "'";
  if (row.name.empty()) throw UsageError("a backend needs a name");
  if (find_registered_backend(row.name)) throw UsageError(what + ": a backend of that name exists already");
  const EngineRow& e = find_engine(row.engine);
  if (row.memory != e.memory)
    throw UsageError(what + ": its buffers must live where the " + row.engine + " engine's do (" +
                     (e.memory == MemorySpace::host ? "host" : "device") + " memory)");
  if (!row.run_threads && !row.run_processes) throw UsageError(what + ": it has no way to run its ranks");
  if (row.run_processes && row.launcher.empty()) throw UsageError(what + ": it runs under a launcher but names none");
  if (row.engine_default)
    throw UsageError(what + ": the " + row.engine + " engine has a default communicator already, " +
                     default_backend(e).name);
  table().push_back(std::move(row));
  return table().back();
}

std::string engine_option_help() {
  std::vector<std::string> items;
  for (const EngineRow& e : kEngines)
    items.push_back(std::string(e.name) + " (" + std::string(e.help) +
                    (e.name == default_engine() ? "; default)" : ")"));
  return "Engine: " + or_list(items);
}

std::string comm_option_help() {
  return "Communicator: " +
         by_engine([](const Backend& b) { return b.name + " (" + b.help + (b.engine_default ? "; default)" : ")"); },
                   "; ") +
         "; or a communicator plugin: the path to its shared object (include/dpcheck/plugin.h)";
}

// ---- bench allreduce's view of the table ----

namespace {

std::string lowercase_name(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return out;
}

// Whether `lowered` (lower case) is one of the row's names for --backends.
bool names_row(const Backend& row, const std::string& lowered) {
  if (lowered == lowercase_name(row.name) || lowered == lowercase_name(allreduce_name(row))) return true;
  return std::any_of(row.bench.aliases.begin(), row.bench.aliases.end(),
                     [&](const std::string& alias) { return lowered == lowercase_name(alias); });
}

}  // namespace

std::vector<const Backend*> allreduce_backends() {
  std::vector<const Backend*> rows;
  for (const Backend& b : backends())
    if (b.bench.runs) rows.push_back(&b);
  return rows;
}

std::string allreduce_name(const Backend& row) { return row.bench.name.empty() ? row.name : row.bench.name; }

std::string allreduce_help(const Backend& row) { return row.bench.help.empty() ? row.help : row.bench.help; }

std::vector<std::string> allreduce_process_names() {
  std::vector<std::string> names;
  for (const Backend* row : allreduce_backends())
    if (!row->ranks_as_threads()) names.push_back(allreduce_name(*row));
  return names;
}

std::vector<const Backend*> parse_allreduce_backends(std::string_view list) {
  const std::vector<const Backend*> all = allreduce_backends();
  std::vector<const Backend*> picked;
  std::string_view rest = list;
  for (;;) {
    const std::size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const Backend* b) { return names_row(*b, lowercase_name(item)); });
    if (it == all.end()) {
      std::vector<std::string> names;
      for (const Backend* b : all) names.push_back(allreduce_name(*b));
      throw UsageError("--backends: unknown backend '" + item + "' (choose from " + joined_list(names, ", ") + ")");
    }
    if (std::find(picked.begin(), picked.end(), *it) == picked.end()) picked.push_back(*it);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(picked.begin(), picked.end(), [&](const Backend* a, const Backend* b) {
    return std::find(all.begin(), all.end(), a) < std::find(all.begin(), all.end(), b);
  });
  return picked;
}

}  // namespace dpcheck
