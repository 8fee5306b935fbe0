// The `dpcheck bench` harness: collective benchmarks in the style of nccl-tests, one table a run.
// A row is measured by running N ranks of a backend (BenchBackend): a row of the backend table
// (src/target/backends.hpp), whose ranks are threads here or a launcher's processes, or a communicator plugin,
// so that every backend and baseline (dpcheck's "mpi" Communicator, a bare MPI_Allreduce) adds rows to
// the same table. Every row also checks its result against a closed form (#wrong, 0 ULP), and sets its
// memory traffic against a memcpy measured in the same run, because on a shared, noisy machine only
// ratios taken together mean anything.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm.hpp"
#include "src/target/backends.hpp"

namespace dpcheck::bench {

// Runs fn once on each of `ranks` ranks of one backend and returns when all have returned; an
// exception on any rank ends the run and is rethrown. Results are read from rank 0.
using RankLauncher = std::function<void(int ranks, const std::function<void(Communicator&)>& fn)>;

struct BenchBackend {
  std::string name;  // the table's backend column
  RankLauncher run;
};

// The median of a non-empty sample (the upper one of an even count): what every bench reports.
double median(std::vector<double> v);

// A row of the backend table whose ranks are threads of this process (Backend::run_threads), under
// `name` in the table of rows.
BenchBackend thread_backend(const Backend& row, std::string name,
                            std::chrono::milliseconds timeout = Communicator::default_timeout);

// This process's rank of a world of processes (one process per rank, started by a launcher), through
// the row's run_processes over `world`, whose size must equal the rank count asked for; under `name` in
// the table of rows. Rows come back on rank 0 only.
BenchBackend process_backend(const Backend& row, std::string name, Communicator& world);

// The bandwidth a plain copy reaches here, counting bytes read plus bytes written: `threads` threads
// each copy their share of a `bytes` buffer, touched beforehand; the median of `repeats` runs.
struct MemcpyBaseline {
  std::size_t bytes = 0;
  int threads = 0;
  int repeats = 0;
  double gbs = 0;  // 2 * bytes / median time, in 1e9 bytes per second
};
MemcpyBaseline measure_memcpy(std::size_t bytes = std::size_t{64} << 20, int threads = 2, int repeats = 15);

// In-place float32 sum all-reduce.
struct AllreduceConfig {
  std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20};  // bytes
  std::vector<int> ranks{2, 4};
  int iters = 0;  // timed calls per row; 0 picks enough for about row_seconds
  int warmup = 3;
  double row_seconds = 0.25;
};

struct AllreduceRow {
  std::string backend;
  int ranks = 0;
  std::size_t bytes = 0;
  std::size_t count = 0;  // float32 elements
  int iters = 0;
  double time_us = 0;       // median per call
  double algbw_gbs = 0;     // bytes / time
  double busbw_gbs = 0;     // algbw * 2(N-1)/N, as nccl-tests reports it
  double traffic_gbs = 0;   // 2 * N * bytes / time: every rank's buffer read once and written once
  double memcpy_ratio = 0;  // traffic / the memcpy baseline
  std::uint64_t wrong = 0;  // elements that differ from the closed form, summed over ranks
};

// One row per (N, size), in the order of cfg.ranks then cfg.sizes. Each rank allocates and touches its
// buffer once per N, at the largest size, before anything is timed. Throws UsageError for a size that
// is not a positive multiple of 4 bytes or a rank count below 1.
std::vector<AllreduceRow> bench_allreduce(const BenchBackend& backend, const AllreduceConfig& cfg,
                                          const MemcpyBaseline& baseline);

// notes: lines printed under the table's header (and listed in the JSON), e.g. why a backend is missing.
void print_allreduce_table(std::ostream& out, const MemcpyBaseline& baseline, const std::vector<AllreduceRow>& rows,
                           const std::vector<std::string>& notes = {});
nlohmann::ordered_json allreduce_json(const MemcpyBaseline& baseline, const std::vector<AllreduceRow>& rows,
                                      const std::vector<std::string>& notes = {});
// The rows of allreduce_json read back (how a worker process hands its rows to the parent); Error
// when a field is missing or of the wrong type.
std::vector<AllreduceRow> allreduce_rows_from_json(const nlohmann::json& j);

// ---- rows from other processes: mpirun and a worker ------------------------------------------------

// The line prefix under which a worker prints its rows (one JSON object) on rank 0's standard output.
inline constexpr std::string_view worker_rows_prefix = "dpcheck-allreduce-rows: ";

// How the parent starts a worker: `mpirun` (a path), this dpcheck binary, and how long one launch may
// take before mpirun is sent SIGTERM (which it passes on to its ranks).
struct MpiWorkerLaunch {
  std::string mpirun;
  std::string dpcheck;
  std::chrono::seconds limit{600};
};

// Runs `mpirun -np ranks <dpcheck> worker_args...` (with the malloc settings below) and returns the
// JSON object its rank 0 printed on the line that starts with `prefix`. Error naming the command and
// the end of its standard error when it fails or prints no such line.
nlohmann::json run_mpi_worker(const MpiWorkerLaunch& launch, int ranks, const std::vector<std::string>& worker_args,
                              std::string_view prefix);

// Runs the rows of the process backends (named as in the table of rows, allreduce_name in
// src/bench/allreduce_run.hpp) for each N of cfg.ranks:
// one `mpirun -np N dpcheck bench allreduce-worker ...` per N, with glibc's malloc told to keep freed
// memory (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_), since fresh pages cost far more than the copy.
// The rows' memcpy ratio is set against `baseline`. Error naming the command and its standard error
// when a launch fails.
std::vector<AllreduceRow> allreduce_rows_via_mpirun(const MpiWorkerLaunch& launch,
                                                    const std::vector<std::string>& backends,
                                                    const AllreduceConfig& cfg, const MemcpyBaseline& baseline);

// "4096", "4K", "1M", "2G" (binary multiples, either case) to bytes; throws UsageError for anything
// else, including zero and negative sizes.
std::size_t parse_size(std::string_view text);
// A comma-separated list of sizes: "4K,1M,64M".
std::vector<std::size_t> parse_sizes(std::string_view list);
// A comma-separated list of world sizes, each from 1 to max_ranks: "2,4".
std::vector<int> parse_ranks(std::string_view list);
inline constexpr int max_ranks = 256;

}  // namespace dpcheck::bench
