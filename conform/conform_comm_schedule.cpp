// The schedule a backend claims (--schedule), checked bit for bit against its emulation; the fingerprint
// of how a backend sums (its order and width, and whose schedule's bits it gives); and the probe of a
// rank that never arrives. Split from conform_comm.cpp, which runs them among the other checks' rows.
#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "conform/conform_comm_internal.hpp"
#include "reference/allreduce_schedule.hpp"
#include "src/io/hash.hpp"
#include "src/io/process.hpp"
#include "src/low_precision.hpp"
#include "src/rng.hpp"
#include "src/target/plugin_comm.hpp"
#include "verdict/verdict.hpp"

namespace dpcheck {
namespace conform_comm_detail {

// ---- the schedule a backend claims (--schedule) ---------------------------------------------------

namespace {

template <class T> constexpr Precision format_of() {
  if constexpr (std::is_same_v<T, Bf16>) return Precision::bf16;
  else if constexpr (std::is_same_v<T, Fp16>) return Precision::fp16;
  else return Precision::fp32;
}

template <class T> T of_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return narrow16<T>(v);
}

// What rank r contributes at element i of a schedule case: a value of the format over 2^-6..2^7, either
// sign, so that the grouping of the additions shows in the last bits of the sum.
float schedule_input(std::uint64_t key, int rank, std::size_t i, Precision format) {
  const auto stream = static_cast<std::uint64_t>(rank);
  const std::uint64_t bits = random_u64(key, stream, 2 * i + 1);
  const double v = std::ldexp(1 + random_unit(key, stream, 2 * i), static_cast<int>(bits % 13) - 6);
  return round_to_precision(static_cast<float>((bits >> 32) & 1 ? -v : v), format);
}

// Every rank's inputs of a case, as each rank computes them for itself.
std::vector<std::vector<float>> schedule_inputs(std::uint64_t key, int n, std::size_t count, Precision format) {
  std::vector<std::vector<float>> in(static_cast<std::size_t>(n), std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) in[static_cast<std::size_t>(r)][i] = schedule_input(key, r, i, format);
  return in;
}

// Every schedule dpcheck emulates in `format` (sum or avg), hierarchical with every group size from 2 to
// N - 1, or to `most_group` (the fingerprint's candidates, and where a switch may go, with groups to 8:
// rank 0 emulates each on every case).
std::vector<reference::ScheduleOptions> emulated_schedules(int n, Precision format, bool average,
                                                           int most_group = std::numeric_limits<int>::max()) {
  std::vector<reference::ScheduleOptions> out;
  for (const reference::ScheduleRow& row : reference::allreduce_schedules()) {
    reference::ScheduleOptions o;
    o.schedule = row.schedule;
    o.format = format;
    o.average = average;
    if (row.schedule != reference::AllreduceSchedule::hierarchical) {
      out.push_back(o);
      continue;
    }
    for (int g = 2; g < n && g <= most_group; ++g) {
      o.group_size = g;
      out.push_back(o);
    }
  }
  return out;
}

// "2 to 3", "7", "2, 5 and 9": counts for a report.
std::string counts_text(std::vector<std::size_t> counts) {
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  if (counts.size() == 1) return std::to_string(counts[0]);
  if (counts.back() - counts.front() + 1 == counts.size())
    return std::to_string(counts.front()) + " to " + std::to_string(counts.back());
  std::string text;
  for (std::size_t k = 0; k < counts.size(); ++k)
    text += (k == 0 ? "" : k + 1 == counts.size() ? " and " : ", ") + std::to_string(counts[k]);
  return text;
}

// What one case of a schedule check saw: whether the claimed schedule's bits came back, and which
// other emulated schedules' bits equal what came back.
struct ScheduleSeen {
  std::size_t count = 0;
  bool claimed = false;
  std::set<std::string> others;
  std::string
      difference;  // where the claimed schedule's bits were left: "element 1 is ..., the ring schedule gives ..."
};

// The cases rank 0 saw, for the check's conclusion (rank 0 alone classifies them: every rank holds the
// same bits by then, and the other ranks go on to the next case instead of emulating every schedule).
struct ScheduleLog {
  std::mutex mutex;
  std::map<int, std::shared_ptr<std::vector<ScheduleSeen>>> by_rank;
};

// The run's cases taken together. A call that left the claimed schedule but gave another's bits
// exactly is a switch when the claimed schedule was followed, where it is told apart from that other
// one, at every count on one side of those calls (a switch by size); anything else fails.
std::optional<CheckConclusion> conclude_schedule(const std::vector<ScheduleSeen>& seen, const std::string& claimed) {
  std::vector<std::size_t> left;  // the cases that left the claimed schedule
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (!seen[k].claimed) left.push_back(k);
  if (left.empty()) return std::nullopt;
  std::set<std::string> targets = seen[left[0]].others;
  for (std::size_t k : left) {
    std::set<std::string> both;
    std::set_intersection(targets.begin(), targets.end(), seen[k].others.begin(), seen[k].others.end(),
                          std::inserter(both, both.begin()));
    targets = both;
  }
  std::vector<std::size_t> left_counts;
  for (std::size_t k : left) left_counts.push_back(seen[k].count);
  const std::size_t first = left[0];
  const std::string prefix = "rank 0: " + seen[first].difference + "; ";
  if (targets.empty())
    return CheckConclusion{true, first,
                           prefix + "the calls that leave it (counts " + counts_text(left_counts) +
                               ") give no one other schedule's bits, so this is no switch of algorithm"};
  // Each target on its own: the claim must hold, where it is told apart from that target, at every
  // count on one side of the calls that left it.
  bool none_told_apart = true;
  for (const std::string& target : targets) {
    std::vector<std::size_t> kept;  // counts where the claim held and the target gives other bits
    for (const ScheduleSeen& c : seen)
      if (c.claimed && !c.others.contains(target)) kept.push_back(c.count);
    if (kept.empty()) continue;
    none_told_apart = false;
    const auto extremes = std::minmax_element(kept.begin(), kept.end());
    const std::size_t low = *extremes.first, high = *extremes.second;  // clang 14 captures no structured binding
    const bool below = std::all_of(left_counts.begin(), left_counts.end(), [&](std::size_t c) { return c < low; });
    const bool above = std::all_of(left_counts.begin(), left_counts.end(), [&](std::size_t c) { return c > high; });
    if (!below && !above) continue;
    return CheckConclusion{false, 0,
                           "the library does not follow " + claimed + " at count" +
                               (left_counts.size() == 1 ? " " : "s ") + counts_text(left_counts) + ": it switches to " +
                               target + " there (its bits at every element); " + claimed +
                               "'s own bits, told apart from those, at every count drawn " +
                               (below ? "from " + std::to_string(low) + " up" : "up to " + std::to_string(high))};
  }
  std::string names;  // "halving-doubling", or "halving-doubling or hierarchical:2"
  for (const std::string& t : targets) names += (names.empty() ? "" : " or ") + t;
  if (none_told_apart)
    return CheckConclusion{true, first,
                           prefix + "the all-reduce gives the bits of the " + names +
                               " schedule at every count drawn, and " + claimed +
                               "'s only where they agree: it follows " + names + ", not " + claimed};
  return CheckConclusion{true, first,
                         prefix + "it gives " + names + "'s bits at counts " + counts_text(left_counts) + " and " +
                             claimed + "'s at counts on both sides of them, which is no switch by size"};
}

// The backend's bits against the schedule's emulation (reference/allreduce_schedule.hpp): every rank
// must hold the same bits, and they must be the schedule's, or, where the library switches algorithm
// by size, another emulated schedule's exactly (conclude_schedule). A call that gives no emulated
// schedule's bits fails at once, naming the first element that differs, with both values.
template <class T> CommCheck schedule_check(ReduceOp op, reference::ScheduleOptions schedule, std::uint64_t seed, int n,
                                            const std::vector<CommCase>& cases) {
  schedule.format = format_of<T>();
  schedule.average = op == ReduceOp::avg;
  const std::string name = reference::schedule_text(schedule);
  CommCheck c;
  c.section = "schedule";
  c.name = "schedule " + std::string(dtype_name(dtype_of<T>())) + " " + std::string(reduce_op_name(op));
  c.dtype = dtype_of<T>();
  c.op = op;
  c.promise = "the all-reduce gives the bits of the schedule it claims, " + name +
              " (random inputs, whose sum depends on the grouping of the additions)";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T)) + ", random inputs over 2^-6..2^7, bit for bit against the " + name +
              " schedule's emulation";
  auto log = std::make_shared<ScheduleLog>();
  c.make = [op, schedule, seed, n, name, log] {
    auto arena = std::make_shared<Arena<T>>();
    auto mine = std::make_shared<std::vector<ScheduleSeen>>();
    return CaseFn(
        [arena, mine, log, op, schedule, seed, n, name](Communicator& comm, const CommCase& k) -> std::string {
          if (mine->empty()) {
            std::lock_guard lock(log->mutex);
            log->by_rank[comm.rank()] = mine;
          }
          T* buf = arena->prepare(k, k.count);
          const std::vector<std::vector<float>> in =
              schedule_inputs(mix_key(seed ^ 0x5c4edu, k.count), n, k.count, schedule.format);
          for (std::size_t i = 0; i < k.count; ++i) buf[i] = of_float<T>(in[static_cast<std::size_t>(comm.rank())][i]);
          comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
          arena->fetch(comm);
          const std::vector<std::uint64_t> hashes = comm.host().allgather_value(hash_bytes(buf, k.count * sizeof(T)));
          for (std::size_t r = 0; r < hashes.size(); ++r)
            if (hashes[r] != hashes[0]) return first_rank_difference(comm, buf, k.count, r);
          if (comm.rank() != 0) return arena->guards(k, k.count);
          const auto same = [&](const std::vector<float>& want) {
            for (std::size_t i = 0; i < k.count; ++i) {
              const T w = of_float<T>(want[i]);
              if (std::memcmp(&buf[i], &w, sizeof(T)) != 0) return i;
            }
            return k.count;
          };
          ScheduleSeen seen;
          seen.count = k.count;
          const std::vector<float> want = reference::emulate_allreduce(schedule, in);
          const std::size_t differs = same(want);
          seen.claimed = differs == k.count;
          for (const reference::ScheduleOptions& other : emulated_schedules(n, schedule.format, schedule.average, 8))
            if (same(reference::emulate_allreduce(other, in)) == k.count)
              seen.others.insert(reference::schedule_text(other));
          seen.others.erase(name);
          if (!seen.claimed) {
            const T w = of_float<T>(want[differs]);
            seen.difference = "element " + std::to_string(differs) + " is " + value_text(buf[differs]) + ", the " +
                              name + " schedule gives " + value_text(w) + distance_text(buf[differs], w);
            if (seen.others.empty())
              return seen.difference + " (nor are the bits those of another schedule dpcheck emulates)";
          }
          mine->push_back(std::move(seen));
          return arena->guards(k, k.count);
        });
  };
  c.conclude = [log, name]() -> std::optional<CheckConclusion> {
    std::lock_guard lock(log->mutex);
    if (log->by_rank.empty()) return std::nullopt;
    return conclude_schedule(*log->by_rank.begin()->second, name);
  };
  return c;
}

}  // namespace

std::optional<CommCheck> make_schedule_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o) {
  if (o.schedule.empty()) return std::nullopt;
  const reference::ScheduleOptions schedule = reference::parse_schedule(o.schedule);
  // Each rank computes every rank's inputs and the emulation: counts to 2^16.
  const std::size_t limit = std::size_t{1} << 16;
  const auto cases = [&](std::size_t element) { return check_cases(name, n, cap, o, element, limit, false); };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    const std::string suffix = " " + std::string(reduce_op_name(op));
    if (name == "schedule float32" + suffix) return schedule_check<float>(op, schedule, o.seed, n, cases(4));
    if (name == "schedule bfloat16" + suffix) return schedule_check<Bf16>(op, schedule, o.seed, n, cases(2));
    if (name == "schedule float16" + suffix) return schedule_check<Fp16>(op, schedule, o.seed, n, cases(2));
  }
  return std::nullopt;
}

// ---- the fingerprint: which order, and how wide, the backend adds -----------------------------------

namespace {

// The schedules whose bits a float32 sum of random inputs matches, for the fingerprint: "ring",
// "tree or halving-doubling", or "none of rank-order, ring, ...". Hierarchical is tried with every group
// size from 2 to N - 1.
std::string schedule_fingerprint(Communicator& comm, int n, std::uint64_t seed) {
  const std::size_t count = 64 * static_cast<std::size_t>(n) + 7;
  const std::vector<std::vector<float>> in = schedule_inputs(mix_key(seed ^ 0xf1a9u, count), n, count, Precision::fp32);
  std::vector<float> buf = in[static_cast<std::size_t>(comm.rank())];
  on_buffer(comm, buf, [&](float* placed) { comm.allreduce(placed, buf.size(), DType::f32, ReduceOp::sum); });
  std::string fits, tried;
  for (const reference::ScheduleOptions& o : emulated_schedules(n, Precision::fp32, false)) {
    const std::string text = reference::schedule_text(o);
    tried += (tried.empty() ? "" : ", ") + text;
    if (std::memcmp(reference::emulate_allreduce(o, in).data(), buf.data(), count * sizeof(float)) == 0)
      fits += (fits.empty() ? "" : " or ") + text;
  }
  return fits.empty() ? "random inputs: the bits of no schedule dpcheck emulates (" + tried + ")"
                      : "random inputs: the bits of the " + fits + " schedule";
}

// Candidate models of a backend's summation, evaluated on the probes in T.
template <class T> T fold_in_order(const std::vector<T>& x, const std::vector<int>& order) {
  T acc = x[static_cast<std::size_t>(order[0])];
  for (std::size_t k = 1; k < order.size(); ++k) acc = acc + x[static_cast<std::size_t>(order[k])];
  return acc;
}

template <class T> T fold_tree(const std::vector<T>& x, std::size_t lo, std::size_t hi) {
  if (hi - lo == 1) return x[lo];
  const std::size_t mid = lo + (hi - lo) / 2;
  return fold_tree(x, lo, mid) + fold_tree(x, mid, hi);
}

template <class T> std::string fingerprint(Communicator& comm, int n) {
  // Every ordered triple (a, b, c) of ranks: a holds B, b holds 1, c holds -B, the others 0. In T, the
  // 1 survives unless a's B and b's 1 meet before c's -B (or the backend adds wider than T).
  const T big = std::is_same_v<T, float> ? T(16777216.0) : T(9007199254740992.0);
  std::vector<std::array<int, 3>> triples;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      for (int c = 0; c < n; ++c)
        if (a != b && b != c && a != c) triples.push_back({a, b, c});
  std::vector<T> buf(triples.size());
  for (std::size_t e = 0; e < triples.size(); ++e) {
    const auto& t = triples[e];
    buf[e] = comm.rank() == t[0] ? big : comm.rank() == t[1] ? T(1) : comm.rank() == t[2] ? -big : T(0);
  }
  on_buffer(comm, buf, [&](T* placed) { comm.allreduce(placed, buf.size(), dtype_of<T>(), ReduceOp::sum); });

  const auto probe = [&](std::size_t e) {
    std::vector<T> x(static_cast<std::size_t>(n), T(0));
    x[static_cast<std::size_t>(triples[e][0])] = big;
    x[static_cast<std::size_t>(triples[e][1])] = T(1);
    x[static_cast<std::size_t>(triples[e][2])] = -big;
    return x;
  };
  std::vector<int> forward(static_cast<std::size_t>(n)), backward(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    forward[static_cast<std::size_t>(r)] = r;
    backward[static_cast<std::size_t>(r)] = n - 1 - r;
  }
  const auto chunk_of = [&](std::size_t e) {  // the chunk of element e when the buffer is cut in n
    const std::size_t count = triples.size(), per = count / static_cast<std::size_t>(n),
                      extra = count % static_cast<std::size_t>(n);
    const std::size_t edge = extra * (per + 1);
    return static_cast<int>(e < edge ? e / (per + 1) : extra + (e - edge) / std::max<std::size_t>(per, 1));
  };
  struct Model {
    const char* name;
    std::function<T(std::size_t)> eval;
  };
  const std::vector<Model> models = {
      {"in rank order (0 + 1 + ... + N-1)", [&](std::size_t e) { return fold_in_order(probe(e), forward); }},
      {"in reverse rank order", [&](std::size_t e) { return fold_in_order(probe(e), backward); }},
      {"as a pairwise tree over the ranks",
       [&](std::size_t e) { return fold_tree(probe(e), 0, static_cast<std::size_t>(n)); }},
      {"around a ring, each chunk from its own rank (c, c+1, ...)",
       [&](std::size_t e) {
         std::vector<int> order;
         for (int k = 0; k < n; ++k) order.push_back((chunk_of(e) + k) % n);
         return fold_in_order(probe(e), order);
       }},
      {"around a ring, each chunk from the rank after it (c+1, c+2, ...)",
       [&](std::size_t e) {
         std::vector<int> order;
         for (int k = 0; k < n; ++k) order.push_back((chunk_of(e) + 1 + k) % n);
         return fold_in_order(probe(e), order);
       }},
      {"exactly (wider than the type, or compensated)", [&](std::size_t) { return T(1); }},
  };
  std::vector<std::string> fits;
  for (const Model& m : models) {
    bool all = true;
    for (std::size_t e = 0; e < triples.size() && all; ++e) {
      const T want = m.eval(e);
      all = std::memcmp(&want, &buf[e], sizeof(T)) == 0;
    }
    if (all) fits.emplace_back(m.name);
  }
  std::size_t lost = 0;
  for (T v : buf) lost += v == T(0);
  std::string text = std::string(dtype_name(dtype_of<T>())) + ": ";
  if (fits.empty())
    text += "no simple order fits (" + std::to_string(lost) + " of " + std::to_string(triples.size()) +
            " cancellation probes lost the 1)";
  else
    for (std::size_t k = 0; k < fits.size(); ++k) text += (k ? " or " : "sums ") + fits[k];
  return text;
}

}  // namespace

// The probes in float32, and in float64 where the plugin takes float64 sums (a plugin that declares no
// float32 sum gets an "unsupported" row before this runs).
ConformRow fingerprint_row(const Target& target, int n, const dpcheck_comm_plugin_t* plugin, const ConformOptions& o) {
  ConformRow row;
  row.section = "fingerprint";
  row.check = "summation order and width";
  row.verdict = ConformVerdict::info;
  if (n < 3) {
    row.detail = "needs 3 ranks or more (with fewer, every order of addition gives the same sum)";
    return row;
  }
  const bool f64 = !plugin || comm_plugin_supports(*plugin, DType::f64, ReduceOp::sum);
  const auto t0 = Clock::now();
  std::mutex mutex;
  try {
    run_world(target, n, [&](Communicator& comm) {
      std::string text = fingerprint<float>(comm, n);
      if (f64) text += "; " + fingerprint<double>(comm, n);
      text += "; " + schedule_fingerprint(comm, n, o.seed);
      if (records(target, comm)) {
        std::lock_guard lock(mutex);
        row.detail = text;
      }
    });
  } catch (const std::exception& e) {
    const std::size_t probes =
        static_cast<std::size_t>(n) * static_cast<std::size_t>(n - 1) * static_cast<std::size_t>(n - 2);
    row.verdict = ConformVerdict::fail;
    row.promise = "the probes' all-reduce completes";
    row.detail = "N = " + std::to_string(n) + ", " + e.what();
    row.minimal = "the probes' all-reduce sum of " + std::to_string(probes) + " elements (float32" +
                  (f64 ? std::string(", then float64") : std::string()) + "), the check's one case";
    row.replay = o.replay_prefix + (target.process_world ? std::string() : " --world-size " + std::to_string(n)) +
                 " --check '" + row.check + "'";
  }
  row.seconds = seconds_since(t0);
  return row;
}

// ---- a rank that never arrives ---------------------------------------------------------------------------

ConformRow absent_rank_row(int n, const ConformOptions& o) {
  ConformRow row;
  row.section = "robustness";
  row.check = "a rank that never arrives";
  if (o.absent_rank_command.empty() || n < 2) {
    row.verdict = ConformVerdict::skip;
    row.detail = n < 2 ? "needs 2 ranks or more" : o.absent_rank_skip;
    return row;
  }
  const auto t0 = Clock::now();
  ChildOptions child;
  child.argv = o.absent_rank_command;
  child.input = ChildOptions::Input::null;
  child.out = ChildOptions::Output::capture;
  child.err = ChildOptions::Output::capture;
  child.timeout = o.timeout * 4 + std::chrono::seconds(10);
  child.new_process_group = true;
  child.timeout_signal = SIGKILL;
  const ChildResult r = run_child(child);
  row.seconds = seconds_since(t0);
  std::string said = r.out + r.err;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (r.succeeded()) {
    row.verdict = ConformVerdict::pass;
    row.detail = said;
    return row;
  }
  row.verdict = ConformVerdict::fail;
  row.promise = "a collective that a rank never joins ends in an error within the timeout, not a hang";
  row.detail = said.empty() ? "the probe " + r.status_text() : said;
  row.minimal = "count=1024 offset=0";
  row.replay = o.replay_prefix + " --world-size " + std::to_string(n) + " --check '" + row.check + "'";
  return row;
}

}  // namespace conform_comm_detail

int conform_absent_rank_probe(const Target& target, int n) {
  using conform_comm_detail::Clock;
  using conform_comm_detail::on_buffer;
  using conform_comm_detail::seconds_since;
  std::mutex mutex;
  std::vector<std::string> ended(static_cast<std::size_t>(n));
  const auto t0 = Clock::now();
  // The waiting ranks' errors end the world; each is caught where it is thrown.
  try {
    run_world(target, n, [&](Communicator& comm) {
      std::string outcome;
      if (comm.rank() != n - 1) {
        std::vector<float> buf(1024, 1.0f);
        try {
          on_buffer(comm, buf, [&](float* placed) { comm.allreduce(placed, buf.size(), DType::f32, ReduceOp::sum); });
          outcome = "returned success";
        } catch (const std::exception& e) {
          char when[32];
          std::snprintf(when, sizeof when, "%.2f", seconds_since(t0));
          outcome = std::string("failed after ") + when + " s: " + e.what();
        }
      } else {
        outcome = "never called";
      }
      std::lock_guard lock(mutex);
      ended[static_cast<std::size_t>(comm.rank())] = outcome;
    });
  } catch (const std::exception&) {
    // The world's own teardown after the errors above; what each rank saw is recorded.
  }
  bool all_failed = true;
  std::string first;
  for (int r = 0; r + 1 < n; ++r) {
    const std::string& e = ended[static_cast<std::size_t>(r)];
    all_failed &= e.starts_with("failed");
    if (first.empty() || !e.starts_with("failed"))
      first = "rank " + std::to_string(r) + " " + (e.empty() ? "never ended" : e);
  }
  std::printf("%s%s\n", all_failed ? "every waiting rank's allreduce failed in time; e.g. " : "", first.c_str());
  return all_failed ? 0 : 1;
}

}  // namespace dpcheck
