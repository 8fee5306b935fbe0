#include "src/train/training_run.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "src/error.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

TrainingOutcome TrainingShared::outcome() const {
  TrainingOutcome out;
  out.passed = passed;
  out.failure = failure;
  out.steps = steps;
  return out;
}

namespace {

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
  RankRun(const TrainConfig& config, const TrainingRunOptions& o, RankRunParts parts, RunChecks& checks,
          TrainingRunListener& listener, TrainingShared& shared)
      : t_(config),
        o_(o),
        p_(parts),
        checks_(checks),
        listener_(listener),
        shared_(shared),
        speaks_(parts.comm.rank() == 0),
        bundles_(checks.bundles() && speaks_) {}

  void run(const std::vector<float>& params, const std::optional<Checkpoint>& resume);

 private:
  void fail(const StepFailure& f, bool collective);
  [[noreturn]] void timed_out(const TimeoutError& e, std::int64_t step);
  // After a completed step: its log line, rank 0's row, and the checkpoint or the last parameters'
  // check. False when the run stops here.
  bool finish_step(const StepResult& r);
  void report_step(const StepResult& r);

  const TrainConfig& t_;
  const TrainingRunOptions& o_;
  RankRunParts p_;
  RunChecks& checks_;
  TrainingRunListener& listener_;
  TrainingShared& shared_;
  const bool speaks_;
  const bool bundles_;  // rank 0 of a run that leaves a bundle
};

// Every rank calls it at the same step (collective: false when a peer may be gone, and then only the
// rank that saw it): says why, and leaves the bundle.
void RankRun::fail(const StepFailure& f, bool collective) {
  shared_.passed = false;
  if (speaks_) shared_.failure = f.message;
  if (!bundles_) {
    if (collective && checks_.bundles()) p_.comm.host().barrier();  // rank 0 writes the bundle meanwhile
    return;
  }
  // Rank 0 alone, so that a bundle it cannot write (a full disk, a read-only directory) costs the
  // bundle and not a hang of the others in a collective.
  shared_.failure += checks_.leave_bundle(p_.trainer, f);
  if (collective) p_.comm.host().barrier();
}

// A peer that stopped answering: rank 0 leaves a bundle, then the run ends as a timeout does.
void RankRun::timed_out(const TimeoutError& e, std::int64_t step) {
  p_.writer.flush();
  checks_.flush();
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
  if (p_.ranks_are_processes) throw;  // the launcher ends the other processes (called from the handler)
  // Ranks as threads: the stuck one can neither be stopped nor joined, so the process ends here, as
  // the plugin watchdog ends it. Another rank gives rank 0 a moment to start its bundle (rank 0 may be
  // the stuck one) and, once started, the time to finish it; one thread says why.
  if (!speaks_) {
    const auto until =
        std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(p_.timeout, std::chrono::seconds(5));
    while (shared_.timeout_bundle == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    while (shared_.timeout_bundle == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!shared_.timeout_reported.exchange(true)) listener_.end_process(e.what());
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the reporting thread ends the process
}

void RankRun::report_step(const StepResult& r) {
  if (speaks_) {
    shared_.steps.push_back(report_row(r, checks_.last()));
    listener_.step_done(r, checks_.last());
  }
  p_.writer.log(log_record(t_, r, checks_.last()));
}

bool RankRun::finish_step(const StepResult& r) {
  report_step(r);
  const std::int64_t done = p_.trainer.next_step();
  const ParamLayout layout(t_.model);
  if (!o_.checkpoint_dir.empty() &&
      ((o_.checkpoint_every > 0 && done % o_.checkpoint_every == 0) || done == t_.steps)) {
    const Checkpoint c = p_.trainer.checkpoint();
    if (has_non_finite(c.params) || has_non_finite(c.optimizer_state)) {
      fail(non_finite_state_failure(r.step, c.params, c.optimizer_state, layout, ""), true);
      if (speaks_) shared_.failure += "\nstopped without writing the checkpoint of step " + std::to_string(done);
      return false;
    }
    const std::filesystem::path saved = p_.writer.save(c, t_.model);
    if (speaks_ && !saved.empty()) listener_.line("checkpoint " + saved.string());
  } else if (done == t_.steps) {
    std::vector<float> last(layout.size());
    p_.engine.store_params(last);
    if (has_non_finite(last)) fail(non_finite_state_failure(r.step, last, {}, layout, ""), true);
  }
  return true;
}

void RankRun::run(const std::vector<float>& params, const std::optional<Checkpoint>& resume) {
  p_.engine.load_params(params);
  if (resume) p_.trainer.restore(*resume);
  checks_.start(p_.trainer);
  while (p_.trainer.next_step() < t_.steps) {
    const std::int64_t step = p_.trainer.next_step();
    if (!o_.fault.empty() && p_.comm.rank() == o_.fault_rank && step == o_.fault_step) {
      if (o_.fault == "kill") ::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // stops answering
    }
    checks_.before_step(p_.trainer);
    CheckedStep c;
    try {
      c = checked_step(p_.trainer);
    } catch (const TimeoutError& e) {
      timed_out(e, step);
    }
    checks_.after_step(p_.trainer, step, c);
    if (!c.completed) {
      if (speaks_) listener_.line(c.failure->message);
      p_.writer.log({{"step", step}, {"failure", c.failure->to_json()}});
      checks_.flush();
      fail(*c.failure, true);
      break;
    }
    if (c.failure) {
      // The step's row and log line first, then why the run stops.
      report_step(c.result);
      checks_.flush();
      fail(*c.failure, true);
      break;
    }
    if (!finish_step(c.result)) break;
  }
  p_.writer.flush();
  checks_.flush();
}

}  // namespace

void run_rank(const TrainConfig& config, const TrainingRunOptions& options, RankRunParts parts, RunChecks& checks,
              TrainingRunListener& listener, TrainingShared& shared, const std::vector<float>& params,
              const std::optional<Checkpoint>& resume) {
  RankRun(config, options, parts, checks, listener, shared).run(params, resume);
}

}  // namespace dpcheck
