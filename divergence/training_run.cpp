#include "divergence/training_run.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "divergence/trace.hpp"
#include "src/error.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

namespace {

// What the ranks share: the verdict (every rank sees the same reports, losses and parameters, so every
// rank stops at the same place; rank 0 says why), and the hand-over of a timeout among threads.
struct RunShared {
  std::atomic<bool> passed{true};
  std::string failure;
  // A timeout among threads: 1 while rank 0 writes its bundle, 2 when done; one thread reports it.
  std::atomic<int> timeout_bundle{0};
  std::atomic<bool> timeout_reported{false};
  nlohmann::json steps = nlohmann::json::array();
};

// The JSON line a step logs.
nlohmann::json log_record(const TrainConfig& t, const StepResult& r, const nlohmann::json& checks) {
  nlohmann::json record = {{"step", r.step},
                           {"loss", r.loss},
                           {"global_batch", r.global_batch},
                           {"replicas_identical", r.replicas.synchronized},
                           {"hash", r.replicas.hashes.empty() ? 0 : r.replicas.hashes[0]}};
  if (checks.contains("gradient_ratio")) record["gradient_ratio"] = checks["gradient_ratio"];
  if (t.loss_scaling.enabled()) {
    record["loss_scale"] = r.loss_scale;
    record["skipped"] = r.skipped;
  }
  if (t.bucket_mb > 0) {
    record["compute_ms"] = r.compute_seconds * 1e3;
    record["exposed_comm_ms"] = r.exposed_comm_seconds * 1e3;
    record["buckets"] = r.buckets;
    record["buckets_overlapped"] = r.buckets_overlapped;
  }
  return record;
}

// The row of rank 0's report for a step.
nlohmann::json report_row(const StepResult& r, const nlohmann::json& checks) {
  return {
      {"step", r.step},
      {"loss", std::isfinite(r.loss) ? nlohmann::json(r.loss) : nlohmann::json(nullptr)},
      {"skipped", r.skipped},
      {"loss_scale", r.loss_scale},
      {"replicas_identical", r.replicas.synchronized},
      {"gradient_error_ratio", checks.contains("gradient_ratio") ? checks["gradient_ratio"] : nlohmann::json(nullptr)}};
}

// One rank's part of the run.
class RankRun {
 public:
  RankRun(const Target& target, const TrainConfig& config, int world, const Dataset& data, const TrainingRunOptions& o,
          TrainingRunListener& listener, RunShared& shared, Communicator& world_comm)
      : target_(target),
        t_(config),
        world_(world),
        o_(o),
        listener_(listener),
        shared_(shared),
        state_names_(make_cpu_optimizer(config.optimizer, 0)->state_names()),
        recorder_(config.model, state_names_),
        comm_(o.trace.empty() ? world_comm : traced_.emplace(world_comm, recorder_)),
        rt_(make_rank_trainer(target, config, comm_, data)),
        checks_(target, o.checks),
        speaks_(comm_.rank() == 0),
        bundles_(o.bundle && speaks_) {
    recorder_.set_digest_prefix(trace_digest_prefix(target));
  }

  void run(const std::vector<float>& params, const std::optional<Checkpoint>& resume);

 private:
  void open_files();
  void fail(const StepFailure& f, bool collective);
  [[noreturn]] void timed_out(const TimeoutError& e, std::int64_t step);
  void trace_step(std::int64_t step, const CheckedStep& c);
  // After a completed step: its log line, rank 0's row, and the checkpoint or the last parameters'
  // check. False when the run stops here.
  bool finish_step(const StepResult& r);

  const Target& target_;
  const TrainConfig& t_;
  int world_;
  const TrainingRunOptions& o_;
  TrainingRunListener& listener_;
  RunShared& shared_;
  std::vector<std::string> state_names_;
  // With a trace, the trainer talks through the recorder's wrapper, which sees its data collectives.
  TraceRecorder recorder_;
  std::optional<TracingCommunicator> traced_;
  Communicator& comm_;
  RankTrainer rt_;
  LiveChecks checks_;
  StepObservers observers_;
  std::unique_ptr<RankZeroWriter> writer_, trace_writer_;
  const bool speaks_;
  // Rank 0 keeps the state before each step, and the one the run began from, for the bundle that a
  // failing step leaves.
  const bool bundles_;
  Checkpoint before_, start_;
};

void RankRun::open_files() {
  writer_ = make_writer(target_, comm_, o_.checkpoint_dir, o_.log, o_.keep);
  if (!o_.trace.empty()) {
    trace_writer_ = make_writer(target_, comm_, {}, o_.trace);
    trace_writer_->start_log_fresh();
    trace_writer_->log(trace_header(t_.to_json(world_), target_to_json(target_), world_, t_.model, state_names_));
  }
}

// Every rank calls it at the same step (collective: false when a peer may be gone, and then only the
// rank that saw it): says why, and leaves the bundle.
void RankRun::fail(const StepFailure& f, bool collective) {
  shared_.passed = false;
  if (speaks_) shared_.failure = f.message;
  if (!bundles_) {
    if (collective && o_.bundle) comm_.host().barrier();  // rank 0 writes the bundle meanwhile
    return;
  }
  try {
    BundleManifest m;
    m.config = t_;
    m.world_size = world_;
    m.target = target_record(target_);
    m.checks = o_.checks;
    m.command_line = o_.command_line;
    if (!o_.x.empty()) {
      m.x = std::filesystem::absolute(o_.x).string();
      m.y = std::filesystem::absolute(o_.y).string();
      m.x_xxh3 = file_xxh3(o_.x);
      m.y_xxh3 = file_xxh3(o_.y);
    }
    m.version = DPCHECK_VERSION;
    m.failure = f;
    for (int r = 0; r < world_; ++r) m.indices.push_back(rt_.trainer->rank_indices(r, f.step));
    m.backend = record_backend(target_);
    const std::filesystem::path path = fresh_bundle_path(o_.bundle_dir, f.step);
    // Rank 0 alone, so that a bundle it cannot write (a full disk, a read-only directory) costs the
    // bundle and not a hang of the others in a collective.
    write_bundle(target_, comm_, path, m, before_, start_, o_.trace, false);
    shared_.failure +=
        "\nrepro bundle " + path.string() + "; replay it with: " + bundle_replay_command(target_, path, &*m.backend);
  } catch (const std::exception& e) {
    shared_.failure += std::string("\nno repro bundle: ") + e.what();
  }
  if (collective) comm_.host().barrier();
}

// A peer that stopped answering: rank 0 leaves a bundle, then the run ends as a timeout does.
void RankRun::timed_out(const TimeoutError& e, std::int64_t step) {
  if (writer_) writer_->flush();
  if (trace_writer_) trace_writer_->flush();
  StepFailure f;
  f.kind = "timeout";
  f.step = step;
  f.message = e.what();
  if (speaks_) {
    shared_.timeout_bundle = 1;
    fail(f, false);
    shared_.timeout_bundle = 2;
    listener_.line(shared_.failure.substr(shared_.failure.find('\n') + 1));
  }
  if (target_.process_world) throw;  // the launcher ends the other processes (called from the handler)
  // Ranks as threads: the stuck one can neither be stopped nor joined, so the process ends here, as
  // the plugin watchdog ends it. Another rank gives rank 0 a moment to start its bundle (rank 0 may be
  // the stuck one) and, once started, the time to finish it; one thread says why.
  if (!speaks_) {
    const auto until = std::chrono::steady_clock::now() +
                       std::min<std::chrono::milliseconds>(target_.timeout, std::chrono::seconds(5));
    while (shared_.timeout_bundle == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    while (shared_.timeout_bundle == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!shared_.timeout_reported.exchange(true)) listener_.end_process(e.what());
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the reporting thread ends the process
}

void RankRun::trace_step(std::int64_t step, const CheckedStep& c) {
  const bool stopped = !c.completed;
  nlohmann::json extra = {{"loss", stopped ? nlohmann::json(nullptr) : nlohmann::json(c.result.loss)},
                          {"global_batch", rt_.trainer->global_batch(step)}};
  if (!checks_.last().empty()) extra["checks"] = checks_.last();
  if (stopped) extra["failure"] = c.failure->to_json();
  trace_writer_->log(recorder_.finish_step(comm_.host(), step, std::move(extra)));
}

bool RankRun::finish_step(const StepResult& r) {
  if (speaks_) {
    shared_.steps.push_back(report_row(r, checks_.last()));
    listener_.step_done(r, checks_.last());
  }
  writer_->log(log_record(t_, r, checks_.last()));
  const std::int64_t done = rt_.trainer->next_step();
  const ParamLayout layout(t_.model);
  if (!o_.checkpoint_dir.empty() &&
      ((o_.checkpoint_every > 0 && done % o_.checkpoint_every == 0) || done == t_.steps)) {
    const Checkpoint c = rt_.trainer->checkpoint();
    if (has_non_finite(c.params) || has_non_finite(c.optimizer_state)) {
      fail(non_finite_state_failure(r.step, c.params, c.optimizer_state, layout, ""), true);
      if (speaks_) shared_.failure += "\nstopped without writing the checkpoint of step " + std::to_string(done);
      return false;
    }
    const std::filesystem::path saved = writer_->save(c, t_.model);
    if (speaks_ && !saved.empty()) listener_.line("checkpoint " + saved.string());
  } else if (done == t_.steps) {
    std::vector<float> last(layout.size());
    rt_.engine->store_params(last);
    if (has_non_finite(last)) fail(non_finite_state_failure(r.step, last, {}, layout, ""), true);
  }
  return true;
}

void RankRun::run(const std::vector<float>& params, const std::optional<Checkpoint>& resume) {
  rt_.engine->load_params(params);
  if (resume) rt_.trainer->restore(*resume);
  open_files();
  if (!o_.trace.empty()) observers_.add(&recorder_);
  if (o_.checks.finite || o_.checks.gradient_every > 0) observers_.add(&checks_);
  if (!observers_.empty()) rt_.trainer->set_observer(&observers_);
  if (bundles_) start_ = rt_.trainer->checkpoint();
  while (rt_.trainer->next_step() < t_.steps) {
    const std::int64_t step = rt_.trainer->next_step();
    if (!o_.fault.empty() && comm_.rank() == o_.fault_rank && step == o_.fault_step) {
      if (o_.fault == "kill") ::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // stops answering
    }
    if (bundles_) rt_.trainer->checkpoint_into(before_);
    checks_.clear();
    CheckedStep c;
    try {
      c = checked_step(*rt_.trainer);
    } catch (const TimeoutError& e) {
      timed_out(e, step);
    }
    if (!o_.trace.empty()) trace_step(step, c);
    if (!c.completed) {
      if (speaks_) listener_.line(c.failure->message);
      writer_->log({{"step", step}, {"failure", c.failure->to_json()}});
      if (trace_writer_) trace_writer_->flush();
      fail(*c.failure, true);
      break;
    }
    if (c.failure) {
      // The step's row and log line first, then why the run stops.
      if (speaks_) {
        shared_.steps.push_back(report_row(c.result, checks_.last()));
        listener_.step_done(c.result, checks_.last());
      }
      writer_->log(log_record(t_, c.result, checks_.last()));
      if (trace_writer_) trace_writer_->flush();
      fail(*c.failure, true);
      break;
    }
    if (!finish_step(c.result)) break;
  }
  writer_->flush();
  if (trace_writer_) trace_writer_->flush();
}

}  // namespace

TrainingOutcome run_training(const Target& target, const TrainConfig& config, int world, const Dataset& data,
                             const std::vector<float>& params, const std::optional<Checkpoint>& resume,
                             const TrainingRunOptions& options, TrainingRunListener& listener) {
  RunShared shared;
  run_world(target, world, [&](Communicator& comm) {
    RankRun rank(target, config, world, data, options, listener, shared, comm);
    rank.run(params, resume);
  });
  TrainingOutcome out;
  out.passed = shared.passed;
  out.failure = shared.failure;
  out.steps = std::move(shared.steps);
  return out;
}

}  // namespace dpcheck
