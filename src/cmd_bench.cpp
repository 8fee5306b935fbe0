// `dpcheck bench`: collective benchmarks in the style of nccl-tests (src/bench.hpp), one subcommand per
// collective. Each run measures its memcpy baseline first and prints one table; a wrong element in any
// row makes the exit status 1.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "src/bench.hpp"
#include "src/commands.hpp"
#include "src/error.hpp"

namespace dpcheck::cli {

namespace {

struct AllreduceArgs {
  std::string sizes = "4K,1M,64M";
  std::string ranks = "2,4";
  int iters = 0;
  int warmup = 3;
  std::string json;
};

int run_allreduce(const AllreduceArgs& args) {
  bench::AllreduceConfig cfg;
  cfg.sizes = bench::parse_sizes(args.sizes);
  cfg.ranks = bench::parse_ranks(args.ranks);
  if (args.iters < 0) throw UsageError("--iters must not be negative, got " + std::to_string(args.iters));
  if (args.warmup < 0) throw UsageError("--warmup must not be negative, got " + std::to_string(args.warmup));
  cfg.iters = args.iters;
  cfg.warmup = args.warmup;

  // Opened before the run, so that a bad path fails in a second rather than after the benchmark.
  std::ofstream json_file;
  if (!args.json.empty()) {
    json_file.open(args.json);
    if (!json_file) throw UsageError("--json: cannot open '" + args.json + "' for writing");
  }

  const bench::MemcpyBaseline baseline = bench::measure_memcpy();
  const std::vector<bench::AllreduceRow> rows = bench::bench_allreduce(bench::local_backend(), cfg, baseline);
  bench::print_allreduce_table(std::cout, baseline, rows);
  if (json_file.is_open()) {
    json_file << bench::allreduce_json(baseline, rows).dump(2) << "\n";
    if (!json_file.flush()) throw Error("--json: writing '" + args.json + "' failed");
  }
  for (const bench::AllreduceRow& r : rows)
    if (r.wrong > 0) return exit_check_failed;
  return exit_ok;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmark the collectives in the style of nccl-tests: one table a run");
  CLI::App* allreduce = bench->add_subcommand(
      "allreduce",
      "In-place float32 sum all-reduce per world size and message size, with a 0-ULP check of "
      "every element (#wrong) and a memcpy baseline measured in the same run");
  auto args = std::make_shared<AllreduceArgs>();
  allreduce
      ->add_option("--sizes", args->sizes, "Message sizes in bytes, comma-separated; K, M and G are binary")
      ->capture_default_str();
  allreduce->add_option("--ranks", args->ranks, "World sizes, comma-separated")->capture_default_str();
  allreduce->add_option("--iters", args->iters,
                        "Timed calls per row (default: enough for about 0.25 s a row)");
  allreduce->add_option("--warmup", args->warmup, "Untimed calls before timing each row")
      ->capture_default_str();
  allreduce->add_option("--json", args->json, "Also write the table as JSON to this file");
  // A name that is not a benchmark is kept aside and reported as a usage error below, with the list
  // of benchmarks, instead of a generic parse error.
  bench->allow_extras();
  allreduce->allow_extras(false);

  return [bench, allreduce, args]() -> int {
    if (allreduce->parsed()) return run_allreduce(*args);
    const std::vector<std::string> extra = bench->remaining();
    if (!extra.empty())
      throw UsageError("bench: unknown benchmark '" + extra.front() + "' (available: allreduce)");
    std::cerr << bench->help();
    return exit_usage;
  };
}

}  // namespace dpcheck::cli
