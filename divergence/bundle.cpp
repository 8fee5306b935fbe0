// Repro bundles (divergence/divergence.hpp): a failing step's manifest, written beside its checkpoint
// and data, read back whole, and the command that replays one.
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
  using namespace divergence_json;
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
  m.failure = step_failure_from_json(field(j, "failure", ""));
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

std::string file_xxh3(const fs::path& path) {
  using namespace divergence_json;
  const std::string bytes = read_text(path);
  return digest_hex(hash_bytes(bytes.data(), bytes.size()));
}

std::string bundle_replay_command(const Target& target, const fs::path& bundle, const BackendRecord* backend) {
  using namespace divergence_json;
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
  if (!trace.empty() && fs::is_regular_file(trace))
    writer->write_text(tmp / "trace.jsonl", divergence_json::read_text(trace));
  // The manifest last: a bundle with one is whole.
  nlohmann::json written = manifest.to_json();
  if (!manifest.backend) written["backend"] = record_backend(target).to_json();
  writer->write_text(tmp / "manifest.json", written.dump(2) + "\n");
  writer->publish_dir(tmp, path);
}

Bundle read_bundle(const fs::path& dir) {
  using namespace divergence_json;
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

}  // namespace dpcheck
