// Tests for src/train/training_run: one rank's part of a training run, with the checks it is given.
// Every rank steps to the end, logging a line a step and checkpointing on rank 0; on a failure, whether
// the trainer's own check finds it after the step (replicas that differ) or a check inside the step
// stops it (StepCheckFailed on every rank), every rank stops at the same step, rank 0 alone leaves the
// bundle, and its account says so. Ranks run as threads of the local backend.
#include "src/train/training_run.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "src/target/target.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

// What one rank's checks were asked, and a check inside the step that fails at `fail_at` on every rank.
class RecordingChecks final : public RunChecks, public StepObserver {
 public:
  explicit RecordingChecks(bool bundles, std::int64_t fail_at = -1) : bundles_(bundles), fail_at_(fail_at) {}

  void start(Trainer& trainer) override {
    ++starts;
    if (fail_at_ >= 0) trainer.set_observer(this);
  }
  void before_step(Trainer&) override { ++befores; }
  const nlohmann::json& last() const override { return last_; }
  void after_step(std::int64_t step, const CheckedStep& c) override {
    steps.push_back(step);
    completed.push_back(c.completed);
  }
  bool bundles() const override { return bundles_; }
  std::string leave_bundle(Trainer&, const StepFailure& f) override {
    ++bundles_left;
    return "\nbundle of " + f.kind + " at step " + std::to_string(f.step);
  }
  void flush() override { ++flushes; }
  void local_gradient(Trainer&, std::int64_t step, double, std::int64_t) override {
    if (step != fail_at_) return;
    StepFailure f;
    f.kind = "non-finite";
    f.step = step;
    f.message = "planted at step " + std::to_string(step);
    throw StepCheckFailed(f);
  }

  int starts = 0, befores = 0, bundles_left = 0, flushes = 0;
  std::vector<std::int64_t> steps;
  std::vector<bool> completed;

 private:
  bool bundles_;
  std::int64_t fail_at_;
  nlohmann::json last_ = nlohmann::json::object();
};

class Lines final : public TrainingRunListener {
 public:
  void step_done(const StepResult& r, const nlohmann::json&) override {
    const std::lock_guard<std::mutex> lock(mu_);
    done.push_back(r.step);
  }
  void line(const std::string& text) override {
    const std::lock_guard<std::mutex> lock(mu_);
    lines.push_back(text);
  }
  [[noreturn]] void end_process(const std::string& message) override { throw Error("end_process: " + message); }

  std::vector<std::int64_t> done;
  std::vector<std::string> lines;

 private:
  std::mutex mu_;
};

TrainConfig small_run(std::int64_t steps) {
  TrainConfig c;
  c.model = ModelConfig{{4, 8, 3}, Activation::relu, Loss::mse};
  c.batch = 12;
  c.steps = steps;
  return c;
}

struct World {
  TrainingShared shared;
  std::vector<RecordingChecks> checks;
  Lines listener;
};

// Trains `config` on `world` ranks of `target`; each rank's checks are checks[rank].
void train(const Target& target, const TrainConfig& config, const TrainingRunOptions& options, World& w) {
  const SyntheticDataset data(config.data_size(), config.model, config.seed);
  const std::vector<float> params = init_params(config.model, config.seed);
  run_world(target, static_cast<int>(w.checks.size()), [&](Communicator& comm) {
    const RankTrainer rt = make_rank_trainer(target, config, comm, data);
    const auto writer = make_writer(target, comm, options.checkpoint_dir, options.log, options.keep);
    run_rank(config, options,
             {.comm = comm, .trainer = *rt.trainer, .engine = *rt.engine, .writer = *writer, .timeout = target.timeout},
             w.checks[comm.rank()], w.listener, w.shared, params, std::nullopt);
  });
}

std::size_t lines_in(const fs::path& file) {
  std::ifstream in(file);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

TEST(TrainingRun, EveryRankStepsToTheEndLoggingAndCheckpointingOnRankZero) {
  const ScratchDir dir;
  TrainingRunOptions o;
  o.checkpoint_dir = (dir.path() / "ckpt").string();
  o.checkpoint_every = 2;
  o.log = (dir.path() / "log.jsonl").string();
  World w;
  w.checks.assign(3, RecordingChecks(true));
  train(Target{}, small_run(4), o, w);
  const TrainingOutcome out = w.shared.outcome();
  EXPECT_TRUE(out.passed) << out.failure;
  EXPECT_EQ(out.steps.size(), 4u);
  EXPECT_EQ(w.listener.done, (std::vector<std::int64_t>{0, 1, 2, 3}));  // rank 0's, once each
  for (const RecordingChecks& c : w.checks) {
    EXPECT_EQ(c.starts, 1);
    EXPECT_EQ(c.befores, 4);
    EXPECT_EQ(c.steps, (std::vector<std::int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(c.bundles_left, 0);
  }
  EXPECT_EQ(lines_in(o.log), 4u);
  EXPECT_TRUE(fs::exists(fs::path(o.checkpoint_dir) / "step-00000002"));
  EXPECT_TRUE(fs::exists(fs::path(o.checkpoint_dir) / "step-00000004"));
  EXPECT_EQ(w.listener.lines.size(), 2u);  // the two checkpoints
}

// Replicas that differ after the step: the step's row and log line, then every rank stops there, and
// rank 0 alone leaves the bundle, whose words end its account.
TEST(TrainingRun, ATrainerCheckStopsEveryRankAtTheSameStepWithOneBundle) {
  Target target;
  target.mutant = "allreduce-rank-order";
  World w;
  w.checks.assign(3, RecordingChecks(true));
  train(target, small_run(5), {}, w);
  const TrainingOutcome out = w.shared.outcome();
  ASSERT_FALSE(out.passed);
  EXPECT_TRUE(out.failure.starts_with("replicas diverged")) << out.failure;
  const std::int64_t at = w.checks[0].steps.back();
  EXPECT_TRUE(out.failure.ends_with("\nbundle of replicas at step " + std::to_string(at))) << out.failure;
  for (std::size_t r = 0; r < w.checks.size(); ++r) {
    EXPECT_EQ(w.checks[r].steps.back(), at) << "rank " << r;
    EXPECT_TRUE(w.checks[r].completed.back()) << "rank " << r;
    EXPECT_EQ(w.checks[r].bundles_left, r == 0 ? 1 : 0) << "rank " << r;
  }
  EXPECT_EQ(w.listener.done.back(), at);
  EXPECT_EQ(out.steps.size(), static_cast<std::size_t>(at + 1));
}

// A check inside the step that stops it on every rank: no row for the step, its message printed, a
// failure line logged, and without bundles nobody leaves one (and nobody waits for one).
TEST(TrainingRun, ACheckInsideTheStepStopsItOnEveryRank) {
  const ScratchDir dir;
  TrainingRunOptions o;
  o.log = (dir.path() / "log.jsonl").string();
  World w;
  w.checks.assign(2, RecordingChecks(false, 2));
  train(Target{}, small_run(5), o, w);
  const TrainingOutcome out = w.shared.outcome();
  ASSERT_FALSE(out.passed);
  EXPECT_EQ(out.failure, "planted at step 2");
  EXPECT_EQ(out.steps.size(), 2u);
  for (const RecordingChecks& c : w.checks) {
    EXPECT_EQ(c.steps, (std::vector<std::int64_t>{0, 1, 2}));
    EXPECT_EQ(c.completed, (std::vector<bool>{true, true, false}));
    EXPECT_EQ(c.bundles_left, 0);
    EXPECT_GE(c.flushes, 1);
  }
  EXPECT_EQ(w.listener.lines, (std::vector<std::string>{"planted at step 2"}));
  EXPECT_EQ(lines_in(o.log), 3u);
}

}  // namespace
}  // namespace dpcheck
