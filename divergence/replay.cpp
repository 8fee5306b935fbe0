// A bundle's step replayed (divergence/divergence.hpp): the recorded step run again on a target, each
// phase's tensors held to the reference, and the failure attributed to the first phase out of bound.
#include "divergence/divergence.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "divergence/divergence_json.hpp"
#include "divergence/trace.hpp"
#include "reference/bound.hpp"
#include "reference/optimizer.hpp"
#include "reference/schedule.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/io/files.hpp"
#include "src/io/hash.hpp"
#include "src/io/json_limits.hpp"
#include "src/train/replica_check.hpp"
#include "verdict/bounds.hpp"
#include "verdict/verdict.hpp"

namespace dpcheck {

namespace fs = std::filesystem;

// ---- replay and attribution ----------------------------------------------------------------------

namespace {

// What one rank's step left at each phase, on the host.
class Capture final : public StepObserver {
 public:
  void local_gradient(Trainer& t, std::int64_t step, double, std::int64_t) override {
    local.resize(t.engine().param_count());
    t.engine().store_grads(local);
    // Simulated ranks pass one after another on one replica: each pass's gradient and examples are kept,
    // so that every rank's phases can be judged after the step.
    if (t.comm().simulated()) {
      played.resize(static_cast<std::size_t>(t.world_size()));
      played[static_cast<std::size_t>(t.rank())] = {local, t.local_indices(step), true};
    }
    // The optimizer has not run yet: this is the state the step starts from.
    params_before.resize(t.engine().param_count());
    t.engine().store_params(params_before);
    state_before.resize(t.optimizer().state_size());
    t.optimizer().store_state(state_before);
    steps_before = t.optimizer().steps();
    loss_scale = t.scaler().scale();
  }
  void reduced_gradient(Trainer& t, std::int64_t) override {
    reduced.resize(t.engine().param_count());
    t.engine().store_grads(reduced);
    skipped = t.found_inf();
  }
  void updated(Trainer& t, std::int64_t) override {
    params.resize(t.engine().param_count());
    t.engine().store_params(params);
    state.resize(t.optimizer().state_size());
    t.optimizer().store_state(state);
  }
  std::vector<float> local, reduced, params, state;
  std::vector<float> params_before, state_before;
  struct Pass {
    std::vector<float> local;
    std::vector<std::int64_t> used;
    bool seen = false;  // the rank passed (a pass that threw leaves the later ones unplayed)
  };
  std::vector<Pass> played;  // simulated ranks: each rank's local gradient and examples
  float loss_scale = 1;      // the scaler's scale at the step: the local gradient is scaled by it
  bool skipped = false;      // the loss scaler found the gradient non-finite: the step takes no update
  std::int64_t steps_before = 0;
};

constexpr const char* kPhases[] = {"data", "local gradient", "all-reduce", "optimizer", "replicas"};

// This rank's row of the table: one PhaseRatio per phase reached, as JSON.
nlohmann::json attribute_rank(const Target& target, const ReplayInput& in, const reference::StepExamples& ex,
                              const std::vector<std::int64_t>& used, const Capture& cap, const ReplicaReport* replicas,
                              int rank) {
  const TrainConfig& c = in.config;
  const ParamLayout layout(c.model);
  reference::BoundOptions options = bound_options(target, c);
  options.delta_scale = cap.loss_scale;
  const auto r = static_cast<std::size_t>(rank);
  nlohmann::json row = nlohmann::json::array();
  const auto add = [&](const char* phase, double ratio, const std::string& element) {
    row.push_back({{"phase", phase},
                   {"rank", rank},
                   {"ratio", std::isfinite(ratio) ? nlohmann::json(ratio) : nlohmann::json("inf")},
                   {"element", element}});
  };
  // data: the examples the rank used, against the configuration's sampler and the recorded ones.
  const std::vector<std::int64_t>& want = ex.ranks[r];
  std::string data_note;
  if (used != want) data_note = "the sampler under test gives other examples than the configuration's";
  else if (!in.indices.empty() && in.indices[r] != used) data_note = "other examples than the failing run recorded";
  add("data", data_note.empty() ? 0.0 : INFINITY, data_note);

  const std::int64_t global = static_cast<std::int64_t>(ex.global().size());
  if (!cap.local.empty()) {
    if (cap.skipped && has_non_finite(cap.local)) {
      // The loss scaler's overflow: a gradient non-finite at the scale is the scaler's to handle (it skips
      // the step on every rank, judged below), not a bound's to hold.
      add("local gradient", 0.0, "");
    } else if (want.empty()) {
      const auto bad = std::find_if(cap.local.begin(), cap.local.end(), [](float v) { return v != 0.0f; });
      add("local gradient", bad == cap.local.end() ? 0.0 : INFINITY,
          bad == cap.local.end() ? "" : layout.describe_element(static_cast<std::size_t>(bad - cap.local.begin())));
    } else {
      const Batch share = in.data->gather(want);
      // The rank's gradient enters the all-reduce weighted by its share: share * N / global; with mixed
      // precision its deltas are rounded at that weight.
      const double weight = static_cast<double>(share.size) * in.world_size / static_cast<double>(global);
      reference::BoundOptions local = options;
      if (local.input_format != Precision::fp32) local.delta_scale *= weight;
      const reference::GradientBound b = reference::gradient_bound(c.model, cap.params_before, share, local);
      const reference::Comparison cmp = reference::compare(
          cap.local, b, reference::whole_batch_roundings(share.size, options), 1.0 / (weight * cap.loss_scale));
      add("local gradient", cmp.max_ratio, layout.describe_element(cmp.worst));
    }
  }
  if (cap.skipped) {
    // The loss scaler passed the step over: its gradient is non-finite somewhere (still scaled), and
    // the step must leave the parameters, the state and the count exactly as they were.
    const bool non_finite = has_non_finite(cap.reduced) || has_non_finite(cap.local);
    add("all-reduce", non_finite ? 0.0 : INFINITY, non_finite ? "" : "skipped though every gradient is finite");
    const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    const bool unchanged = same_bits(cap.params, cap.params_before) && same_bits(cap.state, cap.state_before);
    add("optimizer", unchanged ? 0.0 : INFINITY, unchanged ? "" : "a skipped step changed the parameters or the state");
  } else if (!cap.reduced.empty()) {
    const Batch whole = in.data->gather(ex.global());
    const reference::GradientBound b =
        reference::gradient_bound(c.model, cap.params_before, whole, sharded_bound_options(options, in.world_size));
    const reference::Comparison cmp =
        reference::compare(cap.reduced, b, reference::sharded_roundings(ex.largest_share(), in.world_size, options));
    add("all-reduce", cmp.max_ratio, layout.describe_element(cmp.worst));
  }
  if (!cap.params.empty() && !cap.skipped) {
    OptimizerConfig oc = c.optimizer_for(in.world_size);
    oc.lr = c.lr_at(in.step, in.world_size);  // the warm-up's rate at this step
    const reference::OptimizerStepBound want_step =
        reference::optimizer_step_bound(oc, cap.params_before, cap.reduced, cap.state_before, cap.steps_before);
    WorstElement worst;
    worst_against_formula(
        cap.params, want_step.params, want_step.params_bound, "parameter",
        [&](std::size_t i) { return layout.describe_element(i); }, worst);
    const std::size_t n = layout.size();
    WorstElement state;
    worst_against_formula(
        cap.state, want_step.state, want_step.state_bound, "state",
        [&](std::size_t i) { return layout.describe_element(i % n); }, state);
    const bool in_state = state.ratio > worst.ratio;
    const std::size_t i = in_state ? state.index % n : worst.index;
    add("optimizer", std::max(worst.ratio, state.ratio),
        (in_state ? "optimizer state at " : "") + layout.describe_element(i));
  }
  if (replicas) {
    const bool minority =
        std::find(replicas->minority.begin(), replicas->minority.end(), rank) != replicas->minority.end();
    add("replicas", replicas->synchronized || !minority ? 0.0 : INFINITY,
        replicas->synchronized ? "" : replicas->buffer + " " + replicas->element);
  }
  return row;
}

}  // namespace

ReplayResult replay_step(const Target& target, const ReplayInput& in) {
  const std::int64_t step = in.step;
  const DistributedSampler sampler(in.config.sampler(in.world_size));
  const reference::StepExamples ex = reference::step_examples(in.config, sampler, step);
  ReplayResult result;
  std::mutex mu;
  std::vector<nlohmann::json> rows;
  run_world(target, in.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, in.config, comm, *in.data);
    rt.trainer->restore(in.before);
    while (rt.trainer->next_step() < step) rt.trainer->step();
    Capture cap;
    LiveChecks checks(target, in.checks);
    StepObservers chain;
    chain.add(&cap);
    chain.add(&checks);
    rt.trainer->set_observer(&chain);
    std::optional<StepFailure> failure;
    std::optional<ReplicaReport> replicas;
    double loss = 0;
    // Judged as train judges a step, and then the state it leaves.
    const CheckedStep c = checked_step(*rt.trainer);
    failure = c.failure;
    if (c.completed) {
      loss = c.result.loss;
      replicas = c.result.replicas;
      if (!failure && (has_non_finite(cap.params) || has_non_finite(cap.state)))
        failure = non_finite_state_failure(step, cap.params, cap.state, ParamLayout(in.config.model), "");
    }
    std::vector<std::string> all;
    if (comm.simulated()) {
      // One replica played every rank: each rank's row from its own pass.
      for (std::size_t r = 0; r < cap.played.size(); ++r) {
        if (!cap.played[r].seen) continue;
        cap.local = std::move(cap.played[r].local);
        all.push_back(attribute_rank(target, in, ex, cap.played[r].used, cap, replicas ? &*replicas : nullptr,
                                     static_cast<int>(r))
                          .dump());
      }
    } else {
      const std::vector<std::int64_t> used = rt.trainer->local_indices(step);
      const nlohmann::json row =
          attribute_rank(target, in, ex, used, cap, replicas ? &*replicas : nullptr, comm.rank());
      all = allgather_strings(comm.host(), row.dump());
    }
    if (!records(target, comm)) return;
    const std::lock_guard<std::mutex> lock(mu);
    for (const std::string& s : all) rows.push_back(nlohmann::json::parse(s));
    result.failure = failure;
    result.loss = loss;
    result.params_after = cap.params;
    result.state_after = cap.state;
  });
  // Phase order first, then rank order.
  for (const char* phase : kPhases)
    for (const nlohmann::json& row : rows)
      for (const nlohmann::json& p : row)
        if (p.at("phase") == phase) {
          PhaseRatio pr;
          pr.phase = phase;
          pr.rank = p.at("rank").get<int>();
          pr.ratio = p.at("ratio").is_string() ? INFINITY : p.at("ratio").get<double>();
          pr.element = p.at("element").get<std::string>();
          if (result.first_out_of_bound.empty() && pr.ratio > 1.0)
            result.first_out_of_bound =
                pr.phase + " on rank " + std::to_string(pr.rank) + (pr.element.empty() ? "" : " at " + pr.element);
          result.phases.push_back(std::move(pr));
        }
  return result;
}

}  // namespace dpcheck
