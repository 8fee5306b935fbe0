// The mutants that break what a run writes and how it resumes: the writer, the checkpoint's restore,
// and the write audit's own judgement, each with its row.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/io/json_limits.hpp"

namespace dpcheck {

namespace {

template <class W> std::unique_ptr<RankZeroWriter> writer_of(Communicator& comm,
                                                             const std::filesystem::path& checkpoint_dir,
                                                             const std::filesystem::path& log_path, int keep) {
  return std::make_unique<W>(comm, checkpoint_dir, log_path, keep);
}

class AllRanksWriter final : public RankZeroWriter {
 public:
  using RankZeroWriter::RankZeroWriter;

 protected:
  bool writes() const override { return true; }
};

class SideChannelLogWriter final : public RankZeroWriter {
 public:
  using RankZeroWriter::RankZeroWriter;
  void log(const nlohmann::json& record) override {
    RankZeroWriter::log(record);
    if (comm_.rank() == 0) return;
    // The bug: a rank keeps a log of its own with plain stdio, bypassing the writer.
    const std::string path = (log_path().empty() ? std::string("dpcheck-train.log") : log_path().string()) + ".rank" +
                             std::to_string(comm_.rank());
    if (std::FILE* f = std::fopen(path.c_str(), "a")) {
      std::fputs((record.dump() + "\n").c_str(), f);
      std::fclose(f);
    }
  }
};

// Every rank finds the checkpoints that do not verify when it starts, and deletes them once training
// has begun (the bug: not rank 0 alone). The finding comes before the first step's all-reduce on every
// rank and the deleting after it, so no rank can delete a checkpoint before another has found it; and
// each deletion starts with a plain remove() of the manifest, a call the write audit sees even when
// another rank removed the file first. (Finding and deleting at once raced: a rank that listed the
// directory after rank 0 had cleaned it found nothing to delete, and the bug hid.)
class ResumeCleanupEveryRankWriter final : public RankZeroWriter {
 public:
  ResumeCleanupEveryRankWriter(Communicator& comm, const std::filesystem::path& checkpoint_dir,
                               const std::filesystem::path& log_path, int keep)
      : RankZeroWriter(comm, checkpoint_dir, log_path, keep) {
    std::error_code ec;
    if (checkpoint_dir.empty()) return;
    for (const auto& e : std::filesystem::directory_iterator(checkpoint_dir, ec))
      if (e.path().filename().string().rfind("step-", 0) == 0 && !verifies(e.path())) stale_.push_back(e.path());
  }

  void log(const nlohmann::json& record) override {
    std::error_code ec;
    for (const std::filesystem::path& dir : stale_) {
      std::filesystem::remove(dir / "manifest.json", ec);
      std::filesystem::remove_all(dir, ec);
    }
    stale_.clear();
    RankZeroWriter::log(record);
  }

 private:
  static bool verifies(const std::filesystem::path& dir) {
    try {
      std::ifstream f(dir / "manifest.json");
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      check_json_depth(text, (dir / "manifest.json").string());
      const nlohmann::json m = nlohmann::json::parse(text);
      const nlohmann::json& c = m.at("config");
      ModelConfig model;
      model.dims = parse_dims(c.at("model").get<std::string>());
      model.activation = parse_activation(c.at("activation").get<std::string>());
      model.loss = parse_loss(c.at("loss").get<std::string>());
      return read_checkpoint(dir, model).has_value();
    } catch (const std::exception&) {
      return false;
    }
  }

  std::vector<std::filesystem::path> stale_;
};

}  // namespace

std::span<const MutantInfo> file_mutants() {
  static const MutantInfo rows[] = {
      {.name = "writer-all-ranks",
       .caught_by = "only_rank0_writes",
       .bug = "the checkpoint writer does not check the rank: every rank writes",
       .parts = {.writer = writer_of<AllRanksWriter>}},
      {.name = "side-channel-log",
       .caught_by = "only_rank0_writes",
       .bug = "every rank but 0 fopen()s a log file of its own, bypassing the writer",
       .parts = {.writer = writer_of<SideChannelLogWriter>}},
      {.name = "resume-cleanup-every-rank",
       .caught_by = "only_rank0_writes",
       .bug = "every rank deletes the checkpoints that do not verify once training starts, not rank 0 alone",
       .parts = {.writer = writer_of<ResumeCleanupEveryRankWriter>}},
      {.name = "resume-skips-optimizer-state",
       .caught_by = "checkpoint_resume_bitwise",
       .bug = "resuming restores the parameters and the step but starts the optimizer state afresh",
       .parts = {.trainer = {.restored =
                                 [](Trainer& t, const Checkpoint&) {
                                   // The optimizer's state and steps start afresh.
                                   const std::vector<float> zeros(t.optimizer().state_size(), 0.0f);
                                   t.optimizer().load_state(zeros, 0);
                                 }}}},
      {.name = "resume-restarts-epoch",
       .caught_by = "checkpoint_resume_bitwise",
       .bug = "resuming from a checkpoint taken mid-epoch starts that epoch over instead of continuing it",
       .parts = {.trainer = {.restored =
                                 [](Trainer& t, const Checkpoint& c) {
                                   t.set_next_step(c.step / t.steps_per_epoch() * t.steps_per_epoch());
                                 }}}},
      // The write audit's own judgement (src/audit/audit_preload.cpp, "mutants"): the audit library in every
      // audited process takes the mutant's name from the property (audit::AuditOptions::mutant).
      {.name = "audit-rdwr-not-a-write",
       .caught_by = "audit_sees_every_write",
       .bug = "the write audit takes an open with O_RDWR but no O_CREAT, O_TRUNC or O_APPEND for a read, missing an "
              "in-place rewrite and a shared writable mmap"},
      {.name = "audit-fopen-plus-ignored",
       .caught_by = "audit_sees_every_write",
       .bug = "the write audit takes every fopen mode that starts with 'r' for a read, \"r+\" included"},
      {.name = "audit-openat-unrecorded",
       .caught_by = "audit_sees_every_write",
       .bug = "the write audit interposes openat but records nothing for it, as if programs called only open"},
  };
  return rows;
}

}  // namespace dpcheck
