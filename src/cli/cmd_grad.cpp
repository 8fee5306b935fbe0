// dpcheck grad: the averaging experiment. Splits one batch among N ranks, all-reduces their weighted
// gradients, and sets the result beside the whole-batch float32 gradient and the float64 reference,
// with the derived bound on their difference.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "properties/mutants.hpp"
#include "properties/properties.hpp"
#include "reference/bound.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/target.hpp"

namespace dpcheck::cli {

namespace {

struct GradOptions {
  ModelOptions model;
  std::string x, y, init, split = "contiguous", mutant, kernels;
  std::string comm;  // --comm: empty for local
  std::int64_t batch = 0;
  SeedOption seed;
  int world_size = 1;
  int accumulate = 1;
  bool json = false;
  PrecisionOption precision;
  LossScaleOptions loss_scale;
  AllreduceDtypeOption allreduce_dtype;
};

// The properties whose mutants break something grad runs: the averaged gradient. A mutant aimed at
// another property (the writer, the replica check, resuming) would change nothing here, and the
// experiment would pass as if the mutant were harmless.
constexpr std::string_view kGradientProperties[] = {"gradient_average_matches_whole_batch",
                                                    "uneven_shares_match_whole_batch",
                                                    "accumulation_matches_whole_batch"};

void require_gradient_mutant(const std::string& name) {
  if (name.empty()) return;
  require_known_mutant(name);
  const MutantInfo& m = *find_mutant(name);
  // grad runs the default target: the default engine and its communicator.
  const std::string_view engine = default_engine();
  std::string names;
  for (const MutantInfo& other : mutants())
    if (std::find(std::begin(kGradientProperties), std::end(kGradientProperties), other.caught_by) !=
            std::end(kGradientProperties) &&
        (other.engine.empty() || other.engine == engine))
      names += (names.empty() ? "" : ", ") + std::string(other.name);
  if (!m.engine.empty() && m.engine != engine)
    throw UsageError("--mutant " + name + " breaks the " + std::string(m.engine) + " engine, and grad runs the " +
                     std::string(engine) + " engine (grad takes " + names + ")");
  if (std::find(std::begin(kGradientProperties), std::end(kGradientProperties), m.caught_by) ==
      std::end(kGradientProperties))
    throw UsageError("--mutant " + name + " breaks nothing grad runs (it is aimed at " + std::string(m.caught_by) +
                     "); grad takes " + names);
}

int run_grad(const GradOptions& o) {
  const ModelConfig model = o.model.config();
  const std::uint64_t seed = o.seed.value();
  if (o.world_size < 1) throw UsageError("--world-size must be at least 1");
  if (o.x.empty() != o.y.empty()) throw UsageError("give both --x and --y, or neither");
  if (o.x.empty() && o.batch < 1) throw UsageError("give --x and --y, or --batch (at least 1) for synthetic data");
  if (!o.x.empty() && o.batch != 0) throw UsageError("--batch is for synthetic data; with --x the batch is its rows");
  require_gradient_mutant(o.mutant);
  Target target;
  target.mutant = o.mutant;
  target.kernels = o.kernels;
  target.precision = o.precision.value();
  if (!o.comm.empty()) target.comm = o.comm;
  validate_target(target);

  std::unique_ptr<Dataset> data;
  if (!o.x.empty())
    data = std::make_unique<ArrayDataset>(ArrayDataset::load(o.x, o.y, model));
  if (data && data->size() < 1) throw UsageError(o.x + " holds no examples");
  const std::int64_t batch = data ? data->size() : o.batch;
  check_accumulate(o.accumulate, batch, o.world_size);
  RunSize needs;
  needs.model = model;
  needs.batch = batch;
  needs.world_size = o.world_size;
  needs.reference = true;
  needs.json = o.json;
  check_run_size(needs);
  if (!data) data = std::make_unique<SyntheticDataset>(o.batch, model, seed);
  const std::vector<float> params = o.init.empty() ? init_params(model, seed) : load_params_dir(o.init, model);

  TrainConfig tc;
  tc.model = model;
  tc.batch = data->size();
  tc.shuffle = false;  // shares in data order, as x.chunk(N) or x[r::N]
  tc.split = parse_split(o.split);
  tc.policy = Policy::uneven;
  tc.seed = seed;
  tc.accumulate = o.accumulate;
  tc.loss_scaling = o.loss_scale.config(target.precision);
  tc.allreduce_dtype = o.allreduce_dtype.value();

  // The check the gradient properties run (properties/gradient.cpp): the averaged gradient through the
  // trainer and the communicator, as data-parallel training computes it, and the same engine's
  // whole-batch gradient, each against the float64 reference within the derived bound. Printed here.
  GradientRun run;
  run.train = tc;
  run.world_size = o.world_size;
  run.data = data.get();
  run.params = &params;
  GradientDetail d;
  const GradientOutcome outcome = check_sharded_gradient(run, target, &d);
  if (outcome.overflowed)
    throw UsageError("at loss scale " + float_text(tc.loss_scaling.init_scale) +
                     " the gradient is not finite on some rank, so a loss scaler would skip the step: give a smaller "
                     "--loss-scale-init (or, if the forward pass overflows the format, smaller inputs)");
  const std::size_t n = d.averaged.size();
  const std::vector<float>& average = d.averaged;
  const std::vector<float>& whole_grad = d.whole;
  const reference::GradientBound& bound = d.bound;
  const std::int64_t m_avg = d.m_sharded, m_whole = d.m_whole;

  // Shown beside the verdict: where the average and the whole-batch gradient differ most, and the sum
  // of their two bounds there (each is within its own bound of its reference, so within the sum of
  // each other and of the references' own difference, which mixed precision makes non-zero when N is
  // not a power of two).
  double largest = 0, largest_bound = 0;
  std::size_t at = 0;
  std::vector<double> bounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    bounds[i] = d.bound_sharded.bound(i, m_avg) + bound.bound(i, m_whole) +
                std::abs(d.bound_sharded.reference.grad[i] - bound.reference.grad[i]);
    const double diff = std::abs(static_cast<double>(average[i]) - static_cast<double>(whole_grad[i]));
    if (diff > largest || !std::isfinite(diff)) {
      largest = diff;
      largest_bound = bounds[i];
      at = i;
    }
  }
  const double ratio = std::max(outcome.sharded_ratio, outcome.whole_ratio);
  const bool passed = outcome.passed;
  const ParamLayout layout(model);

  if (o.json) {
    nlohmann::json names = nlohmann::json::array();
    for (const Slice& s : layout.slices()) names.push_back({{"name", s.name}, {"offset", s.offset}, {"shape", s.shape}});
    nlohmann::json j{{"model", dims_string(model.dims)},
                     {"activation", activation_name(model.activation)},
                     {"loss", loss_name(model.loss)},
                     {"batch", data->size()},
                     {"world_size", o.world_size},
                     {"accumulate", o.accumulate},
                     {"split", o.split},
                     {"share_sizes", d.share_sizes},
                     {"parameters", names},
                     {"shares", d.shares},
                     {"average", average},
                     {"whole", whole_grad},
                     {"reference", bound.reference.grad},
                     {"largest_difference", largest},
                     {"largest_difference_at", layout.describe_element(at)},
                     {"bound", largest_bound},
                     {"bounds", bounds},
                     {"error_ratio", ratio},
                     {"average_error_ratio", outcome.sharded_ratio},
                     {"whole_error_ratio", outcome.whole_ratio},
                     {"probabilistic_error_ratio", outcome.probabilistic_ratio},
                     {"note", outcome.note},
                     {"passed", passed}};
    std::cout << j.dump() << "\n";
    return passed ? exit_ok : exit_check_failed;
  }

  std::printf("dpcheck grad: model %s (%s, %s), batch %lld, world size %d, %s split, %s, shares",
              dims_string(model.dims).c_str(), std::string(activation_name(model.activation)).c_str(),
              std::string(loss_name(model.loss)).c_str(), static_cast<long long>(data->size()), o.world_size, o.split.c_str(),
              o.accumulate == 1 ? "no accumulation" : ("accumulate " + std::to_string(o.accumulate)).c_str());
  for (std::int64_t s : d.share_sizes) std::printf(" %lld", static_cast<long long>(s));
  std::printf("\n\n%-24s %16s %16s %16s %22s\n", "element", "share 0", "average", "whole", "reference (float64)");
  constexpr std::size_t shown_per_tensor = 8;
  for (const Slice& s : layout.slices()) {
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (k == shown_per_tensor) {
        std::printf("%-24s (%zu more)\n", "...", s.size() - shown_per_tensor);
        break;
      }
      const std::size_t i = s.offset + k;
      std::printf("%-24s %16s %16s %16s %22.17g\n", layout.describe_element(i).c_str(), float_text(d.shares[0][i]).c_str(),
                  float_text(average[i]).c_str(), float_text(whole_grad[i]).c_str(), bound.reference.grad[i]);
    }
  }
  std::printf("\nlargest |average - whole|: %.3g at %s\n", largest, layout.describe_element(at).c_str());
  std::printf("bound there:               %.3g (average within gamma_%lld, whole within gamma_%lld of float64)\n",
              largest_bound, static_cast<long long>(m_avg), static_cast<long long>(m_whole));
  std::printf("error ratio:               %.3g (the larger of the two against float64, each error / its bound; at "
              "most 1 passes)\n", ratio);
  std::printf("against float64:           average %.3g, whole %.3g, share 0 alone %.3g; probabilistic bound %.3g\n",
              outcome.sharded_ratio, outcome.whole_ratio, outcome.share_ratio, outcome.probabilistic_ratio);
  std::printf("largest error ratio at:    %s\n", outcome.note.c_str());
  std::printf("%s\n", passed ? "passed: the average equals the whole-batch gradient within float32 rounding"
                             : ("FAILED: " + outcome.message).c_str());
  return passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_grad(CLI::App& app) {
  auto o = std::make_shared<GradOptions>();
  CLI::App* sub = app.add_subcommand(
      "grad", "The averaging experiment: share gradients, their all-reduced average, the whole-batch gradient "
              "and the float64 reference, with the derived bound");
  o->model.add_to(*sub);
  sub->add_option("--x", o->x, "Inputs, .npy of shape (B, in), float32 or float64");
  sub->add_option("--y", o->y, "Targets, .npy: (B, out) floats for mse, (B,) int64 classes for cross-entropy");
  sub->add_option("--batch", o->batch, "Synthetic batch size (instead of --x/--y)");
  o->seed.add_to(*sub, "Seed of the synthetic data and of the initial parameters");
  sub->add_option("--init", o->init, "Directory of parameter .npy files (layers.0.weight.npy, ...)");
  sub->add_option("--world-size", o->world_size, "Number of ranks (default 1)");
  sub->add_option("--accumulate", o->accumulate,
                  "Micro-batches per rank, at most a rank's share (default 1); the average is accumulated over them");
  sub->add_option("--split", o->split, "contiguous (default; x.chunk(N)) or strided (x[r::N])");
  sub->add_option("--mutant", o->mutant, "Run with a deliberately broken part of the averaged gradient");
  add_kernels_option(*sub, o->kernels);
  o->precision.add_to(*sub);
  o->loss_scale.add_to(*sub);
  o->allreduce_dtype.add_to(*sub);
  sub->add_option("--comm", o->comm,
                  "The communicator that averages the shares: local (default), or a communicator plugin's path "
                  "(its ranks as threads)");
  sub->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return [o] { return run_grad(*o); };
}

}  // namespace dpcheck::cli
