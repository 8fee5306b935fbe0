// `dpcheck bench allreduce` as a whole run (src/bench/allreduce_run.hpp): its backends from the backend
// table, the plan of a run, the run, and a worker's rows under mpirun.
#include "src/bench/allreduce_run.hpp"

#include <algorithm>
#include <cctype>

#include "src/choice.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/target/plugin_comm.hpp"

namespace dpcheck::bench {

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

// Why the process rows cannot run here, or "" when they can.
std::string why_no_process_rows(const std::string& mpirun) {
  if (!mpi_available()) return "this build has no MPI backend (configure with -DDPCHECK_MPI=ON)";
  if (mpirun.empty()) return "mpirun is not on PATH";
  if (launched_by_mpi())
    return "this process was started by an MPI launcher; run `dpcheck bench allreduce` without one and it "
           "starts its own";
  return {};
}

// A plugin's rows: its ranks as threads of this process, beside the table's.
BenchBackend plugin_backend(const std::string& path) {
  if (!looks_like_plugin_path(path))
    throw UsageError("--comm " + path + ": give a communicator plugin's path (the built-in backends go in --backends)");
  // Loads and checks it: a host-memory plugin.
  const Backend& row = backend_for(std::string(engine_for_memory(MemorySpace::host).name), path);
  return thread_backend(row, load_comm_plugin(path).name);
}

void append_rows(std::vector<AllreduceRow>& rows, const std::vector<AllreduceRow>& more) {
  rows.insert(rows.end(), more.begin(), more.end());
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

AllreducePlan plan_allreduce(std::string_view backends, const std::vector<std::string>& plugins) {
  AllreducePlan plan;
  for (const std::string& path : plugins) plan.plugins.push_back(plugin_backend(path));
  const bool chosen = !backends.empty() || !plan.plugins.empty();
  const std::vector<const Backend*> rows = !backends.empty() ? parse_allreduce_backends(backends)
                                           : chosen          ? std::vector<const Backend*>{}
                                                             : allreduce_backends();
  for (const Backend* row : rows) {
    if (row->ranks_as_threads()) plan.threads.push_back(thread_backend(*row, allreduce_name(*row)));
    else plan.processes.push_back(allreduce_name(*row));
  }
  if (plan.processes.empty()) return plan;
  plan.launch.mpirun = find_in_path("mpirun");
  const std::string why = why_no_process_rows(plan.launch.mpirun);
  const std::vector<std::string> process_names = allreduce_process_names();
  if (!why.empty()) {
    if (chosen) throw UsageError("--backends: " + plan.processes.front() + " cannot run: " + why);
    plan.notes.push_back("no " + or_list(process_names) + " rows: " + why);
    plan.processes.clear();
  } else {
    plan.launch.dpcheck = self_executable().string();
    plan.notes.push_back(and_list(process_names) + " rows: " + plan.launch.mpirun + " --oversubscribe -np N, " +
                         "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 in the ranks");
  }
  return plan;
}

AllreduceResult run_allreduce(const AllreducePlan& plan, const AllreduceConfig& cfg) {
  AllreduceResult r;
  r.baseline = measure_memcpy();
  for (const BenchBackend& b : plan.threads) append_rows(r.rows, bench_allreduce(b, cfg, r.baseline));
  if (!plan.processes.empty())
    append_rows(r.rows, allreduce_rows_via_mpirun(plan.launch, plan.processes, cfg, r.baseline));
  for (const BenchBackend& b : plan.plugins) append_rows(r.rows, bench_allreduce(b, cfg, r.baseline));
  // The backends side by side for each world size and message size.
  std::vector<std::string> names;
  for (const Backend* row : allreduce_backends()) names.push_back(allreduce_name(*row));
  const auto order = [&](const std::string& b) { return std::find(names.begin(), names.end(), b) - names.begin(); };
  std::stable_sort(r.rows.begin(), r.rows.end(), [&](const AllreduceRow& a, const AllreduceRow& b) {
    if (a.ranks != b.ranks) return a.ranks < b.ranks;
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    return order(a.backend) < order(b.backend);
  });
  return r;
}

std::vector<AllreduceRow> allreduce_worker_rows(std::string_view backends, const AllreduceConfig& cfg,
                                                Communicator& world) {
  const MemcpyBaseline no_baseline;  // the parent measured it and sets the ratios
  std::vector<AllreduceRow> rows;
  for (const Backend* row : parse_allreduce_backends(backends)) {
    if (row->ranks_as_threads())
      throw UsageError("bench allreduce-worker runs the process backends, not " + allreduce_name(*row));
    append_rows(rows, bench_allreduce(process_backend(*row, allreduce_name(*row), world), cfg, no_baseline));
  }
  return rows;
}

}  // namespace dpcheck::bench
