// The `dpcheck bench` harness: collective benchmarks in the style of nccl-tests, one table a run.
// A row is measured by running N ranks of a backend (BenchBackend), so that other backends and
// baselines (an "mpi" Communicator, a bare MPI_Allreduce) add rows to the same table by supplying their
// own launcher. Every row also checks its result against a closed form (#wrong, 0 ULP), and sets its
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

namespace dpcheck::bench {

// Runs fn once on each of `ranks` ranks of one backend and returns when all have returned; an
// exception on any rank ends the run and is rethrown. Results are read from rank 0.
using RankLauncher = std::function<void(int ranks, const std::function<void(Communicator&)>& fn)>;

struct BenchBackend {
  std::string name;  // the table's backend column
  RankLauncher run;
};

// Ranks as threads of this process (src/local_comm.hpp).
BenchBackend local_backend(std::chrono::milliseconds timeout = Communicator::default_timeout);

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

void print_allreduce_table(std::ostream& out, const MemcpyBaseline& baseline,
                           const std::vector<AllreduceRow>& rows);
nlohmann::ordered_json allreduce_json(const MemcpyBaseline& baseline, const std::vector<AllreduceRow>& rows);

// "4096", "4K", "1M", "2G" (binary multiples, either case) to bytes; throws UsageError for anything
// else, including zero and negative sizes.
std::size_t parse_size(std::string_view text);
// A comma-separated list of sizes: "4K,1M,64M".
std::vector<std::size_t> parse_sizes(std::string_view list);
// A comma-separated list of world sizes, each from 1 to max_ranks: "2,4".
std::vector<int> parse_ranks(std::string_view list);
inline constexpr int max_ranks = 256;

}  // namespace dpcheck::bench
