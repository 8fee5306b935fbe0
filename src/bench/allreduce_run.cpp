// `dpcheck bench allreduce` as a whole run (src/bench/allreduce_run.hpp): the plan of a run, the run,
// and a worker's rows under mpirun.
#include "src/bench/allreduce_run.hpp"

#include <algorithm>

#include "src/choice.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"

namespace dpcheck::bench {

namespace {

// Why the process rows cannot run here, or "" when they can.
std::string why_no_process_rows(const std::string& mpirun) {
  if (!mpi_available()) return "this build has no MPI backend (configure with -DDPCHECK_MPI=ON)";
  if (mpirun.empty()) return "mpirun is not on PATH";
  if (launched_by_mpi())
    return "this process was started by an MPI launcher; run `dpcheck bench allreduce` without one and it "
           "starts its own";
  return {};
}

void append_rows(std::vector<AllreduceRow>& rows, const std::vector<AllreduceRow>& more) {
  rows.insert(rows.end(), more.begin(), more.end());
}

}  // namespace

AllreducePlan plan_allreduce(const std::vector<const Backend*>& backends, std::vector<BenchBackend> plugins) {
  AllreducePlan plan;
  plan.plugins = std::move(plugins);
  const bool chosen = !backends.empty() || !plan.plugins.empty();
  const std::vector<const Backend*> rows = chosen ? backends : allreduce_backends();
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

std::vector<AllreduceRow> allreduce_worker_rows(const std::vector<const Backend*>& backends, const AllreduceConfig& cfg,
                                                Communicator& world) {
  const MemcpyBaseline no_baseline;  // the parent measured it and sets the ratios
  std::vector<AllreduceRow> rows;
  for (const Backend* row : backends) {
    if (row->ranks_as_threads())
      throw UsageError("bench allreduce-worker runs the process backends, not " + allreduce_name(*row));
    append_rows(rows, bench_allreduce(process_backend(*row, allreduce_name(*row), world), cfg, no_baseline));
  }
  return rows;
}

}  // namespace dpcheck::bench
