// `dpcheck bench rounding`: how far each all-reduce schedule's result falls from the exact average as N
// grows, measured on the schedules' bit-exact emulations (reference/allreduce_schedule.hpp), with the
// bound of each schedule's depth beside it. Every rank's buffer holds normally distributed values, as
// gradients are, rounded to the format; the error of an element is in units of its mean magnitude over
// the ranks, the scale on which the bound is gamma of the schedule's roundings whatever the inputs.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "reference/allreduce_schedule.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/cmd_bench_scaling.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"

namespace dpcheck::cli {

namespace {

struct RoundingArgs {
  std::string format = "bf16";
  std::vector<std::string> schedules{"ring", "tree"};
  int max_world = 4096;
  int elements = 1024;
  std::uint64_t seed = 1;
  std::string json;
};

// 2, 3, 4, 8, ... up to max_world, with the scale class's neighbours of powers of two (63, 65, 1000).
std::vector<int> rounding_worlds(int max_world) {
  std::vector<int> out;
  for (const int n : {2, 3, 4, 8, 16, 32, 63, 64, 65, 128, 256, 512, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 65536})
    if (n <= max_world) out.push_back(n);
  if (out.empty() || out.back() != max_world) out.push_back(max_world);
  return out;
}

std::vector<std::vector<float>> normal_inputs(int world, int elements, Precision format, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> in(static_cast<std::size_t>(world),
                                     std::vector<float>(static_cast<std::size_t>(elements)));
  for (auto& rank : in)
    for (float& v : rank) v = round_to_precision(normal(rng), format);
  return in;
}

std::string shown(double v) {
  if (std::isinf(v)) return "none";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

int run_rounding(const RoundingArgs& a) {
  if (a.max_world < 2 || a.max_world > 65536) throw UsageError("--max-world must be from 2 to 65536");
  if (a.elements < 1 || a.elements > (1 << 20)) throw UsageError("--elements must be from 1 to 1048576");
  if (static_cast<double>(a.max_world) * a.elements > 1 << 26)
    throw UsageError("--max-world times --elements must stay within 2^26 values, 256 MiB of inputs (" +
                     std::to_string(a.max_world) + " x " + std::to_string(a.elements) + " is more)");
  if (a.format != "fp32" && a.format != "bf16" && a.format != "fp16")
    throw UsageError("unknown --format '" + a.format + "' (choose fp32, bf16 or fp16)");
  const Precision format = parse_precision(a.format);
  std::vector<reference::ScheduleOptions> schedules;
  for (const std::string& text : a.schedules) {
    reference::ScheduleOptions o;
    try {
      o = reference::parse_schedule(text);
    } catch (const UsageError& e) {  // named as this command's option
      throw UsageError("--schedules" + std::string(e.what()).substr(std::string("--schedule").size()));
    }
    o.format = format;
    o.average = true;
    schedules.push_back(o);
  }
  if (!a.json.empty()) check_output_path(a.json, "--json");

  std::printf(
      "dpcheck bench rounding: %s all-reduce (avg) of %d elements a rank, inputs N(0, 1) rounded to %s, seed %llu\n",
      std::string(precision_name(format)).c_str(), a.elements, std::string(precision_name(format)).c_str(),
      static_cast<unsigned long long>(a.seed));
  std::printf(
      "error: |result - float64 average| / mean |input|, largest over the elements (mean in brackets); "
      "bound: gamma of the schedule's roundings\n\n");
  std::printf("%7s", "N");
  for (const reference::ScheduleOptions& o : schedules) {
    const std::string name = reference::schedule_text(o);
    std::printf("  %22s  %9s", (name + " error").c_str(), "bound");
  }
  std::printf("\n");
  nlohmann::json rows = nlohmann::json::array();
  for (const int world : rounding_worlds(a.max_world)) {
    const auto inputs = normal_inputs(world, a.elements, format, a.seed + static_cast<std::uint64_t>(world));
    std::printf("%7d", world);
    nlohmann::json row{{"world_size", world}};
    for (const reference::ScheduleOptions& o : schedules) {
      const reference::ScheduleError e = reference::measure_schedule_error(o, inputs);
      std::printf("  %10s [%9s]  %9s", shown(e.max).c_str(), shown(e.mean).c_str(), shown(e.bound).c_str());
      row[reference::schedule_text(o)] = {{"max", e.max},
                                          {"mean", e.mean},
                                          {"bound", std::isinf(e.bound) ? nlohmann::json() : nlohmann::json(e.bound)}};
    }
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  if (!a.json.empty()) {
    const nlohmann::json report{
        {"format", precision_name(format)}, {"elements", a.elements}, {"seed", a.seed}, {"rows", rows}};
    write_file_atomic(a.json, report.dump(2) + "\n");
  }
  return exit_ok;
}

}  // namespace

BenchCommand add_bench_rounding(CLI::App& bench) {
  auto a = std::make_shared<RoundingArgs>();
  CLI::App* sub = bench.add_subcommand(
      "rounding",
      "Each all-reduce schedule's rounding error as N grows, measured on its bit-exact emulation against the float64 "
      "average, with the bound of its depth beside it");
  sub->add_option("--format", a->format, "The buffers' format: fp32, bf16 or fp16")->capture_default_str();
  sub->add_option("--schedules", a->schedules,
                  "Schedules to compare: rank-order, ring, tree, halving-doubling, hierarchical[:G]")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--max-world", a->max_world, "The largest N (2 to 65536)")->capture_default_str();
  sub->add_option("--elements", a->elements, "Elements a rank")->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the inputs")->capture_default_str();
  sub->add_option("--json", a->json, "Also write the table as JSON to this file");

  BenchCommand c;
  c.names = {"rounding"};
  c.run = [sub, a]() -> std::optional<int> {
    if (!sub->parsed()) return std::nullopt;
    return run_rounding(*a);
  };
  return c;
}

}  // namespace dpcheck::cli
