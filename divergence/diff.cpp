// dpcheck diff (divergence/diff.hpp), its front and its trace report: which kind of input a path holds,
// the text of a trace's items, and the report of a trace diff (text and JSON). The traces themselves are
// read and walked in divergence/diff_trace.cpp, and .npy directories compared in divergence/diff_npy.cpp,
// so that each part of the diff reads on its own.
#include "divergence/diff.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <ostream>
#include <system_error>

#include "divergence/diff_internal.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/json_limits.hpp"

namespace dpcheck {

namespace fs = std::filesystem;
using nlohmann::json;

namespace diff_detail {

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace diff_detail

// ---- what a path holds ----------------------------------------------------------------------------

namespace {

// A header line is a few hundred bytes; a first line longer than this is not one.
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

}  // namespace

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
    throw UsageError(who +
                     " is a single .npy file; diff compares directories of them: give the directory that holds it");
  check_json_depth(first, who + ":1");
  const json header = json::parse(first, nullptr, /*allow_exceptions=*/false);
  if (header.is_object() && header.contains("dpcheck_trace")) return DiffInput::trace;
  throw UsageError(who +
                   " is neither a trace (its first line is not a JSON object with a \"dpcheck_trace\" key) nor a "
                   "directory of .npy tensors");
}

// ---- the text of a trace diff ---------------------------------------------------------------------

std::string TraceTensor::describe() const {
  return "digest " + digest + "  max_abs " + diff_detail::number_text(max_abs) + "  sum " +
         diff_detail::number_text(sum) + "  non_finite " + std::to_string(non_finite);
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

// How many of a step's other differences, and of the later differing steps, the report lists.
constexpr std::size_t kListed = 10;

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
        out << "  " << phase_name(x.phase) << (x.rank >= 0 ? ", rank " + std::to_string(x.rank) : "") << ", " << x.item
            << "\n";
      }
      if (others > kListed) out << "  ... and " << others - kListed << " more\n";
    } else {
      out << "\n";
    }
    const std::size_t later = d.differing_steps.size() - 1;
    if (later > 0) {
      out << "later: " << later << (later == 1 ? " more step differs (" : " more steps differ (");
      for (std::size_t i = 1; i <= std::min(later, kListed); ++i)
        out << (i > 1 ? ", " : "") << d.differing_steps[i].step;
      out << (later > kListed ? ", ...)\n" : ")\n");
    } else {
      out << "later: no other step differs\n";
    }
  } else if (d.comparable && d.steps_compared > 0) {
    out << "the " << steps_text(d.steps_compared) << " both traces hold match (" << d.items_compared
        << " items compared)\n";
  }
  if (d.steps_compared == 0 && (d.steps_a > 0 || d.steps_b > 0)) out << "the traces have no step in common\n";
  if (d.only_in_a > 0 && d.only_in_b == 0)
    out << "B is shorter: A has " << steps_text(d.only_in_a) << " that B lacks, from step " << d.first_only_in_a
        << "\n";
  else if (d.only_in_b > 0 && d.only_in_a == 0)
    out << "A is shorter: B has " << steps_text(d.only_in_b) << " that A lacks, from step " << d.first_only_in_b
        << "\n";
  else if (d.only_in_a > 0 && d.only_in_b > 0)
    out << "the traces hold different steps: " << steps_text(d.only_in_a) << " only in A (from step "
        << d.first_only_in_a << "), " << steps_text(d.only_in_b) << " only in B (from step " << d.first_only_in_b
        << ")\n";
}

namespace {

json summary_json(const std::optional<TraceTensor>& t) {
  if (!t) return nullptr;
  return {{"digest", t->digest}, {"max_abs", t->max_abs}, {"sum", t->sum}, {"non_finite", t->non_finite}};
}

json mismatch_json(const TraceMismatch& m) {
  json j{{"step", m.step},
         {"phase", phase_name(m.phase)},
         {"rank", m.rank >= 0 ? json(m.rank) : json(nullptr)},
         {"item", m.item},
         {"a", m.a},
         {"b", m.b}};
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

}  // namespace dpcheck
