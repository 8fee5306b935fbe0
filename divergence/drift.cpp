// Rounding or bug (divergence/divergence.hpp): two runs' checkpoints read back and walked step by step,
// for dpcheck drift.
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

// ---- rounding or bug ----------------------------------------------------------------------------

CheckpointRun read_checkpoint_run(const fs::path& dir) {
  using namespace divergence_json;
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
