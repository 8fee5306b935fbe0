// `dpcheck bench allreduce` as a whole run (src/cli/cmd_bench.cpp parses its options and prints what
// this returns). Its backends are the rows of the backend table (src/target/backends.hpp) whose Backend::bench
// says so, in table order, and communicator plugins: a row whose ranks are threads runs here, one whose
// ranks are processes runs under an mpirun started for each N (`dpcheck bench allreduce-worker`, whose
// rank 0 prints its rows as one JSON line), and a plugin runs its ranks as threads here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/bench/bench.hpp"
#include "src/target/backends.hpp"

namespace dpcheck::bench {

// What a run of bench allreduce runs, in this order: the table's rows whose ranks are threads here,
// the rows whose ranks are processes (by their names in the table of rows) under `launch`, and the
// plugins' rows.
struct AllreducePlan {
  std::vector<BenchBackend> threads;
  std::vector<std::string> processes;
  MpiWorkerLaunch launch;
  std::vector<BenchBackend> plugins;
  std::vector<std::string> notes;  // for the table's header: how the process rows run, or why they do not
};

// The plan for the rows of --backends (parse_allreduce_backends; none: every row of allreduce_backends
// that can run here, with a note saying why the process rows cannot when they cannot) and the rows of
// communicator plugins (--comm, a host-memory plugin each, loaded by the CLI; with them and no
// --backends, the plugins' rows alone). UsageError for a process row asked for by --backends that cannot
// run here (no MPI in this build, no mpirun on PATH, or this process started by a launcher).
AllreducePlan plan_allreduce(const std::vector<const Backend*>& backends, std::vector<BenchBackend> plugins);

struct AllreduceResult {
  MemcpyBaseline baseline;
  std::vector<AllreduceRow> rows;
};

// Measures the memcpy baseline, then runs the plan's rows, and returns them sorted for the table: by N,
// then size, then backend in table order, the plugins' rows last.
AllreduceResult run_allreduce(const AllreducePlan& plan, const AllreduceConfig& cfg);

// One rank of a worker under mpirun: the rows of the process rows `backends` (parse_allreduce_backends),
// each run on `world` (cfg.ranks being its size), without memcpy ratios (the parent sets them); rows on
// rank 0 only. UsageError for a row whose ranks are threads.
std::vector<AllreduceRow> allreduce_worker_rows(const std::vector<const Backend*>& backends, const AllreduceConfig& cfg,
                                                Communicator& world);

}  // namespace dpcheck::bench
