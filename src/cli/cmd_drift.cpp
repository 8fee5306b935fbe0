// dpcheck drift: the classic complaint, "the same seed on 4 ranks and on 8 drifts apart", answered from
// the two runs' checkpoints (train --checkpoint-every 1). Each run's every step is replayed from its own
// checkpoint, on the target, and held against the float64 reference within the derived bound, and the
// replay must give the bits the run recorded next. When every step of both runs stays within the bound,
// the drift is rounding, amplified by training (the table shows how far apart the runs grow); otherwise
// the first step that leaves it is a bug, named with its phase, rank and element and the command that
// replays it. Each run replays on the target its trace's header names (--trace-a, --trace-b), or on the
// one the options give. Exit status: 0 rounding, 1 a bug (or a recorded step the target does not give again).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "divergence/divergence.hpp"
#include "python/torch_record.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/json_limits.hpp"

namespace dpcheck::cli {

namespace {

struct DriftOptions {
  std::string a, b, x, y, trace[2];
  std::int64_t from = 0;
  TargetOptions target;
};

// The target a trace's header names (train --trace), with the options' timeout.
Target trace_target(const std::string& path, const char* option, const Target& options) {
  const std::string where = std::string(option) + " " + path;
  // /dev/zero would be read for ever, a FIFO would block: a trace is a regular file.
  check_input_file(path, where);
  std::ifstream in(path);
  std::string line;
  bool too_long = false;
  if (!in || !read_bounded_line(in, line, too_long)) throw UsageError(where + ": cannot read its first line");
  if (too_long) throw UsageError(where + ": its first line is " + line_length_reason());
  nlohmann::json header;
  check_json_depth(line, where);
  try {
    header = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    throw UsageError(where + ": its first line is not JSON");
  }
  if (!header.is_object() || !header.contains("dpcheck_trace") || !header.contains("target") ||
      !header["target"].is_object())
    throw UsageError(where + ": not a trace of train --trace (no \"target\" in its header)");
  try {
    TargetRecord t = target_from_json(header["target"]);
    t.timeout = options.timeout;
    return resolve_target(t);
  } catch (const UsageError& e) {
    throw UsageError(where + ": " + e.what());
  }
}

// Two records of real PyTorch jobs (dpcheck.torch's Monitor(record=DIR)): each recorded step held to the
// bound from its own parameters, and each step starting where the one before it ended.
int drift_torch(DriftOptions& o, const CLI::App& sub) {
  for (const char* option : {"--x", "--y", "--trace-a", "--trace-b", "--engine", "--comm", "--kernels"})
    if (sub.count(option) > 0)
      throw UsageError(std::string(option) +
                       " does not apply to records of PyTorch jobs: their steps are judged as recorded");
  for (const std::string* p : {&o.a, &o.b})
    if (!torchjob::is_record(*p))
      throw UsageError(*p +
                       " is not a record of dpcheck.torch (Monitor(record=DIR)), and the other run is: drift compares "
                       "two records, or two --checkpoint-dir directories");
  const torchjob::Record records[2] = {torchjob::read_record(o.a), torchjob::read_record(o.b)};
  for (const torchjob::Record& r : records)
    if (r.header.failure)
      throw UsageError(r.dir.string() + " is a bundle of one failed step: drift reads a record of every step");
  // Everything is read and judged before the first line, so that bad input ends with one line.
  const torchjob::RecordDrift r = torchjob::record_drift(records, o.from);
  if (r.steps.empty())
    throw UsageError("no step from " + std::to_string(o.from) + " that both " + o.a + " and " + o.b + " recorded");
  std::printf("dpcheck drift: A %s (PyTorch %s, %s, %s, %s), B %s (PyTorch %s, %s, %s, %s)\n", o.a.c_str(),
              records[0].header.torch_version.c_str(), records[0].header.backend.c_str(),
              counted(records[0].header.world_size, "rank").c_str(), records[0].header.optimizer_name.c_str(),
              o.b.c_str(), records[1].header.torch_version.c_str(), records[1].header.backend.c_str(),
              counted(records[1].header.world_size, "rank").c_str(), records[1].header.optimizer_name.c_str());
  for (int k = 0; k < 2; ++k)
    if (!records[k].header.optimizer)
      std::printf("%s's updates are not judged: %s\n", k == 0 ? "A" : "B",
                  records[k].header.optimizer_not_judged.c_str());
  std::printf("\n%5s  %-10s %-10s %-11s %-11s %s\n", "step", "A ratio", "B ratio", "A next", "B next",
              "A-B apart after (ulp)");
  for (const torchjob::RecordDriftStep& s : r.steps)
    std::printf("%5lld  %-10s %-10s %-11s %-11s %llu\n", static_cast<long long>(s.step),
                ratio_text(s.ratio[0], "inf").c_str(), ratio_text(s.ratio[1], "inf").c_str(),
                s.between[0].empty() ? "continues" : "CHANGED", s.between[1].empty() ? "continues" : "CHANGED",
                static_cast<unsigned long long>(s.apart_ulp));
  for (int k = 0; k < 2; ++k)
    if (r.only[k] > 0)
      std::printf("%s also recorded %s that %s did not (compared: the %s both recorded)\n", k == 0 ? "A" : "B",
                  counted(r.only[k], "step").c_str(), k == 0 ? "B" : "A",
                  counted(static_cast<long long>(r.steps.size()), "step").c_str());
  if (r.bug_run >= 0 && r.bug_between_steps) {
    std::printf(
        "\nbug in %s, outside the optimizer's step: %s; something in the job between two steps changed what the "
        "next one starts from\n",
        r.bug_run == 0 ? "A" : "B", r.bug_where.c_str());
    return exit_check_failed;
  }
  if (r.bug_run >= 0) {
    const std::string& path = r.bug_run == 0 ? o.a : o.b;
    std::printf("\nbug: step %lld of %s: %s; replay it with: dpcheck replay %s --step %lld\n",
                static_cast<long long>(r.bug_step), r.bug_run == 0 ? "A" : "B", r.bug_where.c_str(),
                shell_word(path).c_str(), static_cast<long long>(r.bug_step));
    return exit_check_failed;
  }
  std::printf(
      "\nrounding, amplified by training: every recorded step of both runs stays within the bound from its own "
      "parameters, and each starts where the one before it ended; the runs end %llu ulp apart\n",
      static_cast<unsigned long long>(r.steps.back().apart_ulp));
  return exit_ok;
}

int run_drift(DriftOptions& o, const CLI::App& sub) {
  if (o.from < 0) throw UsageError("--from must be at least 0");
  if (torchjob::is_record(o.a) || torchjob::is_record(o.b)) return drift_torch(o, sub);
  const CheckpointRun runs[2] = {read_checkpoint_run(o.a), read_checkpoint_run(o.b)};
  if (runs[0].config.model.dims != runs[1].config.model.dims)
    throw UsageError(o.a + " and " + o.b + " hold different models (" + dims_string(runs[0].config.model.dims) +
                     " and " + dims_string(runs[1].config.model.dims) + ")");
  if (o.x.empty() != o.y.empty()) throw UsageError("give both --x and --y, or neither");
  if (process_world()) throw UsageError("drift runs each run's ranks as threads: start it without a launcher");
  // Each run replays on the target its trace names (engine, communicator, kernels, mutant), or on the
  // one the options give.
  Target targets[2];
  for (int k = 0; k < 2; ++k) {
    Target& t = targets[k];
    t = o.target.target();
    if (!o.trace[k].empty()) t = trace_target(o.trace[k], k == 0 ? "--trace-a" : "--trace-b", t);
    t.world_size = runs[k].world_size;
    validate_target(t);
  }
  std::unique_ptr<Dataset> data[2];
  for (int k = 0; k < 2; ++k) {
    const TrainConfig& c = runs[k].config;
    if (!o.x.empty()) {
      data[k] = std::make_unique<ArrayDataset>(ArrayDataset::load(o.x, o.y, c.model));
      if (data[k]->size() != c.data_size())
        throw UsageError(o.x + " holds " + std::to_string(data[k]->size()) + " examples; the run had " +
                         std::to_string(c.data_size()));
    } else {
      data[k] = std::make_unique<SyntheticDataset>(c.data_size(), c.model, c.seed);
    }
  }
  const Dataset* const views[2] = {data[0].get(), data[1].get()};
  for (int k = 0; k < 2; ++k) check_train_size(runs[k].config, runs[k].world_size, targets[k], true);
  std::printf("dpcheck drift: A %s (%d ranks, %s), B %s (%d ranks, %s)\n", o.a.c_str(), runs[0].world_size,
              targets[0].describe().c_str(), o.b.c_str(), runs[1].world_size, targets[1].describe().c_str());
  // Checkpoints do not say where their data came from: say what the replays train on.
  if (o.x.empty())
    std::printf("data: synthetic, from each run's seed (give --x and --y if the runs trained on files)\n");
  std::fflush(stdout);
  const DriftReport r = rounding_or_bug(targets, runs, views, o.from);
  if (r.steps.empty())
    throw UsageError("no step s from " + std::to_string(o.from) + " at which both " + o.a + " and " + o.b +
                     " hold checkpoints s and s + 1 (train with --checkpoint-every 1 and --keep large enough)");
  std::printf("\n%5s  %-10s %-10s %-14s %-14s %s\n", "step", "A ratio", "B ratio", "A replayed", "B replayed",
              "A-B apart after (ulp)");
  for (const DriftStep& s : r.steps)
    std::printf("%5lld  %-10s %-10s %-14s %-14s %llu\n", static_cast<long long>(s.step),
                ratio_text(s.ratio[0], "inf").c_str(), ratio_text(s.ratio[1], "inf").c_str(),
                s.same_bits[0] ? "same bits" : "OTHER BITS", s.same_bits[1] ? "same bits" : "OTHER BITS",
                static_cast<unsigned long long>(s.apart_ulp));
  const char* name[2] = {"A", "B"};
  const std::string* path[2] = {&o.a, &o.b};
  if (r.bug_run >= 0) {
    const Target& t = targets[r.bug_run];
    std::string cmd = "dpcheck replay " + shell_word(*path[r.bug_run]) + " --step " + std::to_string(r.bug_step) +
                      TargetOptions::flags(t);
    if (!o.x.empty()) cmd += " --x " + shell_word(o.x) + " --y " + shell_word(o.y);
    std::printf("\nbug: step %lld of %s leaves the bound from its own parameters (%s); replay it with: %s\n",
                static_cast<long long>(r.bug_step), name[r.bug_run], r.bug_where.c_str(), cmd.c_str());
    return exit_check_failed;
  }
  if (r.unreproduced_run >= 0) {
    std::printf(
        "\nnot decided: step %lld of %s replayed on this target does not give the bits the run recorded next "
        "(was it run on another engine, communicator, kernels or data? give them, or its trace)\n",
        static_cast<long long>(r.unreproduced_step), name[r.unreproduced_run]);
    return exit_check_failed;
  }
  std::printf(
      "\nrounding, amplified by training: every step of both runs stays within the bound from its own "
      "parameters, and replays to the bits recorded; the runs end %llu ulp apart\n",
      static_cast<unsigned long long>(r.steps.back().apart_ulp));
  return exit_ok;
}

}  // namespace

Runner add_drift(CLI::App& app) {
  auto o = std::make_shared<DriftOptions>();
  CLI::App* sub = app.add_subcommand(
      "drift", "Rounding or bug? Two runs that drift apart, from their checkpoints (train --checkpoint-every 1)");
  sub->add_option(
         "a", o->a,
         "The first run's --checkpoint-dir, or a record of a PyTorch job (dpcheck.torch's Monitor(record=DIR))")
      ->required();
  sub->add_option("b", o->b, "The second run's, of the same kind")->required();
  sub->add_option("--trace-a", o->trace[0], "A's trace (train --trace): its header says the target A trained on");
  sub->add_option("--trace-b", o->trace[1], "B's trace: the target B trained on");
  namespace f = target_option;
  o->target.add_to(*sub, f::engine | f::comm | f::kernels | f::timeout);
  o->target.reword("--engine", "Without a trace: the engine the runs trained on (" + engine_option_help() + ")");
  o->target.reword("--comm", "The communicator they trained over (default: the engine's)");
  sub->add_option("--x", o->x, "Inputs .npy, when the runs trained on --x/--y");
  sub->add_option("--y", o->y, "Targets .npy, with --x");
  sub->add_option("--from", o->from, "The first step to look at (default 0)");
  return [o, sub] { return run_drift(*o, *sub); };
}

}  // namespace dpcheck::cli
