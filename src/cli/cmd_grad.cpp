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
#include "properties/target.hpp"
#include "reference/bound.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"

namespace dpcheck::cli {

namespace {

struct GradOptions {
  ModelOptions model;
  std::string x, y, init, split = "contiguous", mutant;
  std::int64_t batch = 0;
  SeedOption seed;
  int world_size = 1;
  int accumulate = 1;
  bool json = false;
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
  Target target;
  target.mutant = o.mutant;

  // The averaged gradient, through the trainer and the local communicator, as data-parallel training
  // computes it.
  const std::size_t n = ParamLayout(model).size();
  std::vector<float> average(n);
  std::vector<std::int64_t> share_sizes;
  std::vector<std::int64_t> whole_indices;
  run_world(target, o.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, tc, comm, *data);
    rt.engine->load_params(params);
    rt.trainer->compute_gradient(0);
    if (comm.rank() != 0) return;
    rt.engine->store_grads(average);
    whole_indices = rt.trainer->global_indices(0);
    for (int r = 0; r < comm.size(); ++r) {
      const Trainer::Slot s = rt.trainer->slot(r, 0);
      share_sizes.push_back(s.end - s.begin);
    }
  });

  const Batch whole = data->gather(whole_indices);
  std::unique_ptr<Engine> engine = make_cpu_engine(model);
  engine->load_params(params);
  std::vector<std::vector<float>> shares;
  std::int64_t offset = 0;
  for (std::int64_t size : share_sizes) {
    engine->forward_backward(whole.slice(offset, offset + size), 1.0f, false);
    offset += size;
    shares.emplace_back(n);
    engine->store_grads(shares.back());
  }
  std::vector<float> whole_grad(n);
  engine->forward_backward(whole, 1.0f, false);
  engine->store_grads(whole_grad);

  const reference::GradientBound bound = reference::gradient_bound(model, params, whole);
  const std::int64_t m_avg =
      reference::sharded_roundings(*std::max_element(share_sizes.begin(), share_sizes.end()), o.world_size);
  const std::int64_t m_whole = reference::whole_batch_roundings(whole.size);
  const reference::Comparison avg_cmp = reference::compare(average, bound, m_avg);
  const reference::Comparison whole_cmp = reference::compare(whole_grad, bound, m_whole);

  // |average - whole| <= bound(average) + bound(whole), element by element.
  double largest = 0, largest_bound = 0, ratio = 0;
  std::size_t at = 0;
  std::vector<double> bounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    bounds[i] = bound.bound(i, m_avg) + bound.bound(i, m_whole);
    const double diff = std::abs(static_cast<double>(average[i]) - static_cast<double>(whole_grad[i]));
    const double r = diff == 0 ? 0.0 : (bounds[i] > 0 && std::isfinite(diff) ? diff / bounds[i] : INFINITY);
    if (diff > largest || !std::isfinite(diff)) {
      largest = diff;
      largest_bound = bounds[i];
      at = i;
    }
    ratio = std::max(ratio, r);
  }
  const bool passed = ratio <= 1.0 && avg_cmp.passed() && whole_cmp.passed();
  const ParamLayout layout(model);

  if (o.json) {
    nlohmann::json names = nlohmann::json::array();
    for (const Slice& s : layout.slices()) names.push_back({{"name", s.name}, {"offset", s.offset}, {"shape", s.shape}});
    nlohmann::json j{{"model", dims_string(model.dims)},
                     {"activation", activation_name(model.activation)},
                     {"loss", loss_name(model.loss)},
                     {"batch", whole.size},
                     {"world_size", o.world_size},
                     {"accumulate", o.accumulate},
                     {"split", o.split},
                     {"share_sizes", share_sizes},
                     {"parameters", names},
                     {"shares", shares},
                     {"average", average},
                     {"whole", whole_grad},
                     {"reference", bound.reference.grad},
                     {"largest_difference", largest},
                     {"largest_difference_at", layout.describe_element(at)},
                     {"bound", largest_bound},
                     {"bounds", bounds},
                     {"error_ratio", ratio},
                     {"average_error_ratio", avg_cmp.max_ratio},
                     {"whole_error_ratio", whole_cmp.max_ratio},
                     {"passed", passed}};
    std::cout << j.dump() << "\n";
    return passed ? exit_ok : exit_check_failed;
  }

  std::printf("dpcheck grad: model %s (%s, %s), batch %lld, world size %d, %s split, %s, shares",
              dims_string(model.dims).c_str(), std::string(activation_name(model.activation)).c_str(),
              std::string(loss_name(model.loss)).c_str(), static_cast<long long>(whole.size), o.world_size, o.split.c_str(),
              o.accumulate == 1 ? "no accumulation" : ("accumulate " + std::to_string(o.accumulate)).c_str());
  for (std::int64_t s : share_sizes) std::printf(" %lld", static_cast<long long>(s));
  std::printf("\n\n%-24s %16s %16s %16s %22s\n", "element", "share 0", "average", "whole", "reference (float64)");
  constexpr std::size_t shown_per_tensor = 8;
  for (const Slice& s : layout.slices()) {
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (k == shown_per_tensor) {
        std::printf("%-24s (%zu more)\n", "...", s.size() - shown_per_tensor);
        break;
      }
      const std::size_t i = s.offset + k;
      std::printf("%-24s %16s %16s %16s %22.17g\n", layout.describe_element(i).c_str(), float_text(shares[0][i]).c_str(),
                  float_text(average[i]).c_str(), float_text(whole_grad[i]).c_str(), bound.reference.grad[i]);
    }
  }
  std::printf("\nlargest |average - whole|: %.3g at %s\n", largest, layout.describe_element(at).c_str());
  std::printf("bound there:               %.3g (average within gamma_%lld, whole within gamma_%lld of float64)\n",
              largest_bound, static_cast<long long>(m_avg), static_cast<long long>(m_whole));
  std::printf("error ratio:               %.3g (largest difference / bound over all elements; at most 1 passes)\n", ratio);
  std::printf("against float64:           average %.3g, whole %.3g, share 0 alone %.3g\n", avg_cmp.max_ratio,
              whole_cmp.max_ratio, reference::compare(shares[0], bound, m_avg).max_ratio);
  std::printf("%s\n", passed ? "passed: the average equals the whole-batch gradient within float32 rounding"
                             : "FAILED: the difference is larger than rounding can explain");
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
  sub->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return [o] { return run_grad(*o); };
}

}  // namespace dpcheck::cli
