// A training run's failures and the live checks that find them (divergence/divergence.hpp). What a
// failure leaves behind and how it is followed up are files of their own: its repro bundle (bundle.cpp),
// the bundle's step replayed with attribution (replay.cpp), and rounding or bug across two runs
// (drift.cpp).
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

// ---- failures ------------------------------------------------------------------------------------

namespace divergence_json {

[[noreturn]] void bad_field(const std::string& what, const std::string& why) {
  throw UsageError("\"" + what + "\" " + why);
}

const nlohmann::json& field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) bad_field(where + key, "is missing");
  return j.at(key);
}

std::string text_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_string()) bad_field(where + key, "is " + v.dump() + ", not a string");
  return v.get<std::string>();
}

std::int64_t int_field(const nlohmann::json& j, const std::string& key, const std::string& where, std::int64_t lo,
                       std::int64_t hi) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    bad_field(where + key,
              "is " + v.dump() + ", not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v.get<std::int64_t>();
}

bool bool_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_boolean()) bad_field(where + key, "is " + v.dump() + ", not true or false");
  return v.get<bool>();
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError("cannot read " + p.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

nlohmann::json parse_json_file(const fs::path& p) {
  const std::string text = read_text(p);
  check_json_depth(text, p.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw UsageError(p.string() + " is not valid JSON");
  }
}

}  // namespace divergence_json

StepFailure step_failure_from_json(const nlohmann::json& j) {
  using namespace divergence_json;
  StepFailure f;
  f.kind = text_field(j, "kind", "failure.");
  if (f.kind != "non-finite" && f.kind != "gradient-bound" && f.kind != "replicas" && f.kind != "loss" &&
      f.kind != "timeout")
    bad_field("failure.kind", "is \"" + f.kind + "\", not one of non-finite, gradient-bound, replicas, loss, timeout");
  f.step = int_field(j, "step", "failure.", 0, kMaxStep);
  f.rank = static_cast<int>(int_field(j, "rank", "failure.", -1, 1 << 20));
  f.element = text_field(j, "element", "failure.");
  f.message = text_field(j, "message", "failure.");
  return f;
}

bool same_place(const StepFailure& a, const StepFailure& b, std::string_view mutant) {
  return a.kind == b.kind && a.step == b.step && a.rank == b.rank &&
         (a.element == b.element || mutant == "replay-same-place-ignores-element");
}

ReplayVerdict replay_verdict(const StepFailure& recorded, const std::optional<StepFailure>& replayed,
                             std::string_view mutant) {
  if (!replayed || !same_place(*replayed, recorded, mutant)) return ReplayVerdict::not_reproduced;
  return replayed->message == recorded.message ? ReplayVerdict::bit_for_bit : ReplayVerdict::same_place;
}

// ---- live checks ---------------------------------------------------------------------------------

LiveChecks::LiveChecks(const Target& target, LiveCheckOptions options) : target_(target), options_(options) {}

void LiveChecks::local_gradient(Trainer& trainer, std::int64_t step, double loss_sum, std::int64_t) {
  // With a loss scaler a non-finite local gradient is the scaler's to handle: every rank skips the step
  // (the replica check and the parameters' own finite check see whether they did).
  if (!options_.finite || trainer.scaler().enabled()) return;
  // The gradient where it lies on the host; a copy from a device.
  Engine& e = trainer.engine();
  std::vector<float> copy;
  std::span<const float> g(e.grads(), e.param_count());
  if (e.memory_space() != MemorySpace::host) {
    copy.resize(e.param_count());
    e.store_grads(copy);
    g = copy;
  }
  std::string mine;
  if (!std::isfinite(loss_sum)) {
    mine = "loss\tits loss sum is " + float_text(loss_sum);
  } else {
    const auto bad = std::find_if(g.begin(), g.end(), [](float v) { return !std::isfinite(v); });
    if (bad != g.end()) {
      const ParamLayout layout(trainer.config().model);
      const std::string element = layout.describe_element(static_cast<std::size_t>(bad - g.begin()));
      mine = element + "\tits local gradient at " + element + " is " + float_text(*bad);
    }
  }
  const std::vector<std::string> all = allgather_strings(trainer.comm().host(), mine);
  // Simulated ranks: the last rank's pass holds every rank's text; an earlier one holds copies of its own
  // in the places of the ranks still to come, so it judges nothing.
  // (The mutant live-finite-simulated-rank0 judges on rank 0's pass, which sees its own text alone.)
  const int judge = target_.mutant == "live-finite-simulated-rank0" ? 0 : trainer.world_size() - 1;
  if (trainer.comm().simulated() && trainer.rank() != judge) return;
  std::vector<int> bad_ranks;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) bad_ranks.push_back(static_cast<int>(r));
  if (bad_ranks.empty()) {
    last_["finite"] = true;
    return;
  }
  const std::string& first = all[static_cast<std::size_t>(bad_ranks[0])];
  StepFailure f;
  f.kind = "non-finite";
  f.step = step;
  f.rank = bad_ranks[0];
  f.element = first.substr(0, first.find('\t'));
  f.message = "step " + std::to_string(step) + ": rank " + std::to_string(f.rank) + ": " +
              first.substr(first.find('\t') + 1) + ", before the all-reduce";
  if (bad_ranks.size() > 1) {
    f.message += " (non-finite on ranks";
    for (int r : bad_ranks) f.message += " " + std::to_string(r);
    f.message += ")";
  }
  throw StepCheckFailed(std::move(f));
}

LiveGradientCheck check_step_gradient(const Target& target, Trainer& trainer, std::int64_t step,
                                      std::span<const float> params, std::span<const float> reduced,
                                      Engine* whole_engine) {
  const TrainConfig& c = trainer.config();
  // Which examples the step holds is restated from a sampler of the configuration, not asked of the
  // trainer under test, so that a sampler bug changes the batch the check expects.
  const DistributedSampler sampler(c.sampler(trainer.world_size()));
  const reference::StepExamples ex = reference::step_examples(c, sampler, step);
  const Batch whole = trainer.data().gather(ex.global());
  reference::BoundOptions options = bound_options(target, c);
  options.delta_scale = trainer.scaler().scale();
  const reference::GradientBound bound = reference::gradient_bound(c.model, params, whole, options);
  // With mixed precision the shards' deltas round at N times the whole batch's scale (reference/bound.hpp).
  const reference::GradientBound bound_sharded =
      sharded_gradient_bound(bound, c.model, params, whole, trainer.world_size());
  const ParamLayout layout(c.model);
  LiveGradientCheck out;
  // The mutant live-gradient-whole-batch-bound holds the all-reduced gradient to the whole batch's bound,
  // which counts neither the shards' roundings nor the all-reduce's (a bf16 all-reduce leaves it).
  const bool whole_bound_mutant = target.mutant == "live-gradient-whole-batch-bound";
  const reference::Comparison sharded =
      whole_bound_mutant
          ? reference::compare(reduced, bound, reference::whole_batch_roundings(whole.size, options))
          : reference::compare(reduced, bound_sharded,
                               reference::sharded_roundings(ex.largest_share(), trainer.world_size(), options));
  out.ratio = sharded.max_ratio;
  reference::Comparison worst = sharded;
  const char* which = "all-reduced";
  if (whole_engine) {
    whole_engine->load_params(params);
    // At the loss scaler's scale, as the trainer ran it, unscaled in the comparison.
    whole_engine->forward_backward(whole, static_cast<float>(options.delta_scale), false);
    std::vector<float> g(layout.size());
    whole_engine->store_grads(g);
    const reference::Comparison w =
        reference::compare(g, bound, reference::whole_batch_roundings(whole.size, options), 1.0 / options.delta_scale);
    out.whole_batch_ratio = w.max_ratio;
    if (w.max_ratio > worst.max_ratio) {
      worst = w;
      which = "whole-batch";
    }
  }
  out.element = layout.describe_element(worst.worst);
  if (!worst.passed()) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "float32 %.9g, float64 reference %.17g, error ratio %.6g", worst.worst_value,
                  worst.worst_reference, worst.max_ratio);
    out.message =
        "step " + std::to_string(step) + ": the " + which + " gradient at " + out.element + " leaves the bound: " + buf;
  }
  return out;
}

void LiveChecks::reduced_gradient(Trainer& trainer, std::int64_t step) {
  if (options_.gradient_every <= 0 || step % options_.gradient_every != 0) return;
  // A step the loss scaler skips has no gradient to hold against the reference. Whether it was skipped
  // is agreed here, so that every rank runs the same collectives even when the ranks' own decisions
  // differ (the replica check then says so).
  std::int64_t skipped = trainer.found_inf() ? 1 : 0;
  trainer.comm().host().allreduce(&skipped, 1, DType::i64, ReduceOp::max);
  if (skipped) return;
  std::string mine;
  if (trainer.rank() == 0) {
    Engine& e = trainer.engine();
    std::vector<float> params(e.param_count()), reduced(e.param_count());
    e.store_params(params);
    e.store_grads(reduced);
    // What goes wrong here goes to every rank, which all throw it, so none is left waiting.
    try {
      if (!whole_) whole_ = make_engine(target_, trainer.config().model);
      const LiveGradientCheck c = check_step_gradient(target_, trainer, step, params, reduced, whole_.get());
      mine =
          nlohmann::json{
              {"ratio", c.ratio}, {"whole", c.whole_batch_ratio}, {"element", c.element}, {"message", c.message}}
              .dump();
    } catch (const std::exception& error) {
      mine = nlohmann::json{{"error", error.what()}}.dump();
    }
  }
  // Rank 0's verdict, on every rank. (The others wait for it within the collective timeout: the check
  // costs about one float64 forward and backward pass of the global batch.)
  const nlohmann::json verdict = nlohmann::json::parse(allgather_strings(trainer.comm().host(), mine)[0]);
  if (verdict.contains("error"))
    throw Error("step " + std::to_string(step) +
                ": the live gradient check failed to run: " + verdict["error"].get<std::string>());
  last_["gradient_ratio"] = verdict.at("ratio");
  last_["whole_batch_ratio"] = verdict.at("whole");
  const std::string message = verdict.at("message").get<std::string>();
  if (message.empty()) return;
  StepFailure f;
  f.kind = "gradient-bound";
  f.step = step;
  f.element = verdict.at("element").get<std::string>();
  f.message = message;
  throw StepCheckFailed(std::move(f));
}

}  // namespace dpcheck
