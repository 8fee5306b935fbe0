// dpcheck grad: the averaging experiment. Splits one batch among N ranks, all-reduces their weighted
// gradients, and sets the result beside the whole-batch float32 gradient and the float64 reference,
// with the derived bound on their difference.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "mutants/mutants.hpp"
#include "properties/properties.hpp"
#include "reference/bound.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/target/target.hpp"

namespace dpcheck::cli {

namespace {

struct GradOptions {
  ModelOptions model;
  std::string x, y, init, split = "contiguous";
  std::int64_t batch = 0;
  SeedOption seed;
  int accumulate = 1;
  bool json = false;
  TargetOptions target;
  LossScaleOptions loss_scale;
};

// The properties whose mutants break something grad runs: the averaged gradient. A mutant aimed at
// another property (the writer, the replica check, resuming) would change nothing here, and the
// experiment would pass as if the mutant were harmless.
constexpr std::string_view kGradientProperties[] = {
    "gradient_average_matches_whole_batch", "uneven_shares_match_whole_batch", "accumulation_matches_whole_batch"};

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

// What grad computes: the experiment's inputs and the gradient check's detail, with where the average
// and the whole-batch gradient differ most.
struct GradResult {
  ModelConfig model;
  std::unique_ptr<Dataset> data;
  GradientOutcome outcome;
  GradientDetail d;
  std::vector<double> bounds;  // per element, the sum of the two bounds and the references' difference
  double largest = 0, largest_bound = 0;
  std::size_t at = 0;
};

// Shown beside the verdict: where the average and the whole-batch gradient differ most, and the sum of
// their two bounds there (each is within its own bound of its reference, so within the sum of each
// other and of the references' own difference, which mixed precision makes non-zero when N is not a
// power of two).
void find_largest_difference(GradResult& g) {
  const GradientDetail& d = g.d;
  const std::size_t n = d.averaged.size();
  g.bounds.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    g.bounds[i] = d.bound_sharded.bound(i, d.m_sharded) + d.bound.bound(i, d.m_whole) +
                  std::abs(d.bound_sharded.reference.grad[i] - d.bound.reference.grad[i]);
    const double diff = std::abs(static_cast<double>(d.averaged[i]) - static_cast<double>(d.whole[i]));
    if (diff > g.largest || !std::isfinite(diff)) {
      g.largest = diff;
      g.largest_bound = g.bounds[i];
      g.at = i;
    }
  }
}

GradResult compute_grad(const GradOptions& o) {
  GradResult g;
  g.model = o.model.config();
  const ModelConfig& model = g.model;
  const std::uint64_t seed = o.seed.value();
  const int world = o.target.world_size;
  if (o.x.empty() != o.y.empty()) throw UsageError("give both --x and --y, or neither");
  if (o.x.empty() && o.batch < 1) throw UsageError("give --x and --y, or --batch (at least 1) for synthetic data");
  if (!o.x.empty() && o.batch != 0) throw UsageError("--batch is for synthetic data; with --x the batch is its rows");
  require_gradient_mutant(o.target.mutant);
  const Target target = o.target.target();
  validate_target(target);

  if (!o.x.empty()) g.data = std::make_unique<ArrayDataset>(ArrayDataset::load(o.x, o.y, model));
  if (g.data && g.data->size() < 1) throw UsageError(o.x + " holds no examples");
  const std::int64_t batch = g.data ? g.data->size() : o.batch;
  check_accumulate(o.accumulate, batch, world);
  RunSize needs;
  needs.model = model;
  needs.batch = batch;
  needs.world_size = world;
  needs.reference = true;
  needs.json = o.json;
  check_run_size(needs);
  if (!g.data) g.data = std::make_unique<SyntheticDataset>(o.batch, model, seed);
  const std::vector<float> params = o.init.empty() ? init_params(model, seed) : load_params_dir(o.init, model);

  TrainConfig tc;
  tc.model = model;
  tc.batch = g.data->size();
  tc.shuffle = false;  // shares in data order, as x.chunk(N) or x[r::N]
  tc.split = parse_split(o.split);
  tc.policy = Policy::uneven;
  tc.seed = seed;
  tc.accumulate = o.accumulate;
  tc.loss_scaling = o.loss_scale.config(target.precision);
  tc.allreduce_dtype = target.allreduce_dtype;

  // The check the gradient properties run (properties/gradient.cpp): the averaged gradient through the
  // trainer and the communicator, as data-parallel training computes it, and the same engine's
  // whole-batch gradient, each against the float64 reference within the derived bound. Printed here.
  GradientRun run;
  run.train = tc;
  run.world_size = world;
  run.data = g.data.get();
  run.params = &params;
  g.outcome = check_sharded_gradient(run, target, &g.d);
  if (g.outcome.overflowed)
    throw UsageError("at loss scale " + float_text(tc.loss_scaling.init_scale) +
                     " the gradient is not finite on some rank, so a loss scaler would skip the step: give a smaller "
                     "--loss-scale-init (or, if the forward pass overflows the format, smaller inputs)");
  find_largest_difference(g);
  return g;
}

void print_grad_json(const GradOptions& o, const GradResult& g) {
  const ParamLayout layout(g.model);
  const GradientOutcome& outcome = g.outcome;
  nlohmann::json names = nlohmann::json::array();
  for (const Slice& s : layout.slices()) names.push_back({{"name", s.name}, {"offset", s.offset}, {"shape", s.shape}});
  nlohmann::json j{{"model", dims_string(g.model.dims)},
                   {"activation", activation_name(g.model.activation)},
                   {"loss", loss_name(g.model.loss)},
                   {"batch", g.data->size()},
                   {"world_size", o.target.world_size},
                   {"accumulate", o.accumulate},
                   {"split", o.split},
                   {"share_sizes", g.d.share_sizes},
                   {"parameters", names},
                   {"shares", g.d.shares},
                   {"average", g.d.averaged},
                   {"whole", g.d.whole},
                   {"reference", g.d.bound.reference.grad},
                   {"largest_difference", g.largest},
                   {"largest_difference_at", layout.describe_element(g.at)},
                   {"bound", g.largest_bound},
                   {"bounds", g.bounds},
                   {"error_ratio", std::max(outcome.sharded_ratio, outcome.whole_ratio)},
                   {"average_error_ratio", outcome.sharded_ratio},
                   {"whole_error_ratio", outcome.whole_ratio},
                   {"probabilistic_error_ratio", outcome.probabilistic_ratio},
                   {"note", outcome.note},
                   {"passed", outcome.passed}};
  std::cout << j.dump() << "\n";
}

void print_grad_table(const GradOptions& o, const GradResult& g) {
  const ModelConfig& model = g.model;
  const GradientDetail& d = g.d;
  const GradientOutcome& outcome = g.outcome;
  const ParamLayout layout(model);
  std::printf("dpcheck grad: model %s (%s, %s), batch %lld, world size %d, %s split, %s, shares",
              dims_string(model.dims).c_str(), std::string(activation_name(model.activation)).c_str(),
              std::string(loss_name(model.loss)).c_str(), static_cast<long long>(g.data->size()), o.target.world_size,
              o.split.c_str(),
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
      std::printf("%-24s %16s %16s %16s %22.17g\n", layout.describe_element(i).c_str(),
                  float_text(d.shares[0][i]).c_str(), float_text(d.averaged[i]).c_str(), float_text(d.whole[i]).c_str(),
                  d.bound.reference.grad[i]);
    }
  }
  std::printf("\nlargest |average - whole|: %.3g at %s\n", g.largest, layout.describe_element(g.at).c_str());
  std::printf("bound there:               %.3g (average within gamma_%lld, whole within gamma_%lld of float64)\n",
              g.largest_bound, static_cast<long long>(d.m_sharded), static_cast<long long>(d.m_whole));
  std::printf(
      "error ratio:               %.3g (the larger of the two against float64, each error / its bound; at "
      "most 1 passes)\n",
      std::max(outcome.sharded_ratio, outcome.whole_ratio));
  std::printf("against float64:           average %.3g, whole %.3g, share 0 alone %.3g; probabilistic bound %.3g\n",
              outcome.sharded_ratio, outcome.whole_ratio, outcome.share_ratio, outcome.probabilistic_ratio);
  std::printf("largest error ratio at:    %s\n", outcome.note.c_str());
  std::printf("%s\n", outcome.passed ? "passed: the average equals the whole-batch gradient within float32 rounding"
                                     : ("FAILED: " + outcome.message).c_str());
}

int run_grad(const GradOptions& o) {
  const GradResult g = compute_grad(o);
  if (o.json) print_grad_json(o, g);
  else print_grad_table(o, g);
  return g.outcome.passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_grad(CLI::App& app) {
  auto o = std::make_shared<GradOptions>();
  CLI::App* sub = app.add_subcommand(
      "grad",
      "The averaging experiment: share gradients, their all-reduced average, the whole-batch gradient "
      "and the float64 reference, with the derived bound");
  o->model.add_to(*sub);
  sub->add_option("--x", o->x, "Inputs, .npy of shape (B, in), float32 or float64");
  sub->add_option("--y", o->y, "Targets, .npy: (B, out) floats for mse, (B,) int64 classes for cross-entropy");
  sub->add_option("--batch", o->batch, "Synthetic batch size (instead of --x/--y)");
  o->seed.add_to(*sub, "Seed of the synthetic data and of the initial parameters");
  sub->add_option("--init", o->init, "Directory of parameter .npy files (layers.0.weight.npy, ...)");
  namespace f = target_option;
  o->target.add_to(*sub, f::world_size | f::mutant | f::kernels | f::precision | f::allreduce_dtype | f::comm);
  o->target.reword("--world-size", "Number of ranks (default 1)");
  o->target.reword("--mutant", "Run with a deliberately broken part of the averaged gradient");
  o->target.reword("--comm",
                   "The communicator that averages the shares: local (default), or a communicator plugin's path "
                   "(its ranks as threads)");
  sub->add_option("--accumulate", o->accumulate,
                  "Micro-batches per rank, at most a rank's share (default 1); the average is accumulated over them");
  sub->add_option("--split", o->split, "contiguous (default; x.chunk(N)) or strided (x[r::N])");
  o->loss_scale.add_to(*sub);
  sub->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return [o] { return run_grad(*o); };
}

}  // namespace dpcheck::cli
