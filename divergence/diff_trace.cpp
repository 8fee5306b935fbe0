// dpcheck diff's traces (divergence/diff.hpp): diff_traces reads two traces a line at a time and walks
// each pair of steps phase by phase to every digest that differs. Every line is checked whole (its ranks,
// tensors and collectives against the header), so that a damaged trace is refused naming its line rather
// than compared as if it were a shorter or different run.
#include "divergence/diff.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <limits>
#include <system_error>
#include <utility>

#include "divergence/diff_internal.hpp"
#include "src/error.hpp"
#include "src/io/json_limits.hpp"

namespace dpcheck {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A JSON value as a message shows it: whole when short.
std::string shown(const json& v) {
  constexpr std::size_t kMax = 60;
  std::string s = v.dump();
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

bool is_digest(const std::string& s) {
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// ---- reading traces -------------------------------------------------------------------------------

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
      if (const std::size_t at = what.find("] "); what.starts_with("[json.") && at != std::string::npos)
        what.erase(0, at + 2);
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
    if (world > std::numeric_limits<int>::max())
      fail("\"world_size\" " + std::to_string(world) + " is beyond any world");
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
      const json& state =
          array(state_list, w + ".state", state_list.is_array() && state_list.empty() ? 0 : header_.state.size());
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
  bool per_rank = true;                                    // same world size: every rank pairs
  std::vector<std::pair<std::size_t, std::size_t>> state;  // state blocks both hold: A's index, B's
  const std::vector<std::string>& state_names;             // A's
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
    const auto loss_text = [](const std::optional<double>& l) {
      return l ? diff_detail::number_text(*l) : std::string("null (not finite)");
    };
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
        item(TracePhase::all_reduce, static_cast<int>(r), "collective " + da + " in",
             ca.ranks[r].first == cb.ranks[r].first, ca.ranks[r].first, cb.ranks[r].first);
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
    d.config_differences.push_back("world_size " + std::to_string(ha.world_size) + " vs " +
                                   std::to_string(hb.world_size));
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
    d.notes.push_back("the world sizes differ (" + std::to_string(ha.world_size) + " and " +
                      std::to_string(hb.world_size) +
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

}  // namespace dpcheck
