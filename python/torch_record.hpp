// Records of a real PyTorch job's steps, as dpcheck.torch writes them (Monitor(record=DIR) for every
// step, Monitor(bundle_dir=DIR) for the step that failed a check), read back and judged here for
// `dpcheck replay` and `dpcheck drift`.
//
// A record is a directory: record.json (the job: world size, the model in dpcheck's family with the
// Linear layers' PyTorch names, the optimizer as dpcheck's reference knows it or why not, PyTorch's
// version and backend, the command line, and for a bundle the failure), and one step-NNNNNNNN/ a
// recorded step: step.json (the step, its parts -- each rank's micro-batches in order, with their
// example counts --, the learning rate and the optimizer's step count before it), params.npy and
// state.npy (rank 0's parameters as the step's forward pass saw them and the optimizer's state before
// the step, flat in src/train/model.hpp's layout, state block after block), x.npy and y.npy (the global
// batch, every part in order), grad.npy (the gradient the optimizer used) and params_after.npy and
// state_after.npy. Nothing in it is trusted: every file is read with its shape checked against the
// model, and every number of step.json against the others.
//
// A recorded step is judged as replay judges a phase of dpcheck's own step: the gradient against the
// float64 gradient of the global batch within the derived bound, with the weight fit of judge_gradient
// (python/torch_checks.hpp), and the update against the optimizer's formula in float64
// (reference::optimizer_step_bound). Two records of the same model answer drift's question -- rounding
// or bug -- from the recorded steps themselves: PyTorch's step cannot be run again here, so what each
// step did is held to the bound from its own parameters, and each step must start where the one before
// it ended.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "python/torch_checks.hpp"
#include "src/train/data.hpp"
#include "src/train/model.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck::torchjob {

inline constexpr int kRecordVersion = 1;

struct RecordHeader {
  int world_size = 1;
  ModelConfig model;
  std::vector<std::string> layer_names;      // the Linear layers' names in the job's nn.Sequential
  std::optional<OptimizerConfig> optimizer;  // lr: the first step's (each step records its own)
  std::string optimizer_name;                // PyTorch's class
  std::string optimizer_not_judged;          // why the update is not judged, when optimizer is empty
  std::string torch_version, backend;
  std::vector<std::string> command_line;
  std::optional<nlohmann::json> failure;  // a bundle's: {"kind", "step", "message"}

  // "layers.1.weight[0, 3]" in the job's own names: "2.weight[0, 3]".
  std::string torch_names(std::string text) const;
};

struct Record {
  std::filesystem::path dir;
  RecordHeader header;
  std::vector<std::int64_t> steps;  // ascending
};

struct RecordedStep {
  std::int64_t step = 0;
  std::vector<GradientPart> parts;  // each rank's micro-batches, in order
  std::vector<float> params, state, grad, params_after, state_after;
  std::int64_t optimizer_steps = 0;  // before the step
  double lr = 0;
  // A check of dpcheck.torch that failed in the job at this step: its kind and report.
  std::string failure_kind, failure_message;
  // The report's first line without its "dpcheck.torch: FAILED " lead, or "".
  std::string failure_line() const;
};

// Whether `dir` holds a record.json (then it is a record, or a bundle, of dpcheck.torch).
bool is_record(const std::filesystem::path& dir);
// UsageError naming the file and what is wrong.
Record read_record(const std::filesystem::path& dir);
RecordedStep read_recorded_step(const Record& record, std::int64_t step);

// One phase of a recorded step against the float64 reference.
struct RecordedPhase {
  std::string phase;  // "all-reduce" | "optimizer"
  bool judged = true;
  double ratio = 0;     // largest error / bound (at most 1 passes)
  std::string element;  // where, in the job's names
  std::string message;  // the phase's verdict in words (or why it is not judged)
};

struct StepJudgement {
  std::vector<RecordedPhase> phases;
  GradientJudgement gradient;
  double max_ratio = 0;
  std::string first_out_of_bound;  // "all-reduce at 0.weight[1, 2]", or ""
};
StepJudgement judge_recorded_step(const Record& record, const RecordedStep& step);

// Two records of the same model, step by step.
struct RecordDriftStep {
  std::int64_t step = 0;
  double ratio[2] = {0, 0};
  std::string where[2];         // the first phase out of the bound, or ""
  std::string between[2];       // set when step + 1 did not start where this step ended
  std::uint64_t apart_ulp = 0;  // largest distance between the two runs' parameters after the step
};
struct RecordDrift {
  std::vector<RecordDriftStep> steps;
  std::int64_t only[2] = {0, 0};  // steps from `from` on that one record holds and the other does not
  int bug_run = -1;
  std::int64_t bug_step = -1;
  std::string bug_where;
  bool bug_between_steps = false;  // the bug is outside any step (no step of it to replay)
};
// Every step from `from` on that both records hold; UsageError when the models differ.
RecordDrift record_drift(const Record records[2], std::int64_t from = 0);

}  // namespace dpcheck::torchjob
