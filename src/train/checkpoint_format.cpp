// The checkpoint format read back (writer.hpp says what a checkpoint holds and what the reader checks):
// a manifest parsed, a checkpoint read and checked, the newest usable one found. Every refusal of a
// checkpoint is a UsageError whose text is the reason (checkpoint_files::refuse).
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
using checkpoint_files::checkpoints_in;
using checkpoint_files::kFormat;
using checkpoint_files::kManifest;
using checkpoint_files::kVersion;
using checkpoint_files::refuse;

namespace {

// Counts (steps, epochs, bytes, examples) must be exact in a double as well as an int64, so that no
// JSON reader rounds them and no arithmetic on them overflows.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;
constexpr std::int64_t kMaxInt = std::int64_t{std::numeric_limits<int>::max()} + 1;
constexpr std::size_t kMaxManifestBytes = std::size_t{16} << 20;

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

}  // namespace

namespace checkpoint_files {

[[noreturn]] void refuse(const std::string& reason) { throw UsageError(reason); }

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

}  // namespace checkpoint_files

namespace {

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
