#include "divergence/run_checks.hpp"

#include <filesystem>

#include "src/error.hpp"

namespace dpcheck {

TrainingChecks::TrainingChecks(const Target& target, const TrainConfig& config, int world,
                               const TrainingCheckOptions& options, Communicator& world_comm)
    : target_(target),
      t_(config),
      world_(world),
      o_(options),
      state_names_(make_cpu_optimizer(config.optimizer, 0)->state_names()),
      recorder_(config.model, state_names_),
      comm_(options.trace.empty() ? world_comm : traced_.emplace(world_comm, recorder_)),
      live_(target, options.live),
      keeps_states_(options.bundle && world_comm.rank() == 0) {
  recorder_.set_digest_prefix(trace_digest_prefix(target));
}

void TrainingChecks::start(Trainer& trainer) {
  if (!o_.trace.empty()) {
    trace_writer_ = make_writer(target_, comm_, {}, o_.trace);
    trace_writer_->start_log_fresh();
    trace_writer_->log(trace_header(t_.to_json(world_), target_to_json(target_), world_, t_.model, state_names_));
    observers_.add(&recorder_);
  }
  if (o_.live.finite || o_.live.gradient_every > 0) observers_.add(&live_);
  if (!observers_.empty()) trainer.set_observer(&observers_);
  if (keeps_states_) start_ = trainer.checkpoint();
}

void TrainingChecks::before_step(Trainer& trainer) {
  if (keeps_states_) trainer.checkpoint_into(before_);
  live_.clear();
}

void TrainingChecks::after_step(Trainer& trainer, std::int64_t step, const CheckedStep& c) {
  if (!trace_writer_) return;
  const bool stopped = !c.completed;
  nlohmann::json extra = {{"loss", stopped ? nlohmann::json(nullptr) : nlohmann::json(c.result.loss)},
                          {"global_batch", trainer.global_batch(step)}};
  if (!live_.last().empty()) extra["checks"] = live_.last();
  if (stopped) extra["failure"] = c.failure->to_json();
  trace_writer_->log(recorder_.finish_step(comm_.host(), step, std::move(extra)));
}

std::string TrainingChecks::leave_bundle(Trainer& trainer, const StepFailure& f) {
  try {
    BundleManifest m;
    m.config = t_;
    m.world_size = world_;
    m.target = target_record(target_);
    m.checks = o_.live;
    m.command_line = o_.command_line;
    if (!o_.x.empty()) {
      m.x = std::filesystem::absolute(o_.x).string();
      m.y = std::filesystem::absolute(o_.y).string();
      m.x_xxh3 = file_xxh3(o_.x);
      m.y_xxh3 = file_xxh3(o_.y);
    }
    m.version = DPCHECK_VERSION;
    m.failure = f;
    for (int r = 0; r < world_; ++r) m.indices.push_back(trainer.rank_indices(r, f.step));
    m.backend = record_backend(target_);
    const std::filesystem::path path = fresh_bundle_path(o_.bundle_dir, f.step);
    write_bundle(target_, comm_, path, m, before_, start_, o_.trace, false);
    return "\nrepro bundle " + path.string() + "; replay it with: " + bundle_replay_command(target_, path, &*m.backend);
  } catch (const std::exception& e) {
    return std::string("\nno repro bundle: ") + e.what();
  }
}

void TrainingChecks::flush() {
  if (trace_writer_) trace_writer_->flush();
}

}  // namespace dpcheck
