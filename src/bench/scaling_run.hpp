// `dpcheck bench scaling` as a run (src/cli/cmd_bench_scaling.cpp parses its options and prints what this
// returns): each N's figures, measured by its ranks together, as threads of this process or as processes
// under an mpirun started for that N (`dpcheck bench scaling-worker`, whose rank 0 prints its figures as
// one JSON line); the report made of them with the speed-up model (src/bench/scaling.hpp); and the report
// as the table the command prints.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/target/target.hpp"

namespace dpcheck::scaling {

// What bench scaling measures, and how long.
struct Setup {
  Target target;         // engine and communicator (in a worker, its process world and world size)
  TrainConfig train;     // the trainer's, from train_config
  int steps = 5;         // timed steps of each measurement; the median is reported
  int warmup = 2;        // untimed steps first
  double bucket_mb = 1;  // the bucket size of the overlapped rows, MiB
};

// The trainer of bench scaling: `model` and `batch`, stepped as often as the measurement needs.
TrainConfig train_config(const ModelConfig& model, std::int64_t batch);

// The line prefix under which a worker prints its world's figures (one JSON object) on rank 0's
// standard output.
inline constexpr std::string_view worker_world_prefix = "dpcheck-scaling-world: ";

// One world's figures, measured by every rank of `comm` together (every rank returns them): the compute
// of a step on this rank's share of the batch (the slowest rank's median), the all-reduce (avg) of a
// sweep of sizes up to the gradient's in the gradient's own buffer, and the data-parallel step as train
// runs it without buckets and with them, with the communication each leaves exposed. JSON fields ranks,
// compute_s, step_s, step_bucketed_s, exposed_s, exposed_bucketed_s, buckets, buckets_overlapped and
// allreduce ([{bytes, seconds}], empty on one rank).
nlohmann::json measure_world(const Setup& setup, Communicator& comm);

// measure_world's figures for each N = 1..world_size, in order. The ranks are threads here (run_world)
// unless the target's backend needs a launcher; then each N is `mpirun -np N <this binary>
// worker_args...`, whose rank 0 prints its figures under worker_world_prefix (UsageError when mpirun is
// not on PATH). on_world(N) is called before each N is measured.
std::vector<nlohmann::json> measure_worlds(const Setup& setup, int world_size,
                                           const std::vector<std::string>& worker_args,
                                           const std::function<void(int n)>& on_world);

// The report of bench scaling from each N's figures (worlds[i] for N = i + 1): the alpha-beta fit over
// every N's sweep, the prediction against the measurement per N, and the break-even N predicted (beyond
// the sweep with the fitted all-reduce and a compute of c0 + c1/N fitted to the measured one) and
// measured. JSON fields command, model, batch, engine, comm, gradient_bytes, bucket_mb, fit (null without
// one), rows and break_even.
nlohmann::json make_report(const Setup& setup, const std::vector<nlohmann::json>& worlds);

// The report as bench scaling prints it: a header, the fit, a row per N and the break-even.
void print_report(std::ostream& out, const nlohmann::json& report);

}  // namespace dpcheck::scaling
