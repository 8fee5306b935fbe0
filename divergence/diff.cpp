// dpcheck diff (divergence/diff.hpp): traces walked to their first differing digest, and .npy directories
// compared element by element. Traces are read a line at a time and every line is checked whole (its
// ranks, tensors and collectives against the header), so that a damaged trace is refused naming its
// line rather than compared as if it were a shorter or different run.
#include "divergence/diff.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <system_error>
#include <type_traits>
#include <utility>

#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/json_limits.hpp"
#include "src/io/npy.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A header line is a few hundred bytes; a first line longer than this is not one.
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;
// How many of a step's other differences, and of the later differing steps, the report lists.
constexpr std::size_t kListed = 10;

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A JSON value as a message shows it: whole when short.
std::string shown(const json& v) {
  constexpr std::size_t kMax = 60;
  std::string s = v.dump();
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

bool is_digest(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

// ---- what a path holds ----------------------------------------------------------------------------

std::string_view diff_input_name(DiffInput kind) {
  return kind == DiffInput::trace ? "a trace" : "a directory of .npy tensors";
}

DiffInput diff_input_kind(const fs::path& path, std::string_view label) {
  const std::string who = std::string(label) + " " + path.string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) throw UsageError(who + ": no such file or directory");
    throw UsageError(who + ": " + std::generic_category().message(err));
  }
  if (S_ISDIR(st.st_mode)) return DiffInput::npy_dir;
  if (!S_ISREG(st.st_mode))
    throw UsageError(who + " is " + file_kind(st.st_mode) + ", neither a trace file nor a directory of .npy tensors");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(who + ": cannot open: " + std::generic_category().message(errno));
  std::string first(kMaxHeaderBytes, '\0');
  in.read(first.data(), static_cast<std::streamsize>(first.size()));
  first.resize(static_cast<std::size_t>(in.gcount()));
  if (const std::size_t nl = first.find('\n'); nl != std::string::npos) first.resize(nl);
  if (first.starts_with("\x93NUMPY"))
    throw UsageError(who + " is a single .npy file; diff compares directories of them: give the directory that holds it");
  check_json_depth(first, who + ":1");
  const json header = json::parse(first, nullptr, /*allow_exceptions=*/false);
  if (header.is_object() && header.contains("dpcheck_trace")) return DiffInput::trace;
  throw UsageError(who + " is neither a trace (its first line is not a JSON object with a \"dpcheck_trace\" key) nor a "
                         "directory of .npy tensors");
}

// ---- reading traces -------------------------------------------------------------------------------

std::string TraceTensor::describe() const {
  return "digest " + digest + "  max_abs " + number_text(max_abs) + "  sum " + number_text(sum) + "  non_finite " +
         std::to_string(non_finite);
}

std::string_view phase_name(TracePhase phase) {
  switch (phase) {
    case TracePhase::data: return "data";
    case TracePhase::local_gradient: return "local gradient";
    case TracePhase::all_reduce: return "all-reduce";
    case TracePhase::optimizer: return "optimizer";
    case TracePhase::loss: return "loss";
  }
  return "?";
}

std::string TraceMismatch::where() const {
  std::string s = "step " + std::to_string(step) + ", " + std::string(phase_name(phase));
  if (rank >= 0) s += ", rank " + std::to_string(rank);
  return s + ", " + item;
}

namespace {

struct TraceHeader {
  json raw;
  int world_size = 0;
  std::string digest;
  std::vector<std::string> tensors, state;
};

struct TraceRank {
  std::int64_t index_count = 0;
  std::string index_digest;
  std::vector<TraceTensor> local_grad, reduced_grad, params;
  std::vector<std::vector<TraceTensor>> state;  // one list a state block
};

struct TraceCollective {
  std::int64_t seq = 0;
  std::string call, op, dtype;  // op empty where the call has none
  std::int64_t count = 0;
  std::vector<std::pair<std::string, std::string>> ranks;  // in, out

  std::string describe() const {
    return "seq " + std::to_string(seq) + " " + call + (op.empty() ? "" : " " + op) + " " + dtype + " count " +
           std::to_string(count);
  }
};

struct TraceStep {
  std::int64_t step = 0;
  std::optional<double> loss;  // null in the trace when it was not finite
  std::vector<TraceRank> ranks;
  std::vector<TraceCollective> collectives;
};

// One trace, a line at a time; every refusal names the file and the line.
class TraceReader {
 public:
  explicit TraceReader(const fs::path& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw UsageError(path.string() + ": cannot open: " + std::generic_category().message(errno));
    std::string line;
    if (!read_line(line)) fail("empty file: no trace header");
    read_header(parse(line));
  }

  const TraceHeader& header() const { return header_; }
  std::int64_t steps() const { return steps_; }

  std::optional<TraceStep> next() {
    std::string line;
    if (!read_line(line)) return std::nullopt;
    TraceStep s = read_step(parse(line));
    if (steps_ > 0 && s.step <= last_step_)
      fail("step " + std::to_string(s.step) + " follows step " + std::to_string(last_step_) +
           ": a trace's steps must increase");
    last_step_ = s.step;
    ++steps_;
    return s;
  }

 private:
  bool read_line(std::string& line) {
    bool too_long = false;
    if (!read_bounded_line(in_, line, too_long)) {
      if (in_.bad()) throw Error(path_.string() + ": read failed");
      return false;
    }
    ++line_;
    if (too_long) fail(line_length_reason());
    return true;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError(path_.string() + ":" + std::to_string(line_) + ": " + what);
  }

  json parse(const std::string& line) const {
    if (line.empty()) fail("empty line");
    if (json_too_deep(line)) fail(json_depth_reason());
    try {
      return json::parse(line);
    } catch (const json::exception& e) {  // a syntax error, or a number beyond a double (1e400)
      std::string what = e.what();
      // "[json.exception.parse_error.101] parse error at ..." -> "parse error at ..."
      if (const std::size_t at = what.find("] "); what.starts_with("[json.") && at != std::string::npos) what.erase(0, at + 2);
      fail("not JSON: " + what);
    }
  }

  const json& get(const json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object()) fail(where + " is " + shown(obj) + ", not a JSON object");
    const auto it = obj.find(key);
    if (it == obj.end()) fail(where + " has no \"" + key + "\"");
    return *it;
  }

  std::int64_t integer(const json& v, const std::string& where, std::int64_t min) const {
    const bool fits = v.is_number_integer() &&
                      (!v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX));
    if (!fits) fail(where + " is " + shown(v) + ", not a whole number");
    const auto x = v.get<std::int64_t>();
    if (x < min) fail(where + " is " + std::to_string(x) + ", less than " + std::to_string(min));
    return x;
  }

  double number(const json& v, const std::string& where) const {
    if (!v.is_number()) fail(where + " is " + shown(v) + ", not a number");
    return v.get<double>();
  }

  std::string text(const json& v, const std::string& where) const {
    if (!v.is_string()) fail(where + " is " + shown(v) + ", not a string");
    return v.get<std::string>();
  }

  std::string digest(const json& v, const std::string& where) const {
    std::string s = text(v, where);
    if (!is_digest(s)) fail(where + " is " + shown(v) + ", not 16 lower-case hex digits");
    return s;
  }

  const json& array(const json& v, const std::string& where, std::size_t size) const {
    if (!v.is_array()) fail(where + " is " + shown(v) + ", not an array");
    if (v.size() != size)
      fail(where + " holds " + std::to_string(v.size()) + " entries where the header says " + std::to_string(size));
    return v;
  }

  std::vector<std::string> names(const json& v, const std::string& where) const {
    if (!v.is_array()) fail(where + " is " + shown(v) + ", not an array");
    std::vector<std::string> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(text(v[i], where + "[" + std::to_string(i) + "]"));
    return out;
  }

  void read_header(const json& h) {
    const std::string where = "the header";
    const json& version = get(h, "dpcheck_trace", where);
    if (!version.is_number_integer()) fail("\"dpcheck_trace\" is " + shown(version) + ", not a format version number");
    if (version.get<std::int64_t>() != trace_format_version)
      fail("trace format version " + shown(version) + " is not one this dpcheck reads (version " +
           std::to_string(trace_format_version) + ")");
    header_.raw = h;
    for (const char* key : {"config", "target"})
      if (!get(h, key, where).is_object()) fail("\"" + std::string(key) + "\" in the header is not a JSON object");
    const std::int64_t world = integer(get(h, "world_size", where), "\"world_size\"", 1);
    if (world > std::numeric_limits<int>::max()) fail("\"world_size\" " + std::to_string(world) + " is beyond any world");
    header_.world_size = static_cast<int>(world);
    header_.digest = text(get(h, "digest", where), "\"digest\"");
    header_.tensors = names(get(h, "tensors", where), "\"tensors\"");
    header_.state = names(get(h, "state", where), "\"state\"");
  }

  // Empty when the step stopped before the phase (a live check failed): "not reached".
  std::vector<TraceTensor> tensors(const json& v, const std::string& where) const {
    array(v, where, v.is_array() && v.empty() ? 0 : header_.tensors.size());
    std::vector<TraceTensor> out(v.size());
    for (std::size_t t = 0; t < v.size(); ++t) {
      const std::string w = where + "[" + std::to_string(t) + "]";
      out[t].digest = digest(get(v[t], "digest", w), w + ".digest");
      out[t].max_abs = number(get(v[t], "max_abs", w), w + ".max_abs");
      out[t].sum = number(get(v[t], "sum", w), w + ".sum");
      out[t].non_finite = integer(get(v[t], "non_finite", w), w + ".non_finite", 0);
    }
    return out;
  }

  TraceStep read_step(const json& j) const {
    const std::string line = "the line";
    if (!j.is_object()) fail("is " + shown(j) + ", not a JSON object");
    if (j.contains("dpcheck_trace")) fail("a second trace header (traces are not concatenated)");
    TraceStep s;
    s.step = integer(get(j, "step", line), "\"step\"", 0);
    const json& loss = get(j, "loss", line);
    if (!loss.is_null()) s.loss = number(loss, "\"loss\"");
    const auto world = static_cast<std::size_t>(header_.world_size);
    const json& ranks = array(get(j, "ranks", line), "\"ranks\"", world);
    for (std::size_t r = 0; r < world; ++r) {
      const std::string w = "ranks[" + std::to_string(r) + "]";
      const json& rj = ranks[r];
      if (integer(get(rj, "rank", w), w + ".rank", 0) != static_cast<std::int64_t>(r))
        fail(w + ".rank is " + shown(rj["rank"]) + ": ranks must be listed in rank order");
      TraceRank tr;
      const json& idx = get(rj, "indices", w);
      tr.index_count = integer(get(idx, "count", w + ".indices"), w + ".indices.count", 0);
      tr.index_digest = digest(get(idx, "digest", w + ".indices"), w + ".indices.digest");
      tr.local_grad = tensors(get(rj, "local_grad", w), w + ".local_grad");
      tr.reduced_grad = tensors(get(rj, "reduced_grad", w), w + ".reduced_grad");
      tr.params = tensors(get(rj, "params", w), w + ".params");
      const json& state_list = get(rj, "state", w);
      const json& state = array(state_list, w + ".state", state_list.is_array() && state_list.empty() ? 0 : header_.state.size());
      for (std::size_t k = 0; k < state.size(); ++k)
        tr.state.push_back(tensors(state[k], w + ".state[" + std::to_string(k) + "]"));
      s.ranks.push_back(std::move(tr));
    }
    const json& collectives = get(j, "collectives", line);
    if (!collectives.is_array()) fail("\"collectives\" is " + shown(collectives) + ", not an array");
    for (std::size_t c = 0; c < collectives.size(); ++c) {
      const std::string w = "collectives[" + std::to_string(c) + "]";
      const json& cj = collectives[c];
      TraceCollective tc;
      tc.seq = integer(get(cj, "seq", w), w + ".seq", 0);
      tc.call = text(get(cj, "call", w), w + ".call");
      if (cj.contains("op")) tc.op = text(cj["op"], w + ".op");
      tc.dtype = text(get(cj, "dtype", w), w + ".dtype");
      tc.count = integer(get(cj, "count", w), w + ".count", 0);
      const json& cr = array(get(cj, "ranks", w), w + ".ranks", world);
      for (std::size_t r = 0; r < world; ++r) {
        const std::string wr = w + ".ranks[" + std::to_string(r) + "]";
        tc.ranks.emplace_back(digest(get(cr[r], "in", wr), wr + ".in"), digest(get(cr[r], "out", wr), wr + ".out"));
      }
      s.collectives.push_back(std::move(tc));
    }
    return s;
  }

  fs::path path_;
  std::ifstream in_;
  std::int64_t line_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t last_step_ = -1;
  TraceHeader header_;
};

// ---- comparing traces -----------------------------------------------------------------------------

// What both headers name alike, and how a step of one pairs with a step of the other.
struct Pairing {
  const std::vector<std::string>& tensors;
  bool per_rank = true;                                     // same world size: every rank pairs
  std::vector<std::pair<std::size_t, std::size_t>> state;   // state blocks both hold: A's index, B's
  const std::vector<std::string>& state_names;              // A's
};

class StepWalk {
 public:
  StepWalk(const Pairing& p, std::int64_t step, std::vector<TraceMismatch>& out) : p_(p), step_(step), out_(out) {}

  std::int64_t compare(const TraceStep& a, const TraceStep& b) {
    const std::size_t ranks = p_.per_rank ? a.ranks.size() : 1;
    if (p_.per_rank) {
      for (std::size_t r = 0; r < ranks; ++r) {
        const TraceRank &ra = a.ranks[r], &rb = b.ranks[r];
        item(TracePhase::data, static_cast<int>(r), "indices",
             ra.index_digest == rb.index_digest && ra.index_count == rb.index_count,
             "count " + std::to_string(ra.index_count) + "  digest " + ra.index_digest,
             "count " + std::to_string(rb.index_count) + "  digest " + rb.index_digest);
      }
      for (std::size_t r = 0; r < ranks; ++r)
        tensors(TracePhase::local_gradient, r, "local_grad", a.ranks[r].local_grad, b.ranks[r].local_grad);
      collectives(a, b);
    }
    for (std::size_t r = 0; r < ranks; ++r)
      tensors(TracePhase::all_reduce, r, "reduced_grad", a.ranks[r].reduced_grad, b.ranks[r].reduced_grad);
    for (std::size_t r = 0; r < ranks; ++r) {
      tensors(TracePhase::optimizer, r, "params", a.ranks[r].params, b.ranks[r].params);
      static const std::vector<TraceTensor> not_reached;
      for (const auto& [ka, kb] : p_.state)
        tensors(TracePhase::optimizer, r, "state " + p_.state_names[ka],
                ka < a.ranks[r].state.size() ? a.ranks[r].state[ka] : not_reached,
                kb < b.ranks[r].state.size() ? b.ranks[r].state[kb] : not_reached);
    }
    const auto loss_text = [](const std::optional<double>& l) { return l ? number_text(*l) : std::string("null (not finite)"); };
    item(TracePhase::loss, -1, "loss", a.loss == b.loss, loss_text(a.loss), loss_text(b.loss));
    return compared_;
  }

 private:
  void item(TracePhase phase, int rank, std::string name, bool same, std::string a, std::string b,
            const TraceTensor* ta = nullptr, const TraceTensor* tb = nullptr) {
    ++compared_;
    if (same) return;
    TraceMismatch m;
    m.step = step_;
    m.phase = phase;
    m.rank = rank;
    m.item = std::move(name);
    m.a = std::move(a);
    m.b = std::move(b);
    if (ta) m.tensor_a = *ta;
    if (tb) m.tensor_b = *tb;
    out_.push_back(std::move(m));
  }

  void tensors(TracePhase phase, std::size_t rank, const std::string& what, const std::vector<TraceTensor>& a,
               const std::vector<TraceTensor>& b) {
    // A phase one run never reached (a live check stopped its step) is one difference, not one a tensor.
    if (a.empty() || b.empty()) {
      const auto text = [](const std::vector<TraceTensor>& v) {
        return v.empty() ? std::string("not reached (the step stopped before it)") : v.front().describe();
      };
      item(phase, static_cast<int>(rank), what, a.empty() && b.empty(), text(a), text(b));
      return;
    }
    for (std::size_t t = 0; t < p_.tensors.size(); ++t)
      item(phase, static_cast<int>(rank), what + " " + p_.tensors[t], a[t].digest == b[t].digest, a[t].describe(),
           b[t].describe(), &a[t], &b[t]);
  }

  // In call order; for each call its own fields, then every rank's input and output. A call whose
  // fields differ is one difference: its buffers hold different things, so their digests say no more.
  void collectives(const TraceStep& a, const TraceStep& b) {
    const std::size_t both = std::min(a.collectives.size(), b.collectives.size());
    for (std::size_t c = 0; c < both; ++c) {
      const TraceCollective &ca = a.collectives[c], &cb = b.collectives[c];
      const std::string da = ca.describe(), db = cb.describe();
      if (da != db) {
        item(TracePhase::all_reduce, -1, "collective " + std::to_string(c) + " of the step", false, da, db);
        continue;
      }
      for (std::size_t r = 0; r < ca.ranks.size(); ++r) {
        item(TracePhase::all_reduce, static_cast<int>(r), "collective " + da + " in", ca.ranks[r].first == cb.ranks[r].first,
             ca.ranks[r].first, cb.ranks[r].first);
        item(TracePhase::all_reduce, static_cast<int>(r), "collective " + da + " out",
             ca.ranks[r].second == cb.ranks[r].second, ca.ranks[r].second, cb.ranks[r].second);
      }
    }
    const auto count_text = [](std::size_t n) { return std::to_string(n) + (n == 1 ? " collective" : " collectives"); };
    item(TracePhase::all_reduce, -1, "number of collectives", a.collectives.size() == b.collectives.size(),
         count_text(a.collectives.size()), count_text(b.collectives.size()));
  }

  const Pairing& p_;
  std::int64_t step_;
  std::vector<TraceMismatch>& out_;
  std::int64_t compared_ = 0;
};

// "key a vs b" for every key of the two objects whose values differ (an absent key shows as absent).
void object_differences(const json& a, const json& b, const std::string& prefix, std::vector<std::string>& out) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.push_back(k);
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) keys.push_back(k);
  for (const std::string& k : keys) {
    const bool in_a = a.contains(k), in_b = b.contains(k);
    if (in_a && in_b && a[k] == b[k]) continue;
    out.push_back(prefix + k + " " + (in_a ? shown(a[k]) : "(absent)") + " vs " + (in_b ? shown(b[k]) : "(absent)"));
  }
}

std::string list_text(const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}

}  // namespace

TraceDiff diff_traces(const fs::path& a, const fs::path& b) {
  TraceReader ra(a), rb(b);
  const TraceHeader &ha = ra.header(), &hb = rb.header();
  if (ha.digest != hb.digest)
    throw UsageError(a.string() + " holds \"" + ha.digest + "\" digests and " + b.string() + " \"" + hb.digest +
                     "\" digests: they cannot be compared");
  TraceDiff d;
  d.path_a = a;
  d.path_b = b;
  d.world_size_a = ha.world_size;
  d.world_size_b = hb.world_size;

  object_differences(ha.raw["config"], hb.raw["config"], "", d.config_differences);
  object_differences(ha.raw["target"], hb.raw["target"], "target.", d.config_differences);
  const bool listed = std::any_of(d.config_differences.begin(), d.config_differences.end(),
                                  [](const std::string& s) { return s.starts_with("world_size "); });
  if (ha.world_size != hb.world_size && !listed)
    d.config_differences.push_back("world_size " + std::to_string(ha.world_size) + " vs " + std::to_string(hb.world_size));
  const auto version = [](const json& h) {
    json o = json::object();
    if (h.contains("dpcheck_version")) o["dpcheck_version"] = h["dpcheck_version"];
    return o;
  };
  object_differences(version(ha.raw), version(hb.raw), "", d.config_differences);

  Pairing pairing{ha.tensors, ha.world_size == hb.world_size, {}, ha.state};
  if (ha.tensors != hb.tensors) {
    d.comparable = false;
    d.notes.push_back("the traces hold different tensors (A " + list_text(ha.tensors) + ", B " + list_text(hb.tensors) +
                      "): the runs trained different models, and no step was compared");
  }
  if (!pairing.per_rank)
    d.notes.push_back("the world sizes differ (" + std::to_string(ha.world_size) + " and " + std::to_string(hb.world_size) +
                      "), so ranks cannot be paired: only the replicated state is compared (rank 0's reduced_grad, "
                      "params and state, and the loss)");
  std::vector<std::string> unpaired;
  for (std::size_t ka = 0; ka < ha.state.size(); ++ka) {
    const auto it = std::find(hb.state.begin(), hb.state.end(), ha.state[ka]);
    if (it == hb.state.end()) unpaired.push_back(ha.state[ka] + " (A)");
    else pairing.state.emplace_back(ka, static_cast<std::size_t>(it - hb.state.begin()));
  }
  for (const std::string& name : hb.state)
    if (std::find(ha.state.begin(), ha.state.end(), name) == ha.state.end()) unpaired.push_back(name + " (B)");
  if (!unpaired.empty() && d.comparable) {
    std::string names;
    for (const std::string& n : unpaired) names += (names.empty() ? "" : ", ") + n;
    d.notes.push_back("optimizer state held by one trace only, not compared: " + names);
  }

  // The steps pair by number: a trace that starts later (a resumed run) or ends sooner still meets the
  // other where both have the same step.
  std::optional<TraceStep> sa = ra.next(), sb = rb.next();
  while (sa || sb) {
    if (sa && (!sb || sa->step < sb->step)) {
      if (d.only_in_a++ == 0) d.first_only_in_a = sa->step;
      sa = ra.next();
      continue;
    }
    if (sb && (!sa || sb->step < sa->step)) {
      if (d.only_in_b++ == 0) d.first_only_in_b = sb->step;
      sb = rb.next();
      continue;
    }
    ++d.steps_compared;
    if (d.comparable) {
      std::vector<TraceMismatch> found;
      const std::int64_t compared = StepWalk(pairing, sa->step, found).compare(*sa, *sb);
      d.items_compared += compared;
      if (!found.empty()) {
        d.differing_steps.push_back({sa->step, static_cast<std::int64_t>(found.size()), compared});
        if (d.first_step.empty()) d.first_step = std::move(found);
      }
    }
    sa = ra.next();
    sb = rb.next();
  }
  d.steps_a = ra.steps();
  d.steps_b = rb.steps();
  return d;
}

namespace {

std::string steps_text(std::int64_t n) { return std::to_string(n) + (n == 1 ? " step" : " steps"); }

}  // namespace

void print_trace_diff(std::ostream& out, const TraceDiff& d) {
  const auto configuration = [&] {
    for (const std::string& c : d.config_differences) out << "configuration differs: " << c << "\n";
  };
  if (d.identical()) {
    configuration();
    out << "identical: " << steps_text(d.steps_compared) << " matched (" << d.items_compared
        << " items compared; world size " << d.world_size_a << ")\n";
    return;
  }
  out << "A: " << d.path_a.string() << " (" << steps_text(d.steps_a) << ", world size " << d.world_size_a << ")\n";
  out << "B: " << d.path_b.string() << " (" << steps_text(d.steps_b) << ", world size " << d.world_size_b << ")\n";
  if (d.config_differences.empty()) out << "configuration: the same\n";
  configuration();
  for (const std::string& n : d.notes) out << "note: " << n << "\n";
  if (const TraceMismatch* m = d.first()) {
    out << "first difference: " << m->where() << "\n";
    out << "  A: " << m->a << "\n";
    out << "  B: " << m->b << "\n";
    const TraceStepCount& first = d.differing_steps.front();
    std::map<TracePhase, std::int64_t> by_phase;
    for (const TraceMismatch& x : d.first_step) ++by_phase[x.phase];
    out << "step " << first.step << ": " << first.differing << " of " << first.compared << " items differ (";
    bool comma = false;
    for (const auto& [phase, n] : by_phase) {
      out << (comma ? ", " : "") << phase_name(phase) << " " << n;
      comma = true;
    }
    out << ")";
    const std::size_t others = d.first_step.size() - 1;
    if (others > 0) {
      out << "; after the first:\n";
      for (std::size_t i = 1; i <= std::min(others, kListed); ++i) {
        const TraceMismatch& x = d.first_step[i];
        out << "  " << phase_name(x.phase) << (x.rank >= 0 ? ", rank " + std::to_string(x.rank) : "") << ", " << x.item << "\n";
      }
      if (others > kListed) out << "  ... and " << others - kListed << " more\n";
    } else {
      out << "\n";
    }
    const std::size_t later = d.differing_steps.size() - 1;
    if (later > 0) {
      out << "later: " << later << (later == 1 ? " more step differs (" : " more steps differ (");
      for (std::size_t i = 1; i <= std::min(later, kListed); ++i) out << (i > 1 ? ", " : "") << d.differing_steps[i].step;
      out << (later > kListed ? ", ...)\n" : ")\n");
    } else {
      out << "later: no other step differs\n";
    }
  } else if (d.comparable && d.steps_compared > 0) {
    out << "the " << steps_text(d.steps_compared) << " both traces hold match (" << d.items_compared << " items compared)\n";
  }
  if (d.steps_compared == 0 && (d.steps_a > 0 || d.steps_b > 0)) out << "the traces have no step in common\n";
  if (d.only_in_a > 0 && d.only_in_b == 0)
    out << "B is shorter: A has " << steps_text(d.only_in_a) << " that B lacks, from step " << d.first_only_in_a << "\n";
  else if (d.only_in_b > 0 && d.only_in_a == 0)
    out << "A is shorter: B has " << steps_text(d.only_in_b) << " that A lacks, from step " << d.first_only_in_b << "\n";
  else if (d.only_in_a > 0 && d.only_in_b > 0)
    out << "the traces hold different steps: " << steps_text(d.only_in_a) << " only in A (from step " << d.first_only_in_a
        << "), " << steps_text(d.only_in_b) << " only in B (from step " << d.first_only_in_b << ")\n";
}

namespace {

json summary_json(const std::optional<TraceTensor>& t) {
  if (!t) return nullptr;
  return {{"digest", t->digest}, {"max_abs", t->max_abs}, {"sum", t->sum}, {"non_finite", t->non_finite}};
}

json mismatch_json(const TraceMismatch& m) {
  json j{{"step", m.step}, {"phase", phase_name(m.phase)}, {"rank", m.rank >= 0 ? json(m.rank) : json(nullptr)},
         {"item", m.item}, {"a", m.a}, {"b", m.b}};
  if (m.tensor_a) j["tensor_a"] = summary_json(m.tensor_a);
  if (m.tensor_b) j["tensor_b"] = summary_json(m.tensor_b);
  return j;
}

}  // namespace

json to_json(const TraceDiff& d) {
  json steps = json::array();
  for (const TraceStepCount& s : d.differing_steps)
    steps.push_back({{"step", s.step}, {"differing", s.differing}, {"compared", s.compared}});
  json first_step = json::array();
  for (const TraceMismatch& m : d.first_step) first_step.push_back(mismatch_json(m));
  return {{"kind", "trace"},
          {"a", d.path_a.string()},
          {"b", d.path_b.string()},
          {"identical", d.identical()},
          {"same_configuration", d.config_differences.empty()},
          {"config_differences", d.config_differences},
          {"notes", d.notes},
          {"world_size_a", d.world_size_a},
          {"world_size_b", d.world_size_b},
          {"steps_a", d.steps_a},
          {"steps_b", d.steps_b},
          {"steps_compared", d.steps_compared},
          {"items_compared", d.items_compared},
          {"only_in_a", d.only_in_a},
          {"only_in_b", d.only_in_b},
          {"first_difference", d.first() ? mismatch_json(*d.first()) : json(nullptr)},
          {"first_step_differences", first_step},
          {"differing_steps", steps}};
}

// ---- .npy directories -----------------------------------------------------------------------------

std::string Tolerance::describe() const {
  switch (kind) {
    case Kind::bitwise: return "bitwise";
    case Kind::ulp: return "--ulp " + std::to_string(ulp);
    case Kind::rtol: return "--rtol " + number_text(rtol);
  }
  return "?";
}

std::string TensorDiff::status_text() const {
  switch (status) {
    case Status::compared: return "";
    case Status::only_in_a: return "only in A";
    case Status::only_in_b: return "only in B";
    case Status::dtype_differs:
      return "dtype " + std::string(dtype_name(dtype_a)) + " vs " + std::string(dtype_name(dtype_b));
    case Status::shape_differs: return "shape " + shape_text(shape_a) + " vs " + shape_text(shape_b);
  }
  return "?";
}

bool all_passed(const std::vector<TensorDiff>& diffs) {
  return std::all_of(diffs.begin(), diffs.end(), [](const TensorDiff& t) { return t.passed; });
}

namespace {

// Names in the order a person reads them: runs of digits compare as numbers (layers.2 before layers.10).
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && digit(a[ei])) ++ei;
      while (ej < b.size() && digit(b[ej])) ++ej;
      std::string_view na(a.data() + i, ei - i), nb(b.data() + j, ej - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

struct NaturalLess {
  bool operator()(const std::string& a, const std::string& b) const { return natural_less(a, b); }
};

using NpyFiles = std::map<std::string, fs::path, NaturalLess>;

NpyFiles list_npy(const fs::path& dir, std::string_view label) {
  const std::string who = std::string(label) + " " + dir.string();
  NpyFiles files;
  std::vector<std::string> checkpoints;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw UsageError(who + ": cannot list: " + ec.message());
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.ends_with(".npy")) files.emplace(name.substr(0, name.size() - 4), e.path());
    else if (name.starts_with("step-") && e.is_directory(ec)) checkpoints.push_back(name);
  }
  if (files.empty()) {
    std::string hint;
    if (!checkpoints.empty()) {
      std::sort(checkpoints.begin(), checkpoints.end());
      hint = " (it holds checkpoints " + checkpoints.front() + (checkpoints.size() > 1 ? " ... " + checkpoints.back() : "") +
             ": give one of them)";
    }
    throw UsageError(who + " holds no .npy files" + hint);
  }
  return files;
}

template <class T>
std::string value_text(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return float_bits_text(v);
  } else if constexpr (std::is_same_v<T, double>) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g (0x%016llx)", v, static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(v)));
    return buf;
  } else {
    return std::to_string(v);
  }
}

// |a - b| / max(|a|, |b|): 0 for equal values (+0 and -0 included), infinite where an infinity meets
// anything else, and without overflow where a - b itself would overflow.
double relative_difference(double a, double b) {
  if (a == b) return 0;
  if (std::isinf(a) || std::isinf(b)) return std::numeric_limits<double>::infinity();
  const double m = std::max(std::abs(a), std::abs(b));
  const double diff = std::abs(a - b);
  if (std::isinf(diff)) return std::abs(a / 2 - b / 2) / (m / 2);
  return diff / m;
}

template <class T>
void compare_elements(const NpyArray& a, const NpyArray& b, TensorDiff& d) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const auto n = static_cast<std::size_t>(a.count());
  d.count = static_cast<std::int64_t>(n);
  for (std::size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a.data.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b.data.data() + i * sizeof(T), sizeof(T));
    if (std::bit_cast<Bits>(x) == std::bit_cast<Bits>(y)) continue;
    ++d.differing;
    if (d.first < 0) {
      d.first = static_cast<std::int64_t>(i);
      d.first_index = index_text(a.shape, i);
      d.first_a = value_text(x);
      d.first_b = value_text(y);
    }
    if constexpr (std::is_floating_point_v<T>) {
      // NaNs of the same bits were equal above; a NaN against anything else is as far as can be.
      const bool nan = std::isnan(x) || std::isnan(y);
      d.max_ulp = std::max(d.max_ulp, nan ? infinite_ulp : ulp_distance(x, y));
      d.max_rel = std::max(d.max_rel, nan ? std::numeric_limits<double>::infinity()
                                          : relative_difference(static_cast<double>(x), static_cast<double>(y)));
    }
  }
}

TensorDiff compare_files(const std::string& name, const fs::path& pa, const fs::path& pb, const Tolerance& tol) {
  TensorDiff d;
  d.name = name;
  const NpyArray a = read_npy(pa), b = read_npy(pb);
  d.dtype_a = a.dtype;
  d.dtype_b = b.dtype;
  d.shape_a = a.shape;
  d.shape_b = b.shape;
  if (a.dtype != b.dtype) {
    d.status = TensorDiff::Status::dtype_differs;
    return d;
  }
  if (a.shape != b.shape) {
    d.status = TensorDiff::Status::shape_differs;
    return d;
  }
  switch (a.dtype) {
    case DType::f32: compare_elements<float>(a, b, d); break;
    case DType::f64: compare_elements<double>(a, b, d); break;
    case DType::i64: compare_elements<std::int64_t>(a, b, d); break;
    default: throw Error(pa.string() + ": dtype " + std::string(dtype_name(a.dtype)) + " has no comparison");
  }
  if (d.differing == 0 || a.dtype == DType::i64) {
    d.passed = d.differing == 0;
  } else {
    switch (tol.kind) {
      case Tolerance::Kind::bitwise: d.passed = false; break;
      case Tolerance::Kind::ulp: d.passed = d.max_ulp != infinite_ulp && d.max_ulp <= tol.ulp; break;
      case Tolerance::Kind::rtol: d.passed = d.max_rel <= tol.rtol; break;
    }
  }
  return d;
}

}  // namespace

std::vector<TensorDiff> diff_tensor_dirs(const fs::path& a, const fs::path& b, const Tolerance& tolerance) {
  const NpyFiles fa = list_npy(a, "A"), fb = list_npy(b, "B");
  NpyFiles names = fa;
  names.insert(fb.begin(), fb.end());
  std::vector<TensorDiff> out;
  for (const auto& [name, unused] : names) {
    const auto ia = fa.find(name), ib = fb.find(name);
    if (ia != fa.end() && ib != fb.end()) {
      out.push_back(compare_files(name, ia->second, ib->second, tolerance));
      continue;
    }
    TensorDiff d;
    d.name = name;
    d.status = ia != fa.end() ? TensorDiff::Status::only_in_a : TensorDiff::Status::only_in_b;
    const NpyArray one = read_npy(ia != fa.end() ? ia->second : ib->second);  // refused here if it is no .npy file
    (ia != fa.end() ? d.dtype_a : d.dtype_b) = one.dtype;
    (ia != fa.end() ? d.shape_a : d.shape_b) = one.shape;
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

std::string ulp_text(std::uint64_t u) { return u == infinite_ulp ? "inf" : std::to_string(u); }

// Three digits say how far apart; the values themselves are printed in full.
std::string rel_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", r);
  return buf;
}

bool is_float(const TensorDiff& t) { return t.dtype_a == DType::f32 || t.dtype_a == DType::f64; }

}  // namespace

void print_tensor_diffs(std::ostream& out, const fs::path& a, const fs::path& b, const std::vector<TensorDiff>& diffs,
                        const Tolerance& tolerance) {
  out << "A: " << a.string() << "\nB: " << b.string() << "\ntolerance: " << tolerance.describe() << "\n";
  std::vector<std::vector<std::string>> rows{{"tensor", "shape", "dtype", "max_ulp", "max_rel", "differing", "result", "first difference"}};
  for (const TensorDiff& t : diffs) {
    const bool compared = t.status == TensorDiff::Status::compared;
    const bool floats = compared && is_float(t);
    rows.push_back({t.name,
                    t.status == TensorDiff::Status::shape_differs ? "-"
                                                                  : shape_text(t.status == TensorDiff::Status::only_in_b ? t.shape_b : t.shape_a),
                    t.status == TensorDiff::Status::dtype_differs ? "-"
                                                                  : std::string(dtype_name(t.status == TensorDiff::Status::only_in_b ? t.dtype_b : t.dtype_a)),
                    floats ? ulp_text(t.max_ulp) : "-",
                    floats ? rel_text(t.max_rel) : "-",
                    compared ? std::to_string(t.differing) + " of " + std::to_string(t.count) : "-",
                    t.passed ? "ok" : "FAIL",
                    !compared ? t.status_text() : t.first < 0 ? "-" : t.first_index + ": " + t.first_a + " vs " + t.first_b});
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
  std::vector<const TensorDiff*> failed;
  for (const TensorDiff& t : diffs)
    if (!t.passed) failed.push_back(&t);
  if (failed.empty()) {
    out << "ok: " << diffs.size() << (diffs.size() == 1 ? " tensor" : " tensors")
        << (tolerance.kind == Tolerance::Kind::bitwise ? " equal bitwise" : " within " + tolerance.describe()) << "\n";
    return;
  }
  out << "FAILED: " << failed.size() << " of " << diffs.size() << " tensors differ (tolerance: " << tolerance.describe() << "):";
  for (std::size_t i = 0; i < failed.size(); ++i) {
    out << (i ? ", " : " ") << failed[i]->name;
    if (failed[i]->status != TensorDiff::Status::compared) out << " (" << failed[i]->status_text() << ")";
  }
  out << "\n";
}

json to_json(const fs::path& a, const fs::path& b, const std::vector<TensorDiff>& diffs, const Tolerance& tolerance) {
  static constexpr const char* kStatus[] = {"compared", "only_in_a", "only_in_b", "dtype_differs", "shape_differs"};
  json tensors = json::array();
  for (const TensorDiff& t : diffs) {
    const bool has_a = t.status != TensorDiff::Status::only_in_b, has_b = t.status != TensorDiff::Status::only_in_a;
    json j{{"name", t.name},
           {"status", kStatus[static_cast<int>(t.status)]},
           {"passed", t.passed},
           {"dtype_a", has_a ? json(dtype_name(t.dtype_a)) : json(nullptr)},
           {"dtype_b", has_b ? json(dtype_name(t.dtype_b)) : json(nullptr)},
           {"shape_a", has_a ? json(t.shape_a) : json(nullptr)},
           {"shape_b", has_b ? json(t.shape_b) : json(nullptr)}};
    if (t.status == TensorDiff::Status::compared) {
      j["count"] = t.count;
      j["differing"] = t.differing;
      if (is_float(t)) {
        // JSON has no infinity: a NaN against a number shows as null.
        j["max_ulp"] = t.max_ulp == infinite_ulp ? json(nullptr) : json(t.max_ulp);
        j["max_rel"] = std::isinf(t.max_rel) ? json(nullptr) : json(t.max_rel);
      }
      j["first_difference"] = t.first < 0 ? json(nullptr)
                                          : json{{"flat", t.first}, {"index", t.first_index}, {"a", t.first_a}, {"b", t.first_b}};
    }
    tensors.push_back(std::move(j));
  }
  json tol{{"kind", tolerance.kind == Tolerance::Kind::bitwise ? "bitwise" : tolerance.kind == Tolerance::Kind::ulp ? "ulp" : "rtol"}};
  if (tolerance.kind == Tolerance::Kind::ulp) tol["ulp"] = tolerance.ulp;
  if (tolerance.kind == Tolerance::Kind::rtol) tol["rtol"] = tolerance.rtol;
  return {{"kind", "npy"}, {"a", a.string()}, {"b", b.string()}, {"tolerance", tol}, {"passed", all_passed(diffs)}, {"tensors", tensors}};
}

}  // namespace dpcheck
