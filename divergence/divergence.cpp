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

nlohmann::json StepFailure::to_json() const {
  return {{"kind", kind}, {"step", step}, {"rank", rank}, {"element", element}, {"message", message}};
}

namespace {

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

constexpr std::int64_t kMaxStep = std::int64_t{1} << 53;

}  // namespace

CheckedStep checked_step(Trainer& trainer) {
  CheckedStep c;
  try {
    c.result = trainer.step();
  } catch (const StepCheckFailed& e) {
    c.failure = e.failure;
    return c;
  }
  c.completed = true;
  // The loss is all-reduced, so every rank holds the same one. A NaN or an infinity spreads to every
  // parameter, identically on every rank, where the replica check cannot see it -- unless the loss
  // scaler passed the step over, which leaves the parameters as they were.
  if (!c.result.replicas.synchronized) c.failure = replica_failure(c.result.replicas);
  else if (!std::isfinite(c.result.loss) && !c.result.skipped) c.failure = loss_failure(c.result.step, c.result.loss);
  return c;
}

StepFailure StepFailure::from_json(const nlohmann::json& j) {
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

bool StepFailure::same_place(const StepFailure& o, std::string_view mutant) const {
  return kind == o.kind && step == o.step && rank == o.rank &&
         (element == o.element || mutant == "replay-same-place-ignores-element");
}

ReplayVerdict replay_verdict(const StepFailure& recorded, const std::optional<StepFailure>& replayed,
                             std::string_view mutant) {
  if (!replayed || !replayed->same_place(recorded, mutant)) return ReplayVerdict::not_reproduced;
  return replayed->message == recorded.message ? ReplayVerdict::bit_for_bit : ReplayVerdict::same_place;
}

std::string StepFailure::where() const {
  std::string s = "step " + std::to_string(step);
  if (rank >= 0) s += ", rank " + std::to_string(rank);
  if (!element.empty()) s += ", " + element;
  return s;
}

StepFailure replica_failure(const ReplicaReport& replicas) {
  StepFailure f;
  f.kind = "replicas";
  f.step = replicas.step;
  f.rank = replicas.minority.empty() ? -1 : replicas.minority.front();
  f.element = replicas.buffer + " " + replicas.element;
  const std::string text = replicas.describe();
  f.message = "replicas diverged: " + text.substr(0, text.find('\n'));
  return f;
}

StepFailure loss_failure(std::int64_t step, double loss) {
  StepFailure f;
  f.kind = "loss";
  f.step = step;
  f.element = "loss";
  f.message = "the loss at step " + std::to_string(step) + " is " + float_text(loss) +
              ", not finite (the run diverged, or --lr is too large); stopped, and nothing after it is checkpointed";
  return f;
}

bool has_non_finite(std::span<const float> values) {
  return std::any_of(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
}

StepFailure non_finite_state_failure(std::int64_t step, std::span<const float> params, std::span<const float> state,
                                     const ParamLayout& layout, const std::string& suffix) {
  StepFailure f;
  f.kind = "non-finite";
  f.step = step;
  const auto find = [](std::span<const float> v) {
    return static_cast<std::size_t>(std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }) -
                                    v.begin());
  };
  float value = 0;
  if (const std::size_t i = find(params); i < params.size()) {
    f.element = "parameter " + layout.describe_element(i);
    value = params[i];
  } else if (const std::size_t j = find(state); j < state.size()) {
    f.element = "optimizer state of " + layout.describe_element(j % layout.size());
    value = state[j];
  }
  f.message =
      "after step " + std::to_string(step) + " " + f.element + " is " + float_text(value) + ", not finite" + suffix;
  return f;
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

// ---- bundles -------------------------------------------------------------------------------------

nlohmann::json BundleManifest::to_json() const {
  nlohmann::json recorded_target = target_to_json(target);
  recorded_target["timeout_ms"] = target.timeout.count();
  nlohmann::json data = x.empty() ? nlohmann::json{{"synthetic", true}}
                                  : nlohmann::json{{"x", x}, {"y", y}, {"x_xxh3", x_xxh3}, {"y_xxh3", y_xxh3}};
  nlohmann::json j = {{"dpcheck_bundle", kBundleVersion},
                      {"dpcheck_version", version},
                      {"command_line", command_line},
                      {"config", config.to_json(world_size)},
                      {"target", recorded_target},
                      {"checks", {{"finite", checks.finite}, {"gradient_every", checks.gradient_every}}},
                      {"data", std::move(data)},
                      {"failure", failure.to_json()}};
  if (backend) j["backend"] = backend->to_json();
  return j;
}

BundleManifest BundleManifest::from_json(const nlohmann::json& j) {
  BundleManifest m;
  if (!j.is_object()) throw UsageError("the manifest is " + std::string(j.type_name()) + ", not an object");
  const std::int64_t v = int_field(j, "dpcheck_bundle", "", 0, 1 << 20);
  if (v != kBundleVersion)
    throw UsageError("bundle version " + std::to_string(v) + ": this dpcheck reads version " +
                     std::to_string(kBundleVersion));
  m.version = text_field(j, "dpcheck_version", "");
  const nlohmann::json& cmd = field(j, "command_line", "");
  if (!cmd.is_array()) bad_field("command_line", "is not a list");
  for (const nlohmann::json& w : cmd) {
    if (!w.is_string()) bad_field("command_line", "holds " + w.dump() + ", not a string");
    m.command_line.push_back(w.get<std::string>());
  }
  std::tie(m.config, m.world_size) = recorded_config(field(j, "config", ""));
  const nlohmann::json& t = field(j, "target", "");
  m.target = target_from_json(t);
  // The mutant bundle-precision-not-read-back: a bf16 or fp16 run's bundle replays in float32.
  if (m.target.mutant == "bundle-precision-not-read-back") m.target.precision = Precision::fp32;
  m.target.timeout = std::chrono::milliseconds(int_field(t, "timeout_ms", "target.", 1, std::int64_t{1} << 40));
  const nlohmann::json& c = field(j, "checks", "");
  m.checks.finite = bool_field(c, "finite", "checks.");
  m.checks.gradient_every = static_cast<int>(int_field(c, "gradient_every", "checks.", 0, 1 << 30));
  const nlohmann::json& d = field(j, "data", "");
  // Either synthetic data alone, or the two files: a bundle naming files it then ignores, or files
  // with no name, would replay on data other than the run's without a word.
  if (!d.is_object()) bad_field("data", "is " + d.dump() + ", not an object");
  if (d.contains("synthetic")) {
    if (!bool_field(d, "synthetic", "data."))
      bad_field("data.synthetic", "is false: name the files in data.x and data.y");
    if (d.size() != 1) bad_field("data", "is synthetic and also names files: it must be one or the other");
  } else {
    m.x = text_field(d, "x", "data.");
    m.y = text_field(d, "y", "data.");
    m.x_xxh3 = text_field(d, "x_xxh3", "data.");
    m.y_xxh3 = text_field(d, "y_xxh3", "data.");
    if (m.x.empty() || m.y.empty()) bad_field("data", "names an empty path: give \"synthetic\": true, or both files");
  }
  m.failure = StepFailure::from_json(field(j, "failure", ""));
  if (m.failure.rank >= m.world_size)
    bad_field("failure.rank", "is " + std::to_string(m.failure.rank) + ", but the run had " +
                                  std::to_string(m.world_size) + (m.world_size == 1 ? " rank" : " ranks"));
  // Written since bundles name their backend; an older bundle has none, and replays without the comparison.
  if (j.contains("backend")) m.backend = BackendRecord::from_json(j.at("backend"));
  return m;
}

fs::path fresh_bundle_path(const fs::path& parent, std::int64_t step) {
  const std::string base = "dpcheck-bundle-" + checkpoint_name(step);
  fs::path p = (parent / base).lexically_normal();
  std::error_code ec;
  for (int k = 2; fs::exists(fs::symlink_status(p, ec)); ++k)
    p = (parent / (base + "-" + std::to_string(k))).lexically_normal();
  return p;
}

namespace {

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

}  // namespace

std::string file_xxh3(const fs::path& path) {
  const std::string bytes = read_text(path);
  return digest_hex(hash_bytes(bytes.data(), bytes.size()));
}

std::string bundle_replay_command(const Target& target, const fs::path& bundle, const BackendRecord* backend) {
  // A launcher passes its environment on to the ranks it starts on this machine.
  return (backend ? recorded_env_prefix(*backend) : "") + launch_prefix(target) + dpcheck_program() + " replay " +
         shell_word(bundle.string());
}

void write_bundle(const Target& target, Communicator& comm, const fs::path& path, const BundleManifest& manifest,
                  const Checkpoint& before, const Checkpoint& start, const fs::path& trace, bool collective) {
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const std::unique_ptr<RankZeroWriter> writer = make_writer(target, comm, tmp / "checkpoint", {}, 1);
  writer->remove_abandoned_in(path.parent_path());
  writer->save(before, manifest.config.model, collective);
  make_writer(target, comm, tmp / "start", {}, 1)->save(start, manifest.config.model, collective);
  nlohmann::json indices = {{"step", manifest.failure.step}, {"ranks", manifest.indices}};
  writer->write_text(tmp / "indices.json", indices.dump() + "\n");
  if (!trace.empty() && fs::is_regular_file(trace)) writer->write_text(tmp / "trace.jsonl", read_text(trace));
  // The manifest last: a bundle with one is whole.
  nlohmann::json written = manifest.to_json();
  if (!manifest.backend) written["backend"] = record_backend(target).to_json();
  writer->write_text(tmp / "manifest.json", written.dump(2) + "\n");
  writer->publish_dir(tmp, path);
}

Bundle read_bundle(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError("bundle " + dir.string() + " is not a directory");
  if (!fs::is_regular_file(dir / "manifest.json", ec))
    throw UsageError("bundle " + dir.string() + " has no manifest.json (not a bundle, or one left half-written)");
  Bundle b;
  b.dir = dir;
  try {
    b.manifest = BundleManifest::from_json(parse_json_file(dir / "manifest.json"));
  } catch (const UsageError& e) {
    throw UsageError((dir / "manifest.json").string() + ": " + e.what());
  }
  std::vector<std::string> skipped;
  b.start = load_checkpoint(dir / "start", b.manifest.config.model, &skipped);
  try {
    b.before = load_checkpoint(dir / "checkpoint", b.manifest.config.model, &skipped);
  } catch (const UsageError& e) {
    b.before_unreadable = e.what();
    b.before = b.start;
  }
  if (b.before_unreadable.empty() && b.before.step != b.manifest.failure.step)
    throw UsageError("bundle " + dir.string() + ": its checkpoint is at step " + std::to_string(b.before.step) +
                     ", its failure at step " + std::to_string(b.manifest.failure.step));
  if (b.start.step > b.manifest.failure.step)
    throw UsageError("bundle " + dir.string() + ": its start (step " + std::to_string(b.start.step) +
                     ") is after its failing step");
  const nlohmann::json idx = parse_json_file(dir / "indices.json");
  const nlohmann::json& ranks = field(idx, "ranks", "indices.json: ");
  if (!ranks.is_array() || static_cast<int>(ranks.size()) != b.manifest.world_size)
    throw UsageError((dir / "indices.json").string() + ": \"ranks\" must list " +
                     std::to_string(b.manifest.world_size) + " ranks");
  for (const nlohmann::json& r : ranks) {
    std::vector<std::int64_t> v;
    if (!r.is_array()) throw UsageError((dir / "indices.json").string() + ": a rank's indices are not a list");
    for (const nlohmann::json& i : r) {
      if (!i.is_number_integer())
        throw UsageError((dir / "indices.json").string() + ": " + i.dump() + " is not an index");
      if (i.get<std::int64_t>() < 0 || i.get<std::int64_t>() >= b.manifest.config.data_size())
        throw UsageError((dir / "indices.json").string() + ": index " + i.dump() + " is outside the run's " +
                         std::to_string(b.manifest.config.data_size()) + " examples");
      v.push_back(i.get<std::int64_t>());
    }
    b.manifest.indices.push_back(std::move(v));
  }
  return b;
}

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

// ---- rounding or bug ----------------------------------------------------------------------------

CheckpointRun read_checkpoint_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError(dir.string() + " is not a directory (a --checkpoint-dir directory)");
  CheckpointRun run;
  run.dir = dir;
  bool have_config = false;
  for (const auto& [step, path] : checkpoint_steps(dir)) {
    std::string text;
    try {
      text = read_text(path / "manifest.json");
      const Manifest m = parse_manifest(text);
      if (!have_config) std::tie(run.config, run.world_size) = recorded_config(m.config);
      have_config = true;
      run.steps.push_back(step);
    } catch (const UsageError&) {
      continue;  // not a usable checkpoint: read_checkpoint says why when it is needed
    }
  }
  if (!have_config)
    throw UsageError("no checkpoint in " + dir.string() + " (a directory written by train --checkpoint-dir)");
  std::sort(run.steps.begin(), run.steps.end());
  return run;
}

DriftReport rounding_or_bug(const Target targets[2], const CheckpointRun runs[2], const Dataset* const data[2],
                            std::int64_t from) {
  DriftReport report;
  const auto holds = [](const CheckpointRun& r, std::int64_t s) {
    return std::binary_search(r.steps.begin(), r.steps.end(), s);
  };
  const auto load = [](const CheckpointRun& r, std::int64_t s) {
    std::string why;
    std::optional<Checkpoint> c = read_checkpoint(r.dir / checkpoint_name(s), r.config.model, &why);
    if (!c) throw UsageError("checkpoint " + (r.dir / checkpoint_name(s)).string() + " cannot be read: " + why);
    return *std::move(c);
  };
  for (const std::int64_t s : runs[0].steps) {
    if (s < from || !holds(runs[0], s + 1) || !holds(runs[1], s) || !holds(runs[1], s + 1)) continue;
    DriftStep row;
    row.step = s;
    std::vector<float> after[2];
    for (int k = 0; k < 2; ++k) {
      ReplayInput in;
      in.config = runs[k].config;
      in.world_size = runs[k].world_size;
      in.before = load(runs[k], s);
      in.step = s;
      in.data = data[k];
      Target t = targets[k];
      t.world_size = in.world_size;
      const ReplayResult r = replay_step(t, in);
      for (const PhaseRatio& p : r.phases) row.ratio[k] = std::max(row.ratio[k], p.ratio);
      row.where[k] = r.first_out_of_bound;
      if (t.mutant == "drift-judges-update-only") {
        row.where[k].clear();
        for (const PhaseRatio& p : r.phases)
          if (row.where[k].empty() && p.phase == "optimizer" && p.ratio > 1.0)
            row.where[k] = "optimizer on rank " + std::to_string(p.rank);
      }
      const Checkpoint next = load(runs[k], s + 1);
      row.same_bits[k] = r.params_after == next.params && r.state_after == next.optimizer_state;
      after[k] = next.params;
      if (report.bug_run < 0 && !row.where[k].empty()) {
        report.bug_run = k;
        report.bug_step = s;
        report.bug_where = row.where[k];
      }
      if (report.unreproduced_run < 0 && !row.same_bits[k]) {
        report.unreproduced_run = k;
        report.unreproduced_step = s;
      }
    }
    if (after[0].size() == after[1].size())
      for (std::size_t i = 0; i < after[0].size(); ++i)
        row.apart_ulp = std::max(row.apart_ulp, ulp_distance(after[0][i], after[1][i]));
    report.steps.push_back(row);
  }
  return report;
}

}  // namespace dpcheck
