// Running the collective checks: one check's cases in turn on every rank until the first that fails
// (the minimal case), the checks on each world of ranks, and the public functions of conform/conform.hpp
// for a communicator. The checks themselves are built in conform_comm_checks.cpp and
// conform_comm_schedule.cpp; what they share is in conform_comm_internal.hpp.
#include <algorithm>
#include <bit>
#include <mutex>
#include <optional>

#include "conform/conform.hpp"
#include "conform/conform_comm_backends.hpp"
#include "conform/conform_comm_internal.hpp"
#include "mutants/mutants.hpp"
#include "src/error.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/target/plugin_comm.hpp"
#include "verdict/verdict.hpp"

namespace dpcheck {
namespace conform_comm_detail {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- one check: its cases run on every rank, the first failing one is the minimal case -------------

namespace {

// The minimal case of a row whose world failed before its first case ran (the plugin's init, say).
constexpr const char* kBeforeFirstCase = "none: it failed before its first case, as the ranks started";

// The world size a row's replay line names (none under a launcher, whose -np says it). The mutant
// conform-replay-drops-world-size leaves it out: the line then replays on conform's default worlds.
std::string world_flag(const Target& target, int n, const ConformOptions& o) {
  if (mutant_conform_replay_drops_world_size(o.mutant)) return "";
  return target.process_world ? std::string() : " --world-size " + std::to_string(n);
}

// A check's row on a world of n ranks: passed, or failed at case `failed_at` (none: before its first
// case) for `failure`.
ConformRow check_row(const Target& target, int n, const CommCheck& check, const ConformOptions& o, bool failed,
                     std::optional<std::size_t> failed_at, const std::string& failure, double seconds) {
  ConformRow row;
  row.section = check.section;
  row.check = check.name;
  row.seconds = seconds;
  if (!failed) {
    row.verdict = ConformVerdict::pass;
    row.detail = check.covered;
    return row;
  }
  row.verdict = ConformVerdict::fail;
  row.detail = "N = " + std::to_string(n) + ", " + failure;
  if (!failed_at) {
    row.promise = "the plugin's communicator starts on every rank";
    row.minimal = kBeforeFirstCase;
    row.replay = o.replay_prefix + world_flag(target, n, o) + " --check '" + check.name + "'";
    return row;
  }
  row.promise = check.promise;
  row.minimal = check.cases[*failed_at].text();
  row.replay =
      o.replay_prefix + world_flag(target, n, o) + " --check '" + check.name + "' --case '" + row.minimal + "'";
  return row;
}

// Where a check failed: the case, and the first failing rank's words.
struct CaseFailure {
  std::size_t at = 0;
  std::string what;
};

// The cases of `check` in turn on this rank (collective: every rank calls it), stopping at the first case
// that fails on any rank; every rank returns the same. `starting` is told each case before it runs.
std::optional<CaseFailure> run_cases(Communicator& comm, const CommCheck& check,
                                     const std::function<void(std::size_t)>& starting) {
  const CaseFn run = check.make();
  for (std::size_t k = 0; k < check.cases.size(); ++k) {
    starting(k);
    const std::vector<std::string> all = allgather_strings(comm.host(), run(comm, check.cases[k]));
    for (std::size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty())
        return CaseFailure{k, "rank " + std::to_string(r) + ": " + all[r]};  // every rank saw the same texts
  }
  return std::nullopt;
}

// The checks on one world of n ranks, in the order given, each check's cases in turn, on one
// communicator: a plugin's start-up (a TCP mesh, an NCCL communicator) is paid once a world, not once a
// check. Each check's row goes to `done` (on the thread of the rank that records) as it is decided. A
// check that ends in an exception (the plugin's own error, a timeout) ends that communicator, and the
// checks after it run on a new one. Returns why the rest cannot run, or "": the ranks did not start
// (the first check's row says so), or the launcher's world broke (a plugin left messages behind).
std::string run_checks_on_world(const Target& target, int n, const std::vector<const CommCheck*>& checks,
                                const ConformOptions& o, const std::function<void(std::size_t, ConformRow)>& done) {
  std::size_t next = 0;
  while (next < checks.size()) {
    std::mutex mutex;
    std::optional<std::size_t> current, in_flight;  // the check and case in progress (none: not begun)
    Clock::time_point started = Clock::now();
    bool finished = false;
    try {
      run_world(target, n, [&](Communicator& comm) {
        const bool recording = records(target, comm);
        for (std::size_t c = next; c < checks.size(); ++c) {
          const CommCheck& check = *checks[c];
          if (recording) {
            std::lock_guard lock(mutex);
            current = c;
            in_flight.reset();
            started = Clock::now();
          }
          const std::optional<CaseFailure> failed = run_cases(comm, check, [&](std::size_t k) {
            if (recording) {
              std::lock_guard lock(mutex);
              in_flight = k;
            }
          });
          if (recording && failed) {
            done(c, check_row(target, n, check, o, true, failed->at, failed->what, seconds_since(started)));
          } else if (recording) {
            const std::optional<CheckConclusion> last = check.conclude ? check.conclude() : std::nullopt;
            ConformRow row =
                check_row(target, n, check, o, last && last->failed, last ? std::optional(last->at) : std::nullopt,
                          last ? last->what : "", seconds_since(started));
            if (last && !last->failed) {
              row.verdict = ConformVerdict::switches;
              row.detail = "N = " + std::to_string(n) + ", " + last->what;
            }
            done(c, row);
          }
        }
        if (recording) {
          std::lock_guard lock(mutex);
          finished = true;
        }
      });
      next = checks.size();
    } catch (const std::exception& e) {
      if (finished) throw;  // every check was decided: an error at the end of the world is the run's own
      if (!current) {
        done(next, check_row(target, n, *checks[next], o, true, std::nullopt, e.what(), seconds_since(started)));
        return "the plugin's communicator did not start at '" + checks[next]->name + "' (its failure says why)";
      }
      done(*current,
           check_row(target, n, *checks[*current], o, true, in_flight.value_or(0), e.what(), seconds_since(started)));
      next = *current + 1;
      if (target.process_world) {
        try {
          target.process_world->barrier();
        } catch (const std::exception&) {
          return "the ranks' world broke at '" + checks[*current]->name + "' (its failure says why)";
        }
      }
    }
  }
  return "";
}

// ---- the rows of the suite ------------------------------------------------------------------------

int log2_of(std::size_t power) { return std::countr_zero(power); }

// A check of something the plugin does not declare (include/dpcheck/plugin.h, "Capabilities"): not
// run, neither a pass nor a failure. "" when the plugin takes what the check asks.
std::string unsupported_reason(const dpcheck_comm_plugin_t& plugin, const std::string& path, const CommCheck& check) {
  if (!check.dtype) return "";
  if (check.op ? comm_plugin_supports(plugin, *check.dtype, *check.op) : comm_plugin_has_dtype(plugin, *check.dtype))
    return "";
  return comm_plugin_lacks(plugin, path, *check.dtype, check.op);
}

// What the fingerprint and the absent-rank probe ask: a float32 sum.
CommCheck fingerprint_needs() {
  CommCheck c;
  c.dtype = DType::f32;
  c.op = ReduceOp::sum;
  return c;
}

ConformRow unsupported_row(std::string section, std::string name, const std::string& why) {
  ConformRow row;
  row.section = std::move(section);
  row.check = std::move(name);
  row.verdict = ConformVerdict::unsupported;
  row.detail = "the plugin says so: " + why;
  return row;
}

}  // namespace

}  // namespace conform_comm_detail

std::vector<std::string> conform_comm_checks() {
  constexpr const char* dtypes[] = {"float32", "float64", "int64", "bfloat16", "float16"};
  std::vector<std::string> names;
  for (const char* d : dtypes)
    for (const char* op : {"sum", "avg", "min", "max"}) names.push_back(std::string("allreduce ") + d + " " + op);
  names.push_back("allreduce buffer reused");
  for (const char* d : dtypes) names.push_back(std::string("broadcast ") + d);
  for (const char* d : dtypes) names.push_back(std::string("allgather ") + d);
  names.push_back("barrier");
  names.push_back("calls in a row");
  for (const char* d : {"float32", "float64", "bfloat16", "float16"})
    for (const char* op : {"sum", "avg"}) {
      names.push_back(std::string("same bits on every rank ") + d + " " + op);
      names.push_back(std::string("run-to-run ") + d + " " + op);
    }
  // With --schedule: the bits of the schedule the backend claims.
  for (const char* d : {"float32", "bfloat16", "float16"})
    for (const char* op : {"sum", "avg"}) names.push_back(std::string("schedule ") + d + " " + op);
  names.push_back("a rank that never arrives");
  names.push_back("summation order and width");
  return names;
}

bool is_allreduce_check(const std::string& name) {
  return name.starts_with("allreduce ") || name.starts_with("same bits on every rank ") ||
         name.starts_with("run-to-run ") || name.starts_with("schedule ") || name == "summation order and width";
}

void check_conform_comm_selection(const std::string& check, const std::string& case_text,
                                  const PropertyRows* properties) {
  using conform_comm_detail::parse_case;
  if (!case_text.empty() && check.empty()) throw UsageError("--case needs --check: the case of which check?");
  if (check.empty()) return;
  if (check.starts_with("property ")) {
    require_property_check(check, properties);
    if (!case_text.empty())
      throw UsageError("--case is for conform's own checks; a property's case replays with dpcheck verify --reproduce");
    return;
  }
  const std::vector<std::string> names = conform_comm_checks();
  if (std::find(names.begin(), names.end(), check) == names.end())
    throw UsageError("--check '" + check + "' is not a check of a communicator (see --list-checks)");
  if (!case_text.empty()) (void)parse_case(case_text, check.starts_with("broadcast"), check);
}

std::size_t conform_case_count(const std::string& check, const std::string& case_text) {
  using conform_comm_detail::parse_case;
  if (case_text.empty() || check.empty() || check.starts_with("property ")) return 0;
  return parse_case(case_text, check.starts_with("broadcast"), check).count;
}
std::vector<std::string> conform_comm_suite() {
  std::vector<std::string> names;
  // Not the absent rank (a world of its own) nor the fingerprint (information); not an avg of int64,
  // which a plugin may declare and dpcheck's own backends refuse ("unsupported reductions throw"); not
  // the schedule checks, which need the schedule a backend claims.
  for (const std::string& name : conform_comm_checks())
    if (name != "a rank that never arrives" && name != "summation order and width" && name != "allreduce int64 avg" &&
        !name.starts_with("schedule "))
      names.push_back(name);
  for (const BackendCommCheck& b : backend_comm_checks()) names.emplace_back(b.name);
  return names;
}

std::string run_conform_comm_check(Communicator& comm, const std::string& name, const ConformOptions& o,
                                   std::string* replay) {
  using conform_comm_detail::CaseFailure;
  using conform_comm_detail::check_row;
  using conform_comm_detail::CheckConclusion;
  using conform_comm_detail::CommCheck;
  using conform_comm_detail::kAll;
  using conform_comm_detail::make_check;
  using conform_comm_detail::run_cases;
  const std::optional<CommCheck> check = make_check(name, comm.size(), kAll, o);
  if (!check) throw UsageError("'" + name + "' is not a check of conform_comm_suite()");
  // The row `dpcheck conform` prints for a failure at case `at` (ranks as threads).
  const auto replay_of = [&](std::size_t at, const std::string& what) {
    if (replay && comm.rank() == 0) *replay = check_row(Target{}, comm.size(), *check, o, true, at, what, 0).replay;
  };
  const std::optional<CaseFailure> failed = run_cases(comm, *check, [](std::size_t) {});
  if (failed) {
    replay_of(failed->at, failed->what);
    return "case " + check->cases[failed->at].text() + ", " + failed->what + " (the promise: " + check->promise + ")";
  }
  if (!check->conclude) return "";
  // The cases taken together (a schedule followed at some counts only): rank 0 recorded them, and its
  // word is every rank's. A switch by size is no failure.
  std::string concluded;
  if (comm.rank() == 0)
    if (const std::optional<CheckConclusion> c = check->conclude(); c && c->failed) {
      concluded = "case " + check->cases[c->at].text() + ", " + c->what + " (the promise: " + check->promise + ")";
      replay_of(c->at, c->what);
    }
  return allgather_strings(comm.host(), concluded)[0];
}

std::vector<ConformRow> conform_comm(const Target& target, int n, const ConformOptions& o) {
  using conform_comm_detail::absent_rank_row;
  using conform_comm_detail::CommCheck;
  using conform_comm_detail::fingerprint_needs;
  using conform_comm_detail::fingerprint_row;
  using conform_comm_detail::kAll;
  using conform_comm_detail::log2_of;
  using conform_comm_detail::make_check;
  using conform_comm_detail::other_world_cap;
  using conform_comm_detail::run_checks_on_world;
  using conform_comm_detail::unsupported_reason;
  using conform_comm_detail::unsupported_row;
  check_conform_comm_selection(o.check, o.case_text, o.properties);
  std::vector<ConformRow> rows;
  const auto emit = [&](ConformRow row) {
    if (o.on_row) o.on_row(row);
    rows.push_back(std::move(row));
  };
  const auto wanted = [&](const std::string& name) {
    if (o.allreduce_only && !name.starts_with("property ") && !is_allreduce_check(name)) return false;
    return o.check.empty() || o.check == name;
  };
  const dpcheck_comm_plugin_t* plugin =
      looks_like_plugin_path(target.backend->name) ? &load_comm_plugin(target.backend->name) : nullptr;
  // Once the ranks cannot start (the plugin's init fails) or the launcher's world is broken (a plugin
  // left messages behind), the later rows would fail for that same reason: they are not run, and say
  // which row to read.
  std::string stopped;
  const auto not_run_row = [&](const std::string& section, const std::string& name) {
    ConformRow row;
    row.section = section;
    row.check = name;
    row.verdict = ConformVerdict::skip;
    row.detail = "not run: " + stopped;
    return row;
  };
  const auto not_run = [&](const std::string& section, const std::string& name) { emit(not_run_row(section, name)); };

  // Every collective check, in order: its row when decided without running (unsupported), else its
  // check on the main world. A replayed case runs on the world it failed on (the command line's) alone.
  struct Slot {
    std::string name;
    std::optional<CommCheck> check;  // the main world's
    std::optional<ConformRow> row;   // decided
    double seconds = 0;              // on the other worlds
    std::vector<int> worlds;         // the other worlds it passed on
    std::string switched;            // the first other world's switch, "N = 8, the library does not ..."
  };
  std::vector<Slot> slots;
  for (const std::string& name : conform_comm_checks()) {
    if (!wanted(name)) continue;
    std::optional<CommCheck> check = make_check(name, n, kAll, o);
    if (!check) continue;
    Slot slot{name, std::nullopt, std::nullopt, 0, {}, {}};
    if (const std::string why = plugin ? unsupported_reason(*plugin, target.backend->name, *check) : ""; !why.empty())
      slot.row = unsupported_row(check->section, name, why);
    else slot.check = std::move(check);
    slots.push_back(std::move(slot));
  }
  std::size_t emitted = 0;
  const auto emit_ready = [&] {
    for (; emitted < slots.size() && slots[emitted].row; ++emitted) emit(*slots[emitted].row);
  };

  if (o.case_text.empty()) {
    // The other worlds first, smaller first (a failure there is the simpler case), at counts up to
    // other_world_cap; a check's first failure is its row. The quick default makes its 900 calls in a row
    // on the main world alone: what wraps there wraps in any world.
    std::vector<int> others = o.extra_world_sizes;
    std::sort(others.begin(), others.end());
    others.erase(std::unique(others.begin(), others.end()), others.end());
    others.erase(std::remove(others.begin(), others.end(), n), others.end());
    for (int w : others) {
      if (!stopped.empty()) break;
      std::vector<CommCheck> here;
      std::vector<std::size_t> slot_of;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].row || (!o.thorough && slots[i].name == "calls in a row")) continue;
        here.push_back(*make_check(slots[i].name, w, other_world_cap(o), o));
        slot_of.push_back(i);
      }
      std::vector<const CommCheck*> pointers;
      for (const CommCheck& c : here) pointers.push_back(&c);
      stopped = run_checks_on_world(target, w, pointers, o, [&](std::size_t k, ConformRow row) {
        Slot& slot = slots[slot_of[k]];
        slot.seconds += row.seconds;
        if (row.verdict == ConformVerdict::fail) {
          row.seconds = slot.seconds;
          slot.row = std::move(row);
        } else {
          if (row.verdict == ConformVerdict::switches && slot.switched.empty()) slot.switched = row.detail;
          slot.worlds.push_back(w);
        }
      });
    }
  }
  // Then the main world, each row printed as it is decided.
  if (stopped.empty()) {
    std::vector<const CommCheck*> pointers;
    std::vector<std::size_t> slot_of;
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].row) {
        pointers.push_back(&*slots[i].check);
        slot_of.push_back(i);
      }
    stopped = run_checks_on_world(target, n, pointers, o, [&](std::size_t k, ConformRow row) {
      Slot& slot = slots[slot_of[k]];
      row.seconds += slot.seconds;
      // A switch on another world is the row's word where the main world found none.
      if (row.verdict == ConformVerdict::pass && !slot.switched.empty()) {
        row.verdict = ConformVerdict::switches;
        row.detail =
            slot.switched + " (the main world, N = " + std::to_string(n) + ", follows the schedule throughout)";
      } else if (row.verdict == ConformVerdict::pass && !slot.worlds.empty()) {
        std::string others;
        for (int w : slot.worlds) others += (others.empty() ? "" : ", ") + std::to_string(w);
        row.detail = "N = " + std::to_string(n) + ": " + row.detail + "; also N = " + others + " (counts to 2^" +
                     std::to_string(log2_of(other_world_cap(o))) + ")";
      } else if (row.verdict == ConformVerdict::pass) {
        row.detail = "N = " + std::to_string(n) + ": " + row.detail;
      }
      slot.row = std::move(row);
      emit_ready();
    });
  }
  for (Slot& slot : slots)
    if (!slot.row) slot.row = not_run_row(slot.check->section, slot.name);
  emit_ready();
  if (wanted("a rank that never arrives")) {
    const std::string why = plugin ? unsupported_reason(*plugin, target.backend->name, fingerprint_needs()) : "";
    if (!why.empty()) emit(unsupported_row("robustness", "a rank that never arrives", why));
    else if (!stopped.empty()) not_run("robustness", "a rank that never arrives");
    else emit(absent_rank_row(n, o));
  }
  if (wanted("summation order and width")) {
    const std::string why = plugin ? unsupported_reason(*plugin, target.backend->name, fingerprint_needs()) : "";
    if (!why.empty()) emit(unsupported_row("fingerprint", "summation order and width", why));
    else if (!stopped.empty()) not_run("fingerprint", "summation order and width");
    else emit(fingerprint_row(target, n, plugin, o));
  }
  if (o.properties && (o.check.empty() || o.check.starts_with("property "))) {
    if (!stopped.empty()) {
      for (const std::string& check : o.properties->checks)
        if (wanted(check)) not_run("properties", check);
    } else {
      for (ConformRow& row : o.properties->run(target, o)) rows.push_back(std::move(row));  // on_row called there
    }
  }
  return rows;
}

}  // namespace dpcheck
