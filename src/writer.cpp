#include "src/writer.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "src/error.hpp"
#include "src/files.hpp"
#include "src/hash.hpp"
#include "src/npy.hpp"

namespace dpcheck {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "dpcheck-checkpoint";
constexpr int kVersion = 1;

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string hex64(std::uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "step-00000012" -> 12; -1 for anything else.
std::int64_t step_of(const std::string& name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return -1;
  std::int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<std::pair<std::int64_t, fs::path>> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) found.emplace_back(s, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

// Temporary directories of writers that were killed: ".step-00000012.tmp-<pid>" whose pid is gone.
void remove_abandoned(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::size_t at = name.rfind(".tmp-");
    if (name.rfind(".step-", 0) != 0 || at == std::string::npos) continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot fsync directory " + dir.string() + ": " + std::strerror(err));
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

RankZeroWriter::RankZeroWriter(Communicator& comm, fs::path checkpoint_dir, fs::path log_path, int keep)
    : comm_(comm), checkpoint_dir_(std::move(checkpoint_dir)), log_path_(std::move(log_path)), keep_(keep) {
  if (keep_ < 1) throw UsageError("keep at least one checkpoint");
}

RankZeroWriter::~RankZeroWriter() {
  if (log_fd_ >= 0) {
    ::fsync(log_fd_);
    ::close(log_fd_);
  }
}

fs::path RankZeroWriter::save(const Checkpoint& c, const ModelConfig& model) {
  fs::path final_dir;
  if (writes() && !checkpoint_dir_.empty()) {
    fs::create_directories(checkpoint_dir_);
    remove_abandoned(checkpoint_dir_);
    const std::string name = checkpoint_name(c.step);
    const fs::path tmp = checkpoint_dir_ / ("." + name + ".tmp-" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    fs::create_directory(tmp);

    nlohmann::json files = nlohmann::json::object();
    const auto add_file = [&](const std::string& file, std::span<const std::int64_t> shape, std::span<const float> data) {
      write_npy(tmp / file, shape, data);
      const std::string bytes = read_bytes(tmp / file);
      files[file] = {{"bytes", bytes.size()}, {"xxh3", hex64(hash_bytes(bytes.data(), bytes.size()))}};
    };
    const ParamLayout layout(model);
    DPCHECK_ASSERT(c.params.size() == layout.size());
    for (const Slice& s : layout.slices())
      add_file(s.name + ".npy", s.shape, std::span<const float>(c.params).subspan(s.offset, s.size()));
    DPCHECK_ASSERT(c.optimizer_state.size() == c.state_names.size() * c.params.size());
    const std::vector<std::int64_t> flat{static_cast<std::int64_t>(c.params.size())};
    for (std::size_t k = 0; k < c.state_names.size(); ++k)
      add_file("optimizer." + c.state_names[k] + ".npy", flat,
               std::span<const float>(c.optimizer_state).subspan(k * c.params.size(), c.params.size()));

    // The manifest is the commit marker: written last, it vouches for every file above.
    const nlohmann::json manifest{{"format", kFormat},
                                  {"version", kVersion},
                                  {"step", c.step},
                                  {"epoch", c.epoch},
                                  {"step_in_epoch", c.step_in_epoch},
                                  {"optimizer", {{"steps", c.optimizer_steps}, {"state", c.state_names}}},
                                  {"config", c.config},
                                  {"files", files}};
    write_file_atomic(tmp / "manifest.json", manifest.dump(2) + "\n");

    final_dir = checkpoint_dir_ / name;
    const fs::path old = checkpoint_dir_ / ("." + name + ".old-" + std::to_string(::getpid()));
    const bool replacing = fs::exists(final_dir);
    if (replacing) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_dir(checkpoint_dir_);
    if (replacing) fs::remove_all(old);

    const auto all = checkpoints_in(checkpoint_dir_);
    for (std::size_t i = static_cast<std::size_t>(keep_); i < all.size(); ++i) fs::remove_all(all[i].second);
  }
  // Every rank may read the checkpoint once save() returns.
  comm_.host().barrier();
  return final_dir;
}

void RankZeroWriter::log(const nlohmann::json& record) {
  if (!writes() || log_path_.empty()) return;
  if (log_fd_ < 0) {
    log_fd_ = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0) throw Error("cannot open log " + log_path_.string() + ": " + std::strerror(errno));
  }
  const std::string line = record.dump() + "\n";
  write_all(log_fd_, line.data(), line.size(), log_path_);  // O_APPEND: one write, one whole line
}

void RankZeroWriter::flush() {
  if (log_fd_ >= 0 && ::fsync(log_fd_) != 0)
    throw Error("cannot fsync log " + log_path_.string() + ": " + std::strerror(errno));
}

std::optional<Checkpoint> read_checkpoint(const fs::path& step_dir, const ModelConfig& model, std::string* why) {
  const auto reject = [&](const std::string& reason) -> std::optional<Checkpoint> {
    if (why) *why = step_dir.filename().string() + ": " + reason;
    return std::nullopt;
  };
  const fs::path manifest_path = step_dir / "manifest.json";
  if (!fs::exists(manifest_path)) return reject("no manifest (incomplete)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_bytes(manifest_path));
  } catch (const std::exception& e) {
    return reject(std::string("unreadable manifest: ") + e.what());
  }
  try {
    if (m.at("format") != kFormat || m.at("version") != kVersion) return reject("not a dpcheck checkpoint (version 1)");
    for (const auto& [file, meta] : m.at("files").items()) {
      const fs::path p = step_dir / file;
      if (!fs::exists(p)) return reject(file + " is missing");
      const std::string bytes = read_bytes(p);
      if (bytes.size() != meta.at("bytes").get<std::size_t>()) return reject(file + " has the wrong size");
      if (hex64(hash_bytes(bytes.data(), bytes.size())) != meta.at("xxh3").get<std::string>())
        return reject(file + " does not match its hash");
    }
    Checkpoint c;
    c.step = m.at("step").get<std::int64_t>();
    c.epoch = m.at("epoch").get<std::int64_t>();
    c.step_in_epoch = m.at("step_in_epoch").get<std::int64_t>();
    c.optimizer_steps = m.at("optimizer").at("steps").get<std::int64_t>();
    c.state_names = m.at("optimizer").at("state").get<std::vector<std::string>>();
    c.config = m.at("config");
    const ParamLayout layout(model);
    c.params.resize(layout.size());
    const auto listed = [&](const std::string& file) { return m.at("files").contains(file); };
    for (const Slice& s : layout.slices()) {
      if (!listed(s.name + ".npy")) return reject(s.name + ".npy is not in the manifest (another model?)");
      const std::vector<float> v = read_npy_expect(step_dir / (s.name + ".npy"), s.shape).as_float32();
      std::copy(v.begin(), v.end(), c.params.begin() + static_cast<std::ptrdiff_t>(s.offset));
    }
    const std::vector<std::int64_t> flat{static_cast<std::int64_t>(layout.size())};
    for (const std::string& name : c.state_names) {
      const std::string file = "optimizer." + name + ".npy";
      if (!listed(file)) return reject(file + " is not in the manifest");
      const std::vector<float> v = read_npy_expect(step_dir / file, flat).as_float32();
      c.optimizer_state.insert(c.optimizer_state.end(), v.begin(), v.end());
    }
    return c;
  } catch (const std::exception& e) {
    return reject(std::string("bad manifest or file: ") + e.what());
  }
}

Checkpoint load_checkpoint(const fs::path& dir, const ModelConfig& model, std::vector<std::string>* skipped) {
  if (!fs::is_directory(dir)) throw UsageError(dir.string() + ": no such checkpoint directory");
  for (const auto& [step, path] : checkpoints_in(dir)) {
    std::string why;
    if (std::optional<Checkpoint> c = read_checkpoint(path, model, &why)) return *std::move(c);
    if (skipped) skipped->push_back(why);
  }
  throw UsageError(dir.string() + ": no complete checkpoint to resume from");
}

}  // namespace dpcheck
