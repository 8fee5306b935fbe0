// What a run needs against what this machine has (src/cli/cli_common.hpp): memory, threads and
// processes, read from /proc and the cgroup, so that a run too big for the machine is refused before it
// starts instead of being killed halfway.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "src/cli/cli_common.hpp"
#include "src/error.hpp"
#include "src/target/backends.hpp"

namespace dpcheck::cli {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The first number in a file such as /proc/sys/kernel/threads-max or a cgroup's memory.max; nullopt
// when it cannot be read or says "max".
std::optional<double> number_in(const char* path) {
  std::ifstream in(path);
  double v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// The value of a "Key:   123 kB" line of /proc/meminfo, in bytes.
std::optional<double> meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = 0;
    if (fields >> kb) return kb * 1024;
  }
  return std::nullopt;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

}  // namespace

MachineLimits machine_limits() {
  MachineLimits m;
  const auto lower = [](double& best, std::string& source, std::optional<double> v, const char* what) {
    if (v && *v >= 0 && (best <= 0 || *v < best)) {
      best = *v;
      source = what;
    }
  };
  if (const auto avail = meminfo("MemAvailable"))
    lower(m.memory_bytes, m.memory_source, avail, "MemAvailable in /proc/meminfo");
  else
    lower(m.memory_bytes, m.memory_source,
          static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE)),
          "available pages (sysconf)");
  // A container's cgroup (v2, then v1) may allow less than the machine has free.
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto l = number_in(limit);
    if (l && *l < 1e18)
      lower(m.memory_bytes, m.memory_source, *l - number_in(usage).value_or(0), "the cgroup's memory limit");
  }
  for (const auto& [resource, name] : {std::pair{RLIMIT_AS, "ulimit -v"}, std::pair{RLIMIT_DATA, "ulimit -d"}}) {
    struct rlimit r {};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
      lower(m.memory_bytes, m.memory_source, static_cast<double>(r.rlim_cur), name);
  }

  double threads = 0;
  lower(threads, m.threads_source, number_in("/proc/sys/kernel/threads-max"), "/proc/sys/kernel/threads-max");
  lower(threads, m.threads_source, number_in("/sys/fs/cgroup/pids.max"), "the cgroup's pids.max");
  lower(threads, m.threads_source, number_in("/sys/fs/cgroup/pids/pids.max"), "the cgroup's pids.max");
  struct rlimit r {};
  if (::getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    lower(threads, m.threads_source, static_cast<double>(r.rlim_cur), "ulimit -u");
  m.threads = threads > 0 ? static_cast<std::int64_t>(threads) : std::numeric_limits<std::int64_t>::max();
  return m;
}

std::string ratio_text(double ratio, const char* infinite) {
  if (!std::isfinite(ratio)) return infinite;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", ratio);
  return buf;
}

std::string counted(long long n, const char* noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

void check_train_size(const TrainConfig& t, int world, const Target& target, bool reference) {
  RunSize needs;
  needs.model = t.model;
  needs.batch = t.batch;
  needs.dataset = t.data_size();
  needs.world_size = world;
  needs.ranks_are_threads = target.process_world == nullptr && !target.backend->simulated;
  needs.replicas_on_host = target.engine->memory == MemorySpace::host;
  needs.optimizer_blocks = t.optimizer.kind == OptimizerKind::adam       ? 2
                           : t.optimizer.kind == OptimizerKind::momentum ? 1
                                                                         : 0;
  needs.reference = reference;
  check_run_size(needs);
}

void check_run_size(const RunSize& run, const MachineLimits& machine) {
  const double n = run.world_size;
  const std::string world_text = "--world-size " + std::to_string(run.world_size);
  // A few threads beside the ranks: the main thread, the launcher's, the timeout watchers.
  if (run.ranks_are_threads && run.world_size > 1 && static_cast<double>(machine.threads) < n + 8)
    throw UsageError(world_text +
                     " is too big for this machine: its ranks run as threads of one process, and this "
                     "process may start at most " +
                     std::to_string(machine.threads) + " threads (" + machine.threads_source + ")");

  // Bytes, in double so that no product overflows. Each factor is an upper estimate measured on the cpu
  // engine (resident memory of train and grad against model, batch and world size), with room to spare.
  const double p = static_cast<double>(parameter_count(run.model.dims));
  double widths = 0;
  for (int d : run.model.dims) widths += d;
  const double in_out = run.model.dims.size() < 2 ? 0.0 : run.model.in_dim() + run.model.out_dim();
  const double replicas = run.ranks_are_threads ? n : 1;
  const double batch = static_cast<double>(run.batch);
  const double rank_batch = run.ranks_are_threads ? batch : std::ceil(batch / n);
  const double dataset = static_cast<double>(run.dataset > 0 ? run.dataset : run.batch);

  // Parameters, gradients, the loaded copy and optimizer state, each also copied for a checkpoint.
  double model_bytes = 4 * p * (run.replicas_on_host ? replicas * (5 + 3.0 * run.optimizer_blocks) : 0) + 4 * p;
  // Activations, pre-activations and deltas of every layer, and the gathered inputs and targets.
  double batch_bytes = rank_batch * (12 * widths + 8 * in_out);
  // Each rank's order of the data set and its share of it, every epoch.
  const double dataset_bytes = replicas * 16 * dataset;
  // A thread's stack and bookkeeping, and every rank's view of every other's call.
  double world_bytes = run.ranks_are_threads ? n * 65536 + n * n * 48 : n * 48;
  if (run.reference) {
    model_bytes += 64 * p + 4 * p * n;  // float64 gradient, magnitudes and bounds; every share's gradient
    batch_bytes += batch * (48 * widths + 4 * in_out);
    if (run.json) model_bytes += 40 * p * (n + 5);
  }
  const double total = model_bytes + batch_bytes + dataset_bytes + world_bytes;
  const double largest = std::max({model_bytes, batch_bytes, dataset_bytes, world_bytes});
  std::string culprit;
  if (largest == model_bytes)
    culprit = "--model " + dims_string(run.model.dims) + " (" + std::to_string(static_cast<std::int64_t>(p)) +
              " parameters" + (replicas > 1 ? ", " + std::to_string(run.world_size) + " replicas" : std::string()) +
              ")";
  else if (largest == batch_bytes) culprit = "--batch " + std::to_string(run.batch);
  else if (largest == dataset_bytes) culprit = "--dataset-size " + std::to_string(static_cast<std::int64_t>(dataset));
  else culprit = world_text;
  require_memory(total, culprit,
                 "model " + gib(model_bytes) + ", batch " + gib(batch_bytes) + ", data set order " +
                     gib(dataset_bytes) + ", ranks " + gib(world_bytes),
                 machine);
}

void require_memory(double bytes, const std::string& input, const std::string& parts, const MachineLimits& machine) {
  // The estimates are generous; the margin is for what else runs on the machine meanwhile.
  if (bytes <= 0.9 * machine.memory_bytes) return;
  throw UsageError(input + " is too big for this machine: the run needs about " + gib(bytes) + " of memory" +
                   (parts.empty() ? "" : " (" + parts + ")") + " and " + gib(machine.memory_bytes) + " is available (" +
                   machine.memory_source + ")");
}

}  // namespace dpcheck::cli
