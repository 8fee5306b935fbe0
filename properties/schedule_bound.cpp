// allreduce_schedules_within_bound: the bound of an all-reduce, per schedule (reference/allreduce_schedule.hpp).
// A case draws a schedule, a format (float32, bfloat16, float16), sum or avg, a world of 1 to 8 ranks or
// of the scale class (63 to 4096) and the buffers, emulates the schedule bit for bit and holds every
// element of its result to gamma of the schedule's depth times the sum of the inputs' magnitudes, from
// the float64 sum. The buffers are spread over magnitudes and signs, or chains: one rank holds 1 and
// the ranks that meet its partial sum on the way hold half the format's spacing at 1, so that every
// addition on its way rounds down by all it can (chain_values builds it for each schedule). Over a run
// the largest ratio of the rings' chains and of the trees' must each reach kScheduleTightness, or the
// bound has grown looser than rounding needs.
//
// Every case also holds the emulation to the algorithm written message by message
// (reference/schedule_messages.hpp), bit for bit, in worlds up to 1024 ranks (the messages of 4096 cost
// seconds a case): an emulation that drifts from the algorithm it names -- the same depth and bound,
// other bits -- would judge a correct library wrong under conform --schedule, and the bound alone cannot
// see it. The bound's part holds the depth the gradient bound takes for a backend's schedule
// (reference::schedule_depth) to what the schedule's rounding does.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "reference/allreduce_schedule.hpp"
#include "reference/schedule_messages.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

using reference::AllreduceSchedule;
using reference::chunk_of;
using reference::ScheduleOptions;

// Half the spacing of the format's values at 1: 1 + h rounds to 1 (ties to even).
float half_spacing(Precision f) {
  switch (f) {
    case Precision::bf16: return 0x1p-8f;
    case Precision::fp16: return 0x1p-11f;
    default: return 0x1p-24f;
  }
}

// The chain of element i, as each rank's value in units: 1 where the element's partial sum starts, h
// (half a spacing) on each rank whose value or partial sum meets it on its way, 0 elsewhere, so that
// every addition on that way rounds an h away. `drawn` picks the start where the schedule leaves it
// open (trees, halving-doubling).
std::vector<float> chain_values(const ScheduleOptions& o, int world, std::size_t i, std::size_t count, int drawn,
                                float h) {
  const auto n = static_cast<std::size_t>(world);
  std::vector<float> v(n, 0.0f);
  switch (o.schedule) {
    case AllreduceSchedule::rank_order:
    case AllreduceSchedule::ring:
    case AllreduceSchedule::linear: {
      // Every other rank is added to the partial that starts at rank 0 (rank order), at the chunk's rank
      // (ring) or at the last rank (linear).
      std::fill(v.begin(), v.end(), h);
      v[o.schedule == AllreduceSchedule::ring     ? chunk_of(i, count, n)
        : o.schedule == AllreduceSchedule::linear ? n - 1
                                                  : 0] = 1.0f;
      break;
    }
    case AllreduceSchedule::hierarchical: {
      // The group that starts the element's chunk of the ring across groups holds the 1 where its own
      // ring's chunk starts and h on its other ranks; each other group one h.
      const auto g = std::min(n, static_cast<std::size_t>(o.group_size));
      const std::size_t groups = (n + g - 1) / g, first = chunk_of(i, count, groups) * g;
      const std::size_t size = std::min(g, n - first);
      for (std::size_t k = 0; k < groups; ++k) v[k * g] = h;
      for (std::size_t m = 0; m < size; ++m) v[first + m] = h;
      v[first + chunk_of(i, count, size)] = 1.0f;
      break;
    }
    case AllreduceSchedule::tree: {
      // Up tree 0 (the first half of the buffer) or tree 1: at each ancestor its own value, and its
      // higher child's sum when the way comes up through the lower child (a rank adds its own value, then
      // its lower child's sum, then its higher child's).
      const std::vector<int>& parent = reference::double_binary_tree(world).parent[i < (count + 1) / 2 ? 0 : 1];
      const int start = drawn;
      v[static_cast<std::size_t>(start)] = 1.0f;
      for (int child = start, a = parent[static_cast<std::size_t>(start)]; a >= 0;
           child = a, a = parent[static_cast<std::size_t>(a)]) {
        v[static_cast<std::size_t>(a)] = h;
        for (int r = child + 1; r < world; ++r)
          if (parent[static_cast<std::size_t>(r)] == a) v[static_cast<std::size_t>(r)] = h;
      }
      break;
    }
    case AllreduceSchedule::halving_doubling: {
      // p = the largest power of two up to N; rank 2j + 1 (j < N - p) first adds rank 2j, and becomes
      // rank j of the p; the others k >= 2 (N - p) become k - (N - p). At every level the partial holding
      // the 1 meets its partner's, which holds one h.
      std::size_t p = 1;
      while (p * 2 <= n) p *= 2;
      const std::size_t extra = n - p;
      const auto old_rank = [&](std::size_t s) { return s < extra ? 2 * s + 1 : s + extra; };
      const std::size_t s = static_cast<std::size_t>(drawn) % p;
      v[old_rank(s)] = 1.0f;
      if (s < extra) v[2 * s] = h;
      for (std::size_t bit = 1; bit < p; bit *= 2) v[old_rank(s ^ bit)] = h;
      break;
    }
  }
  return v;
}

// One case: the schedule and its format, the world, and two draws an element from which the buffers
// are made.
struct ScheduleCase {
  ScheduleOptions options;
  bool chain = false;
  int world = 1;
  std::vector<std::uint32_t> draws;  // two an element
  std::size_t count() const { return draws.size() / 2; }
  // "ring bf16 avg of 65 ranks, 3 elements, chains of half spacings"
  std::string describe() const {
    return reference::schedule_text(options) + " " + std::string(precision_name(options.format)) +
           (options.average ? " avg" : " sum") + " of " + std::to_string(world) + " ranks, " + std::to_string(count()) +
           (count() == 1 ? " element, " : " elements, ") +
           (chain ? "chains of half spacings" : "values spread over magnitudes");
  }
};

void showValue(const ScheduleCase& c, std::ostream& os) { os << c.describe(); }

// A world of 1 to 8 ranks, or of the scale class in one case of `one_in`. It shrinks to every smaller
// world, those of 1 to 8 first: a bug that 4 ranks show and 63 show too ends at 4, where three draws
// (the small world, the class, the large world) would shrink the unused small world to 1 first and keep
// the 63.
rc::Gen<int> gen_world(int one_in) {
  return [one_in](const rc::Random& random, int) {
    rc::Random r = random;
    const std::uint64_t small = r.next(), pick = r.next(), large = r.next();
    const std::vector<int>& worlds = scale_class_worlds();
    const int world = pick % static_cast<std::uint64_t>(one_in) == static_cast<std::uint64_t>(one_in - 1)
                          ? worlds[large % worlds.size()]
                          : static_cast<int>(1 + small % 8);
    return rc::shrinkable::shrinkRecur(world, [](int w) {
      std::vector<int> smaller;
      for (int s = 1; s < std::min(w, 9); ++s) smaller.push_back(s);
      for (const int s : scale_class_worlds())
        if (s < w) smaller.push_back(s);
      return rc::seq::fromContainer(std::move(smaller));
    });
  };
}

// A world from gen_world; up to 32 elements.
rc::Gen<ScheduleCase> gen_schedule_case(int one_in) {
  return rc::gen::exec([one_in] {
    ScheduleCase c;
    const auto schedules = reference::allreduce_schedules();
    c.options.schedule = schedules[*uniform(rc::gen::inRange<std::size_t>(0, schedules.size()))].schedule;
    c.options.format = *rc::gen::element(Precision::fp32, Precision::bf16, Precision::fp16);
    c.options.average = *rc::gen::element(false, true);
    c.options.group_size = *rc::gen::element(8, 4, 2);
    c.chain = *rc::gen::element(false, true);
    c.world = *gen_world(one_in);
    const auto count = *rc::gen::inRange<std::size_t>(1, 33);
    c.draws = *rc::gen::container<std::vector<std::uint32_t>>(count * 2, rc::gen::arbitrary<std::uint32_t>());
    return c;
  });
}

}  // namespace

void schedule_bound_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  // The scale class in one case of 4 (of 2 against a mutant of scale): no simulated ranks are needed,
  // the emulation is the schedule itself.
  const MutantInfo* mutant = find_mutant(target.mutant);
  ScheduleCase c = *gen_schedule_case(mutant && mutant->scale ? 2 : 4);
  mutant_schedule_options(target.mutant, c.options);
  const ScheduleOptions& o = c.options;
  const int world = c.world;
  const bool chain = c.chain;
  const std::size_t count = c.count();
  const std::vector<std::uint32_t>& draws = c.draws;
  record.size = {static_cast<std::int64_t>(count), world, 0, 0};

  // The buffers: value of rank r at element i from the draws (a counter-based mix, so that a world of
  // 4096 needs only two draws an element).
  std::vector<std::vector<float>> in(static_cast<std::size_t>(world), std::vector<float>(count));
  const float h = half_spacing(o.format);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t seed = draws[2 * i], shape = draws[2 * i + 1];
    const float sign = shape & 0x80000000u ? -1.0f : 1.0f;
    const std::vector<float> links =
        chain ? chain_values(o, world, i, count, static_cast<int>(shape % static_cast<std::uint32_t>(world)), h)
              : std::vector<float>();
    for (int r = 0; r < world; ++r) {
      float v = 0;
      if (chain) {
        v = sign * links[static_cast<std::size_t>(r)];
      } else {
        const std::uint64_t bits = mix_key(seed, static_cast<std::uint64_t>(r));
        const float mantissa = 1.0f + static_cast<float>(bits & 0xffffff) * 0x1p-24f;
        const int exponent = static_cast<int>((bits >> 24) % 13) - 6;
        v = ((bits >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
        if (o.format == Precision::fp16) v /= 64.0f;  // within fp16's range whatever the sum
      }
      in[static_cast<std::size_t>(r)][i] = round_to_precision(v, o.format);
    }
  }

  const std::vector<float> got = reference::emulate_allreduce(o, in);
  if (world <= 1024) {
    const std::vector<float> sent = reference::allreduce_by_messages(o, in);
    for (std::size_t i = 0; i < count; ++i)
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(sent[i])) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "the emulation of %s (%s %s of %d ranks, %s) leaves the algorithm's own messages at element "
                      "%zu: %.9g emulated, %.9g by its messages",
                      reference::schedule_text(o).c_str(), std::string(precision_name(o.format)).c_str(),
                      o.average ? "avg" : "sum", world, chain ? "a chain" : "spread values", i,
                      static_cast<double>(got[i]), static_cast<double>(sent[i]));
        fail_case(buf);
      }
  }
  double gamma = reference::schedule_gamma(o, world);
  mutant_schedule_gamma(target.mutant, o, world, gamma);
  // Below the normal range a rounding's error is absolute: the format's smallest spacing per rounding.
  const double floor = (o.format == Precision::fp16 ? 0x1p-24 : 0x1p-133) * static_cast<double>(world + 2);
  double worst = 0;
  std::size_t at = 0;
  double worst_exact = 0, worst_bound = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    for (const std::vector<float>& b : in) exact += b[i], magnitude += std::abs(static_cast<double>(b[i]));
    if (o.average) exact /= world, magnitude /= world;
    const double bound = gamma * magnitude + floor;
    const double ratio = std::abs(static_cast<double>(got[i]) - exact) / bound;
    if (ratio > worst || i == 0) worst = ratio, at = i, worst_exact = exact, worst_bound = bound;
  }
  record.ratio = worst;
  // Tightness from the chains alone: a ring's (rank order's, a hierarchy's) and a tree's (halving-
  // doubling's, a tree of pairs for each element), each judged over the run.
  const bool tree_like = o.schedule == AllreduceSchedule::tree || o.schedule == AllreduceSchedule::halving_doubling;
  if (chain) record.tightness[tree_like ? 1 : 0] = worst;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s %s %s of %d ranks (%s), element %zu: %.9g against the exact %.17g, error %.3g, bound %.3g",
                reference::schedule_text(o).c_str(), std::string(precision_name(o.format)).c_str(),
                o.average ? "avg" : "sum", world, chain ? "a chain" : "spread values", at, static_cast<double>(got[at]),
                worst_exact, std::abs(static_cast<double>(got[at]) - worst_exact), worst_bound);
  record.note = buf;
  RC_CLASSIFY(world > 8, "the scale class");
  RC_CLASSIFY(chain, "a chain of half spacings");
  if (worst > 1) fail_case(std::string("the all-reduce leaves its schedule's bound: ") + buf);
}

}  // namespace dpcheck
