// RankZeroWriter and the checkpoint reader (writer.hpp says what a checkpoint holds and what the reader
// checks). Every refusal of a checkpoint is a UsageError whose text is the reason, caught where the
// checkpoint is named, so that each skipped candidate is reported as "step-00000012: <reason>".
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
#include "src/train/train_config.hpp"

namespace dpcheck {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "dpcheck-checkpoint";
constexpr int kVersion = 1;
// Counts (steps, epochs, bytes, examples) must be exact in a double as well as an int64, so that no
// JSON reader rounds them and no arithmetic on them overflows.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;
constexpr std::int64_t kMaxInt = std::int64_t{std::numeric_limits<int>::max()} + 1;
constexpr std::size_t kMaxManifestBytes = std::size_t{16} << 20;
const char* const kManifest = "manifest.json";

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
[[noreturn]] void refuse(const std::string& reason) { throw UsageError(reason); }

// "step-00000012" (or more digits past step 99999999) -> 12; -1 for any other name.
std::int64_t step_of(const std::string& name) {
  constexpr std::size_t kMaxDigits = 16;  // 2^53 has 16
  if (name.rfind("step-", 0) != 0 || name.size() < 13 || name.size() > 5 + kMaxDigits) return -1;
  std::int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v < kMaxCount && checkpoint_name(v) == name ? v : -1;
}

// Every entry named like a checkpoint, of whatever type (the reader says why a non-directory is
// unusable), newest first.
std::vector<std::pair<std::int64_t, fs::path>> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t s = step_of(e.path().filename().string());
    if (s >= 0) found.emplace_back(s, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

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
  for (const auto& [step, path] : checkpoints_in(dir)) {
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

// ---- the manifest ---------------------------------------------------------------------------------

// A JSON value as a reason quotes it: short enough for one line.
std::string shown_json(const nlohmann::json& v) {
  constexpr std::size_t kMax = 60;
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// A field's name as JSON spells it, quotes and escapes included.
std::string in_quotes(const std::string& name) { return shown_json(nlohmann::json(name)); }

std::string bound_text(std::int64_t hi) {
  if (hi == kMaxCount) return "2^53";
  if (hi == kMaxInt) return "2^31";
  return std::to_string(hi);
}

// The fields of a JSON object, each looked up by name and each named in full ("config.batch") when
// it is missing or wrong. Fields nobody asked for are refused by done(), so that nothing in a manifest
// is silently ignored.
class Fields {
 public:
  Fields(const nlohmann::json& object, std::string name) : object_(object), prefix_(name.empty() ? "" : name + ".") {
    if (!object.is_object())
      refuse((name.empty() ? std::string("the manifest") : in_quotes(name)) + " is " + shown_json(object) +
             ", not a JSON object");
  }

  const nlohmann::json& at(const std::string& key) {
    used_.insert(key);
    const auto it = object_.find(key);
    if (it == object_.end()) refuse(in_quotes(prefix_ + key) + " is missing");
    return *it;
  }
  std::string name(const std::string& key) const { return prefix_ + key; }

  // An integer in [lo, hi): not a float (1e30, 2.5), string or boolean, whatever its value.
  std::int64_t integer(const std::string& key, std::int64_t lo, std::int64_t hi) {
    const nlohmann::json& v = at(key);
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if (u < static_cast<std::uint64_t>(hi) && static_cast<std::int64_t>(u) >= lo) return static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      const std::int64_t i = v.get<std::int64_t>();
      if (i >= lo && i < hi) return i;
    }
    refuse(in_quotes(name(key)) + " is " + shown_json(v) + ", not an integer in [" + std::to_string(lo) + ", " +
           bound_text(hi) + ")");
  }
  std::uint64_t unsigned_integer(const std::string& key) {
    const nlohmann::json& v = at(key);
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    refuse(in_quotes(name(key)) + " is " + shown_json(v) + ", not an integer in [0, 2^64)");
  }
  double number(const std::string& key) {
    const nlohmann::json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      refuse(in_quotes(name(key)) + " is " + shown_json(v) + ", not a finite number");
    return v.get<double>();
  }
  bool boolean(const std::string& key) {
    const nlohmann::json& v = at(key);
    if (!v.is_boolean()) refuse(in_quotes(name(key)) + " is " + shown_json(v) + ", not true or false");
    return v.get<bool>();
  }
  std::string text(const std::string& key) {
    const nlohmann::json& v = at(key);
    if (!v.is_string()) refuse(in_quotes(name(key)) + " is " + shown_json(v) + ", not a string");
    return v.get<std::string>();
  }
  // A string that `parse` turns into a value, or refuses (UsageError) with its own reason.
  template <class Parse> auto choice(const std::string& key, Parse parse) {
    const std::string t = text(key);
    try {
      return parse(t);
    } catch (const UsageError& e) {
      refuse(in_quotes(name(key)) + ": " + e.what());
    }
  }

  bool has(const std::string& key) const { return object_.contains(key); }

  void done() const {
    for (const auto& [key, value] : object_.items())
      if (used_.count(key) == 0) refuse(in_quotes(name(key)) + " is not a field of a dpcheck checkpoint manifest");
  }

 private:
  const nlohmann::json& object_;
  std::string prefix_;
  std::set<std::string> used_;
};

// JSON text to a value, refusing what nlohmann would otherwise accept quietly: a key given twice
// (the last would win, so two readers could disagree about the step).
nlohmann::json parse_json(std::string_view text) {
  check_json_depth(text, "the manifest");
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string twice;
  const nlohmann::json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, ..." without the bracketed id.
    std::string what = e.what();
    if (const std::size_t close = what.find("] "); what.rfind("[json.exception.", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    refuse("not valid JSON: " + what);
  }
  if (!twice.empty()) refuse(in_quotes(twice) + " is given twice");
  return j;
}

}  // namespace

std::pair<TrainConfig, int> recorded_config(const nlohmann::json& doc) {
  Fields f(doc, "config");
  TrainConfig c;
  c.model.dims = f.choice("model", [](std::string_view t) { return parse_dims(t); });
  c.model.activation = f.choice("activation", parse_activation);
  c.model.loss = f.choice("loss", parse_loss);
  c.batch = f.integer("batch", 1, kMaxCount);
  c.dataset_size = f.integer("dataset_size", 1, kMaxCount);
  c.accumulate = static_cast<int>(f.integer("accumulate", 1, kMaxInt));
  c.optimizer.kind = f.choice("optimizer", parse_optimizer);
  c.optimizer.lr = f.number("lr");
  c.optimizer.momentum = f.number("momentum");
  c.optimizer.beta1 = f.number("beta1");
  c.optimizer.beta2 = f.number("beta2");
  c.optimizer.eps = f.number("eps");
  c.linear_scaling = f.boolean("linear_scaling");
  c.shuffle = f.boolean("shuffle");
  c.split = f.choice("split", parse_split);
  c.policy = f.choice("policy", parse_policy);
  c.seed = f.unsigned_integer("seed");
  const int world = static_cast<int>(f.integer("world_size", 1, kMaxInt));
  if (f.has("warmup_steps")) c.warmup_steps = f.integer("warmup_steps", 1, kMaxCount);
  if (f.has("allreduce_dtype")) c.allreduce_dtype = f.choice("allreduce_dtype", parse_allreduce_dtype);
  if (f.has("bucket_mb")) c.bucket_mb = f.number("bucket_mb");  // validate() refuses a size --bucket-mb would
  if (f.has("loss_scale")) {
    c.loss_scaling.kind = f.choice("loss_scale", parse_loss_scaling);
    c.loss_scaling.init_scale = f.number("loss_scale_init");
    c.loss_scaling.growth_interval = f.integer("loss_scale_interval", 1, kMaxCount);
  }
  f.done();
  // A model too large to address is refused before any layout is built from it.
  std::uint64_t count = 0;
  for (std::size_t l = 0; l + 1 < c.model.dims.size(); ++l) {
    count += (static_cast<std::uint64_t>(c.model.dims[l]) + 1) * static_cast<std::uint64_t>(c.model.dims[l + 1]);
    if (count >= static_cast<std::uint64_t>(kMaxCount))
      refuse("\"config.model\" " + dims_string(c.model.dims) + " has 2^53 parameters or more");
  }
  try {
    c.validate(world);
  } catch (const UsageError& e) {
    refuse(std::string("\"config\": ") + e.what());
  }
  // Each field read back must be the one written: "5,07,3" reads as the model 5,7,3, but to_json never
  // spells it so. (A number's spelling, 1 for 1.0, compares equal.)
  const nlohmann::json written = c.to_json(world);
  for (const auto& [key, value] : written.items())
    if (doc.at(key) != value)
      refuse(in_quotes("config." + key) + " is " + shown_json(doc.at(key)) + ", which dpcheck writes as " +
             shown_json(value));
  return {c, world};
}

Manifest parse_manifest(std::string_view text) {
  const nlohmann::json doc = parse_json(text);
  Fields f(doc, "");
  Manifest m;
  const nlohmann::json& format = f.at("format");
  if (format != kFormat) refuse("\"format\" is " + shown_json(format) + ", not \"" + kFormat + "\"");
  if (const std::int64_t version = f.integer("version", 0, kMaxCount); version != kVersion)
    refuse("\"version\" is " + std::to_string(version) + ": this dpcheck reads version " + std::to_string(kVersion));
  m.step = f.integer("step", 0, kMaxCount);
  m.epoch = f.integer("epoch", 0, kMaxCount);
  m.step_in_epoch = f.integer("step_in_epoch", 0, kMaxCount);
  Fields optimizer(f.at("optimizer"), "optimizer");
  m.optimizer_steps = optimizer.integer("steps", 0, kMaxCount);

  const auto [config, world] = recorded_config(f.at("config"));
  m.config = f.at("config");
  m.model = config.model;
  m.steps_per_epoch = config.steps_per_epoch(world);
  const std::string per_epoch =
      " (the recorded configuration has " + std::to_string(m.steps_per_epoch) + " steps an epoch)";
  if (m.step_in_epoch >= m.steps_per_epoch)
    refuse("\"step_in_epoch\" is " + std::to_string(m.step_in_epoch) + ", beyond the end of an epoch" + per_epoch);
  if (m.epoch != m.step / m.steps_per_epoch || m.step_in_epoch != m.step % m.steps_per_epoch)
    refuse("\"epoch\" " + std::to_string(m.epoch) + " and \"step_in_epoch\" " + std::to_string(m.step_in_epoch) +
           " do not agree with \"step\" " + std::to_string(m.step) + ", which is step " +
           std::to_string(m.step % m.steps_per_epoch) + " of epoch " + std::to_string(m.step / m.steps_per_epoch) +
           per_epoch);

  if (config.loss_scaling.enabled() != f.has("loss_scaler"))
    refuse(config.loss_scaling.enabled() ? "\"loss_scaler\" is missing, and the configuration scales its loss"
                                         : "\"loss_scaler\" is there, and the configuration does not scale its loss");
  std::int64_t skipped = 0;
  if (f.has("loss_scaler")) {
    Fields s(f.at("loss_scaler"), "loss_scaler");
    LossScalerState st;
    const double scale = s.number("scale");
    int e = 0;
    if (!(scale >= 0x1p-24 && scale <= 0x1p64) || std::frexp(scale, &e) != 0.5)
      refuse("\"loss_scaler.scale\" is " + shown_json(s.at("scale")) + ", not a power of two from 2^-24 to 2^64");
    st.scale = static_cast<float>(scale);  // exact: checked first, so no double beyond float's range is cast
    st.growth_tracker = s.integer("growth_tracker", 0, config.loss_scaling.growth_interval);
    st.skipped = s.integer("skipped", 0, m.step + 1);
    s.done();
    skipped = st.skipped;
    m.loss_scaler = st;
  }
  if (m.optimizer_steps + skipped != m.step)
    refuse("\"optimizer.steps\" is " + std::to_string(m.optimizer_steps) + " after " + std::to_string(m.step) +
           " steps" + (skipped ? " of which " + std::to_string(skipped) + " were skipped" : std::string()) +
           ": every step that is not skipped takes one optimizer step");
  const nlohmann::json& state = optimizer.at("state");
  const std::vector<std::string> want = make_cpu_optimizer(config.optimizer, 0)->state_names();
  if (state != nlohmann::json(want))
    refuse("\"optimizer.state\" is " + shown_json(state) + ", but " +
           std::string(optimizer_name(config.optimizer.kind)) + " keeps " + nlohmann::json(want).dump());
  m.state_names = want;
  optimizer.done();

  // The file list: exactly the recorded model's tensors and the optimizer's state blocks.
  const nlohmann::json& listed = f.at("files");
  Fields files(listed, "files");
  // Counted before the layout is built, so that a manifest claiming a million layers costs no more
  // than its own text.
  const std::string tensors =
      "model " + dims_string(m.model.dims) + " with " + std::string(optimizer_name(config.optimizer.kind));
  const std::size_t count = 2 * (m.model.dims.size() - 1) + m.state_names.size();
  if (listed.size() < count)
    refuse("\"files\" lists " + std::to_string(listed.size()) + " files, but " + tensors + " keeps " +
           std::to_string(count) + " tensors");
  const ParamLayout layout(m.model);
  std::vector<std::string> names;
  for (const Slice& s : layout.slices()) names.push_back(s.name + ".npy");
  for (const std::string& s : m.state_names) names.push_back("optimizer." + s + ".npy");
  for (const std::string& name : names) {
    Fields entry(files.at(name), "files[" + name + "]");
    Manifest::File file{name, static_cast<std::uint64_t>(entry.integer("bytes", 0, kMaxCount)), 0};
    const std::string hash = entry.text("xxh3");
    const bool hex = hash.size() == 16 && hash.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex)
      refuse(in_quotes(entry.name("xxh3")) + " is " + in_quotes(hash) + ", not 16 lower-case hexadecimal digits");
    file.xxh3 = std::stoull(hash, nullptr, 16);
    entry.done();
    m.files.push_back(std::move(file));
  }
  for (const auto& [key, value] : listed.items())
    if (std::find(names.begin(), names.end(), key) == names.end())
      refuse("\"files\" lists " + shown_json(key) + ", which is no tensor of " + tensors);
  f.done();
  return m;
}

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

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
        nlohmann::json manifest{{"format", kFormat},
                                {"version", kVersion},
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
        write_file_atomic(tmp / kManifest, text);

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

namespace {

// Opens `name` in the directory `dir` for reading, refusing anything but a regular file: no symbolic
// link is followed (O_NOFOLLOW), and a FIFO or device is refused by lstat before it is opened, and by
// fstat after (O_NONBLOCK, in case one took the file's place in between, so that the open cannot block).
FileDescriptor open_regular(int dir, const std::string& name, struct stat& st) {
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    refuse(name + (err == ENOENT ? std::string(" is missing") : ": " + std::string(std::strerror(err))));
  }
  if (!S_ISREG(st.st_mode)) refuse(name + " is " + file_kind(st.st_mode) + ", not a regular file");
  FileDescriptor fd(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) refuse(name + ": cannot open: " + std::strerror(errno));
  if (::fstat(fd.get(), &st) != 0) refuse(name + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(name + " is " + file_kind(st.st_mode) + ", not a regular file");
  return fd;
}

// The whole of an open regular file of st.st_size bytes.
std::string read_all(int fd, const std::string& name, const struct stat& st) {
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) refuse(name + ": read failed: " + std::strerror(errno));
    if (r == 0) refuse(name + " shrank while it was read");
    done += static_cast<std::size_t>(r);
  }
  return bytes;
}

std::string float_value(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// One tensor file: the manifest's size and hash, then float32 of `shape`, every value finite (and, for
// Adam's exp_avg_sq, a mean of squares, never negative). Returns the values.
// `offset` places the file's first element in the parameter buffer, to name a bad element by the
// parameter it belongs to (state blocks cover the whole buffer, from 0).
std::vector<float> read_tensor(int dir, const Manifest::File& file, std::span<const std::int64_t> shape,
                               const ParamLayout& layout, std::size_t offset, bool squares) {
  const std::string& name = file.name;
  struct stat st {};
  const FileDescriptor fd = open_regular(dir, name, st);
  if (static_cast<std::uint64_t>(st.st_size) != file.bytes)
    refuse(name + " has " + std::to_string(st.st_size) + " bytes, the manifest says " + std::to_string(file.bytes));
  const std::string bytes = read_all(fd.get(), name, st);
  if (hash_bytes(bytes.data(), bytes.size()) != file.xxh3) refuse(name + ": hash does not match the manifest");
  // The bytes hashed are the bytes parsed: the .npy reader opens this same open file through /proc,
  // not the name again, which could lead elsewhere by now.
  const std::string via = "/proc/self/fd/" + std::to_string(fd.get());
  NpyArray a;
  try {
    a = read_npy(via);
  } catch (const UsageError& e) {
    std::string what = e.what();
    if (what.rfind(via, 0) == 0) what = what.substr(via.size());
    refuse(name + what);
  }
  if (a.dtype != DType::f32) refuse(name + " holds " + std::string(dtype_name(a.dtype)) + ", not float32");
  if (!std::equal(a.shape.begin(), a.shape.end(), shape.begin(), shape.end())) {
    NpyArray want;
    want.shape.assign(shape.begin(), shape.end());
    refuse(name + " has shape " + a.shape_string() + ", the model needs " + want.shape_string());
  }
  std::vector<float> v = a.as_float32();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]))
      refuse(name + " holds " + float_value(v[i]) + " at " + layout.describe_element(offset + i) +
             ", not a finite number");
    if (squares && v[i] < 0)
      refuse(name + " holds " + float_value(v[i]) + " at " + layout.describe_element(offset + i) +
             ": a running mean of squares is never negative");
  }
  return v;
}

}  // namespace

std::optional<Checkpoint> read_checkpoint(const fs::path& step_dir, const ModelConfig& model, std::string* why) {
  const std::string dir_name = step_dir.filename().string();
  try {
    struct stat st {};
    if (::lstat(step_dir.c_str(), &st) != 0) refuse(std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) refuse(file_kind(st.st_mode) + ", not a directory");
    const FileDescriptor dir(::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir.get() < 0) refuse(std::string("cannot open: ") + std::strerror(errno));

    Manifest m;
    {
      const FileDescriptor fd = open_regular(dir.get(), kManifest, st);
      if (static_cast<std::uint64_t>(st.st_size) > kMaxManifestBytes)
        refuse(std::string(kManifest) + " has " + std::to_string(st.st_size) + " bytes, more than a manifest can need");
      try {
        m = parse_manifest(read_all(fd.get(), kManifest, st));
      } catch (const UsageError& e) {
        refuse(std::string(kManifest) + ": " + e.what());
      }
    }
    if (step_of(dir_name) != m.step)
      refuse(std::string(kManifest) + " records step " + std::to_string(m.step) +
             ", not the step the directory is named for");
    if (m.model.dims != model.dims)
      refuse("written for model " + dims_string(m.model.dims) + ", this run has " + dims_string(model.dims));

    // Every entry must be the manifest or a file it lists: nothing in a checkpoint is silently ignored.
    {
      std::set<std::string> known{kManifest};
      for (const Manifest::File& f : m.files) known.insert(f.name);
      const int copy = ::dup(dir.get());
      DIR* d = copy < 0 ? nullptr : ::fdopendir(copy);
      if (d == nullptr) {
        if (copy >= 0) ::close(copy);
        refuse(std::string("cannot list: ") + std::strerror(errno));
      }
      std::string extra;
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != ".." && known.count(n) == 0 && extra.empty()) extra = n;
      }
      ::closedir(d);
      if (!extra.empty()) refuse(extra + " is not listed in the manifest");
    }

    const ParamLayout layout(model);
    Checkpoint c;
    c.step = m.step;
    c.epoch = m.epoch;
    c.step_in_epoch = m.step_in_epoch;
    c.optimizer_steps = m.optimizer_steps;
    c.loss_scaler = m.loss_scaler;
    c.state_names = m.state_names;
    c.config = m.config;
    c.params.resize(layout.size());
    std::size_t k = 0;
    for (const Slice& s : layout.slices()) {
      const std::vector<float> v = read_tensor(dir.get(), m.files[k++], s.shape, layout, s.offset, false);
      std::copy(v.begin(), v.end(), c.params.begin() + static_cast<std::ptrdiff_t>(s.offset));
    }
    const std::vector<std::int64_t> flat{static_cast<std::int64_t>(layout.size())};
    for (const std::string& name : m.state_names) {
      const std::vector<float> v = read_tensor(dir.get(), m.files[k++], flat, layout, 0, name == "exp_avg_sq");
      c.optimizer_state.insert(c.optimizer_state.end(), v.begin(), v.end());
    }
    return c;
  } catch (const UsageError& e) {
    if (why) *why = dir_name + ": " + e.what();
    return std::nullopt;
  }
}

std::vector<std::pair<std::int64_t, fs::path>> checkpoint_steps(const fs::path& dir) { return checkpoints_in(dir); }

Checkpoint load_checkpoint(const fs::path& dir, const ModelConfig& model, std::vector<std::string>* skipped,
                           std::int64_t at_most_step) {
  if (!fs::is_directory(dir)) throw UsageError(dir.string() + ": no such checkpoint directory");
  const auto candidates = checkpoints_in(dir);
  if (candidates.empty())
    throw UsageError("no usable checkpoint in " + dir.string() + ": it holds no step-NNNNNNNN directory");
  std::string reasons;
  for (const auto& [step, path] : candidates) {
    if (step > at_most_step) continue;
    std::string why;
    if (std::optional<Checkpoint> c = read_checkpoint(path, model, &why)) return *std::move(c);
    reasons += (reasons.empty() ? "" : "; ") + why;
    if (skipped) skipped->push_back(std::move(why));
  }
  if (reasons.empty())
    throw UsageError("no usable checkpoint in " + dir.string() + ": none is of step " + std::to_string(at_most_step) +
                     " or before");
  throw UsageError("no usable checkpoint in " + dir.string() + ": " + reasons);
}

}  // namespace dpcheck
