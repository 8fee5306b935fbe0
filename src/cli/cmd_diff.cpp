// `dpcheck diff A B`: where two runs part. Two traces (train --trace) are walked to the first step,
// phase, rank and tensor whose digest differs; two directories of .npy tensors (checkpoint steps, or
// PyTorch state_dicts saved with NumPy) are compared tensor by tensor against --ulp, --rtol or bit for
// bit. The work is divergence/diff.hpp's; this file reads the command line and says the verdict.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>

#include "divergence/diff.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"

namespace dpcheck::cli {

namespace {

struct DiffArgs {
  std::string a, b;
  std::string ulp, rtol;  // empty: not given
  std::string json;
};

double parse_rtol(const std::string& text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0)
    throw UsageError("--rtol '" + text + "': give a finite number >= 0, e.g. 1e-6");
  return v;
}

Tolerance parse_tolerance(const DiffArgs& args, const CLI::App& sub) {
  const bool ulp = sub.count("--ulp") > 0, rtol = sub.count("--rtol") > 0;
  // One rule per run, so that a verdict says which one it passed: an element within K ulp but beyond
  // the relative tolerance, or the other way round, would otherwise pass or fail by a rule nobody chose.
  if (ulp && rtol) throw UsageError("give --ulp or --rtol, not both");
  Tolerance t;
  if (ulp) {
    t.kind = Tolerance::Kind::ulp;
    t.ulp = parse_seed(args.ulp, "--ulp");
  }
  if (rtol) {
    t.kind = Tolerance::Kind::rtol;
    t.rtol = parse_rtol(args.rtol);
  }
  return t;
}

int run_diff(const DiffArgs& args, const CLI::App& sub) {
  const Tolerance tolerance = parse_tolerance(args, sub);
  const DiffInput ka = diff_input_kind(args.a, "A"), kb = diff_input_kind(args.b, "B");
  if (ka != kb)
    throw UsageError("A " + args.a + " is " + std::string(diff_input_name(ka)) + " and B " + args.b + " is " +
                     std::string(diff_input_name(kb)) + ": give two traces or two directories");
  if (ka == DiffInput::trace && tolerance.kind != Tolerance::Kind::bitwise)
    throw UsageError(std::string(tolerance.kind == Tolerance::Kind::ulp ? "--ulp" : "--rtol") +
                     " is for directories of .npy tensors; traces compare digest by digest");
  if (!args.json.empty()) check_output_path(args.json, "--json");

  const bool printing = is_printing_rank();
  if (ka == DiffInput::trace) {
    const TraceDiff d = diff_traces(args.a, args.b);
    if (printing) {
      print_trace_diff(std::cout, d);
      std::cout.flush();
      if (!args.json.empty()) write_file_atomic(args.json, to_json(d).dump(2) + "\n");
    }
    return d.identical() ? exit_ok : exit_check_failed;
  }
  const std::vector<TensorDiff> diffs = diff_tensor_dirs(args.a, args.b, tolerance);
  if (printing) {
    print_tensor_diffs(std::cout, args.a, args.b, diffs, tolerance);
    std::cout.flush();
    if (!args.json.empty()) write_file_atomic(args.json, to_json(args.a, args.b, diffs, tolerance).dump(2) + "\n");
  }
  return all_passed(diffs) ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_diff(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "diff",
      "Say where two runs part. A and B are two traces (train --trace FILE) or two directories of .npy\n"
      "tensors (a checkpoint step such as ckpt/step-00000012, or a PyTorch state_dict saved one .npy per key).\n"
      "Traces: compares the headers (configuration, world size, target) and lists what differs, then walks\n"
      "the steps both hold and, within a step, the phases (data, local gradient, all-reduce, optimizer, loss),\n"
      "ranks and tensors in order, and reports the first digest that differs with both sides' max_abs, sum\n"
      "and non-finite count, then how many other items of that step and how many later steps differ. With\n"
      "different world sizes only the replicated state is compared (rank 0's reduced gradient, parameters\n"
      "and optimizer state, and the loss).\n"
      ".npy directories: pairs the files by name (manifest.json and other files ignored) and prints for\n"
      "each tensor its shape and dtype, the largest ULP distance and relative difference |a-b|/max(|a|,|b|),\n"
      "how many elements differ, and the first differing element with both values; bit for bit unless --ulp\n"
      "or --rtol is given. A NaN equals only a NaN of the same bits; int64 tensors compare exactly.");
  sub->footer(
      "Exit status: 0 the traces are identical (a different configuration alone does not fail), or every\n"
      "tensor is within the tolerance; 1 a difference: a digest, a step one trace lacks, a tensor beyond the\n"
      "tolerance, a file on one side only, a shape or dtype that differs; 2 bad usage: a missing path, a\n"
      "trace and a directory, a malformed trace line, an unknown trace version, a directory with no .npy file.\n"
      "Examples: dpcheck diff cpu.jsonl cuda.jsonl\n"
      "          dpcheck diff ckpt-a/step-00000012 ckpt-b/step-00000012 --ulp 2");
  auto args = std::make_shared<DiffArgs>();
  sub->add_option("A", args->a, "A trace, or a directory of .npy tensors")->required()->type_name("PATH");
  sub->add_option("B", args->b, "The same kind as A")->required()->type_name("PATH");
  sub->add_option("--ulp", args->ulp, ".npy directories: pass when every element is within K units in the last place")
      ->type_name("K");
  sub->add_option("--rtol", args->rtol,
                  ".npy directories: pass when every element is within R relative difference (not with --ulp)")
      ->type_name("R");
  sub->add_option("--json", args->json, "Also write the report as JSON to FILE")->type_name("FILE");
  return [args, sub]() -> int { return run_diff(*args, *sub); };
}

}  // namespace dpcheck::cli
