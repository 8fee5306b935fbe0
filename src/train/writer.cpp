// RankZeroWriter (writer.hpp): checkpoints written whole or not at all, the newest kept, and the log.
// The format they are read back by is checkpoint_format.cpp's.
#include "src/train/writer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/hash.hpp"
#include "src/io/json_limits.hpp"
#include "src/io/npy.hpp"
#include "src/train/checkpoint_files.hpp"
#include "src/train/train_config.hpp"

namespace dpcheck {

namespace fs = std::filesystem;

namespace {

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

// A defect found in a checkpoint: thrown while checking one, caught where its reason is reported.

// Temporary directories of writers that were killed: ".<name>.tmp-<pid>" (a checkpoint's
// ".step-00000012.tmp-<pid>", a bundle's ".dpcheck-bundle-step-00000003.tmp-<pid>") whose pid is gone.
void remove_abandoned(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::size_t at = name.rfind(".tmp-");
    if (name.empty() || name[0] != '.' || at == std::string::npos || at + 5 >= name.size()) continue;
    if (name.find_first_not_of("0123456789", at + 5) != std::string::npos) continue;
    if (!e.is_directory(ec)) continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
}

// Keeps the newest `keep` checkpoint directories, counting the one just written whatever its step: a
// run resumed from an older checkpoint must not delete what it has just written in favour of newer
// ones it could not use.
void prune(const fs::path& dir, const fs::path& written, int keep) {
  int kept = 1;
  std::error_code ec;
  for (const auto& [step, path] : checkpoint_files::checkpoints_in(dir)) {
    if (path == written || !fs::is_directory(fs::symlink_status(path, ec))) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    fs::remove_all(path);
  }
}

UsageError not_a_regular_log(const fs::path& path, mode_t mode) {
  return UsageError("log " + path.string() + " is " + file_kind(mode) + ", not a regular file");
}

}  // namespace

RankZeroWriter::RankZeroWriter(Communicator& comm, fs::path checkpoint_dir, fs::path log_path, int keep)
    : comm_(comm), checkpoint_dir_(std::move(checkpoint_dir)), log_path_(std::move(log_path)), keep_(keep) {
  if (keep_ < 1) throw UsageError("keep at least one checkpoint");
  // A log that can never be opened is refused before the first step, on every rank alike (a stat
  // writes nothing); log() checks again when it opens the file.
  struct stat st {};
  if (!log_path_.empty() && ::stat(log_path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw not_a_regular_log(log_path_, st.st_mode);
}

RankZeroWriter::~RankZeroWriter() {
  if (log_fd_ >= 0) {
    ::fsync(log_fd_);
    ::close(log_fd_);
  }
}

fs::path RankZeroWriter::save(const Checkpoint& c, const ModelConfig& model, bool collective) {
  fs::path final_dir;
  std::exception_ptr failed;  // this rank's, when it could not write the checkpoint, and its text
  std::string why;
  if (writes() && !checkpoint_dir_.empty()) try {
      fs::create_directories(checkpoint_dir_);
      remove_abandoned(checkpoint_dir_);
      const std::string name = checkpoint_name(c.step);
      const fs::path tmp = checkpoint_dir_ / ("." + name + ".tmp-" + std::to_string(::getpid()));
      fs::remove_all(tmp);
      fs::create_directory(tmp);
      // Every way out before the rename removes the temporary directory (a full disk, `ulimit -f`), and
      // says the checkpoint's own path rather than the temporary one's.
      struct RemoveUnlessPublished {
        const fs::path& dir;
        bool published = false;
        ~RemoveUnlessPublished() {
          std::error_code ec;
          if (!published) fs::remove_all(dir, ec);
        }
      } cleanup{tmp};
      try {
        nlohmann::json files = nlohmann::json::object();
        const auto add_file = [&](const std::string& file, std::span<const std::int64_t> shape,
                                  std::span<const float> data) {
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
        nlohmann::json manifest{{"format", checkpoint_files::kFormat},
                                {"version", checkpoint_files::kVersion},
                                {"step", c.step},
                                {"epoch", c.epoch},
                                {"step_in_epoch", c.step_in_epoch},
                                {"optimizer", {{"steps", c.optimizer_steps}, {"state", c.state_names}}},
                                {"config", c.config},
                                {"files", files}};
        if (c.loss_scaler)
          manifest["loss_scaler"] = {{"scale", c.loss_scaler->scale},
                                     {"growth_tracker", c.loss_scaler->growth_tracker},
                                     {"skipped", c.loss_scaler->skipped}};
        const std::string text = manifest.dump(2) + "\n";
        // The writer never writes what its reader would refuse: fields that disagree (a step that is not
        // the epoch's, optimizer steps that are not the step) are a bug in the caller, reported now rather
        // than at the resume.
        try {
          parse_manifest(text);
        } catch (const UsageError& e) {
          fs::remove_all(tmp);
          throw Error("refusing to write checkpoint " + name + ": its manifest.json would be refused: " + e.what());
        }
        write_file_atomic(tmp / checkpoint_files::kManifest, text);

      } catch (const std::exception& e) {
        std::string what = e.what();
        const std::string from = tmp.string(), to = (checkpoint_dir_ / name).string();
        for (std::size_t at = what.find(from); at != std::string::npos; at = what.find(from, at + to.size()))
          what.replace(at, from.size(), to);
        throw Error("cannot write checkpoint " + to + ": " + what);
      }

      final_dir = checkpoint_dir_ / name;
      const fs::path old = checkpoint_dir_ / ("." + name + ".old-" + std::to_string(::getpid()));
      const bool replacing = fs::exists(final_dir);
      if (replacing) fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      cleanup.published = true;
      sync_directory(checkpoint_dir_);
      if (replacing) fs::remove_all(old);

      prune(checkpoint_dir_, final_dir, keep_);
    } catch (const std::exception& e) {
      if (!collective) throw;
      failed = std::current_exception();
      why = *e.what() ? e.what() : "cannot write checkpoint " + checkpoint_name(c.step);
    } catch (...) {
      if (!collective) throw;
      failed = std::current_exception();
      why = "cannot write checkpoint " + checkpoint_name(c.step);
    }
  // Every rank may read the checkpoint once save() returns. When the writing rank could not write it,
  // every rank ends with its error here, instead of waiting in a barrier (or at the next collective) for
  // a rank that has left.
  if (collective) {
    const std::vector<std::string> said = allgather_strings(comm_.host(), why);
    if (failed) std::rethrow_exception(failed);
    for (std::size_t r = 0; r < said.size(); ++r)
      if (!said[r].empty()) throw Error("rank " + std::to_string(r) + ": " + said[r]);
  }
  return final_dir;
}

void RankZeroWriter::write_text(const fs::path& path, std::string_view contents) {
  if (!writes()) return;
  fs::create_directories(path.parent_path());
  write_file_atomic(path, contents);
}

void RankZeroWriter::remove_abandoned_in(const fs::path& dir) const {
  if (writes()) remove_abandoned(dir.empty() ? fs::path(".") : dir);
}

void RankZeroWriter::publish_dir(const fs::path& from, const fs::path& to) {
  if (!writes()) return;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(to, ec))) throw Error("cannot publish " + to.string() + ": it exists");
  fs::rename(from, to);
  sync_directory(to.parent_path().empty() ? fs::path(".") : to.parent_path());
}

void RankZeroWriter::log(const nlohmann::json& record) {
  if (!writes() || log_path_.empty()) return;
  if (log_fd_ < 0) {
    // Only a regular file will do: opening a FIFO for writing blocks until a reader comes, and writing
    // to a device or socket is no log. O_NONBLOCK makes the open return at once whatever the path is
    // (a FIFO with no reader fails with ENXIO), fstat says what was opened, and blocking writes resume.
    struct stat st {};
    if (::stat(log_path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) throw not_a_regular_log(log_path_, st.st_mode);
    const int fd =
        ::open(log_path_.c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (log_truncate_ ? O_TRUNC : 0),
               new_file_mode);
    if (fd < 0) {
      const int err = errno;
      if (err == ENXIO && ::stat(log_path_.c_str(), &st) == 0) throw not_a_regular_log(log_path_, st.st_mode);
      throw Error("cannot open log " + log_path_.string() + ": " + std::strerror(err));
    }
    FileDescriptor opened(fd);
    if (::fstat(fd, &st) != 0) throw Error("cannot stat log " + log_path_.string() + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw not_a_regular_log(log_path_, st.st_mode);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
      throw Error("cannot make log " + log_path_.string() + " blocking: " + std::strerror(errno));
    log_fd_ = opened.release();
  }
  const std::string line = record.dump() + "\n";
  write_all(log_fd_, line.data(), line.size(), log_path_);  // O_APPEND: one write, one whole line
}

void RankZeroWriter::flush() {
  if (log_fd_ >= 0 && ::fsync(log_fd_) != 0)
    throw Error("cannot fsync log " + log_path_.string() + ": " + std::strerror(errno));
}

}  // namespace dpcheck
