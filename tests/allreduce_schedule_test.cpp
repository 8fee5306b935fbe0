// The schedules' emulations (reference/allreduce_schedule.hpp) against the algorithms written message
// by message (reference/schedule_messages.hpp): both must give the same bits for any input, format,
// world size and length; and dpcheck's local backend gives the rank-order schedule's.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "reference/allreduce_schedule.hpp"
#include "reference/schedule_messages.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"

namespace dpcheck::reference {
namespace {

using Buffers = std::vector<std::vector<float>>;

// Values of the format over many magnitudes and both signs, so that the order of the additions shows
// in the last bits.
Buffers draw(int world, std::size_t n, Precision f, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-6, 6), sign(0, 1);
  Buffers in(static_cast<std::size_t>(world), std::vector<float>(n));
  for (auto& b : in)
    for (float& v : b) v = round_to_precision((sign(rng) ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), exponent(rng)), f);
  return in;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

TEST(AllreduceSchedule, EveryEmulationGivesTheBitsOfTheAlgorithmStepByStep) {
  const int worlds[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 31, 64, 65};
  std::uint64_t seed = 1;
  int compared = 0;
  for (const ScheduleRow& row : allreduce_schedules())
    for (const Precision f : {Precision::fp32, Precision::bf16, Precision::fp16})
      for (const int world : worlds)
        for (const std::size_t n :
             {std::size_t(world) - 1, std::size_t(world), std::size_t(world) + 1, std::size_t{37}, std::size_t{200}})
          for (const bool average : {false, true}) {
            ScheduleOptions o;
            o.schedule = row.schedule;
            o.format = f;
            o.average = average;
            o.group_size = 1 + static_cast<int>(seed % 5);
            o.slice_elements = seed % 3 == 0 ? 0 : std::size_t(world) * (1 + seed % 4);
            const Buffers in = draw(world, n, f, seed++);
            const std::vector<float> got = emulate_allreduce(o, in), want = allreduce_by_messages(o, in);
            ASSERT_TRUE(same_bits(got, want))
                << row.name << " " << precision_name(f) << " on " << world << " ranks, " << n << " elements"
                << (average ? ", avg" : "") << ", group " << o.group_size << ", slice " << o.slice_elements;
            ++compared;
          }
  EXPECT_EQ(compared, 6 * 3 * 16 * 5 * 2);
}

// The comparison above can fail: the schedules round differently, so each one's bits differ from every
// other's on some input (here at 12 ranks in bfloat16, where every schedule has a different grouping).
TEST(AllreduceSchedule, TheSchedulesGiveDifferentBits) {
  ScheduleOptions o;
  o.format = Precision::bf16;
  o.group_size = 4;
  const Buffers in = draw(12, 400, o.format, 7);
  std::vector<std::vector<float>> results;
  for (const ScheduleRow& row : allreduce_schedules()) {
    o.schedule = row.schedule;
    results.push_back(emulate_allreduce(o, in));
  }
  for (std::size_t a = 0; a < results.size(); ++a)
    for (std::size_t b = a + 1; b < results.size(); ++b)
      EXPECT_FALSE(same_bits(results[a], results[b]))
          << allreduce_schedules()[a].name << " and " << allreduce_schedules()[b].name << " agree on every element";
}

// A library schedule follows its own schedule from its switch's count up and the one it hands calls to
// below it: Open MPI's ring below N elements, its Rabenseifner below the largest power of two up to N.
TEST(AllreduceSchedule, LibrarySchedulesSwitchWhereTheLibraryDoes) {
  struct Want {
    const char* name;
    int world;
    std::size_t first_own;  // the smallest count at which the library's own schedule runs
    AllreduceSchedule own, below;
  };
  for (const Want& w :
       {Want{"open-mpi-ring", 4, 4, AllreduceSchedule::ring, AllreduceSchedule::halving_doubling},
        Want{"open-mpi-ring", 7, 7, AllreduceSchedule::ring, AllreduceSchedule::halving_doubling},
        Want{"open-mpi-rabenseifner", 8, 8, AllreduceSchedule::halving_doubling, AllreduceSchedule::linear},
        Want{"open-mpi-rabenseifner", 7, 4, AllreduceSchedule::halving_doubling, AllreduceSchedule::linear}})
    for (std::size_t count = 1; count < 20; ++count) {
      ScheduleOptions o = parse_schedule(w.name);
      ASSERT_NE(o.library, nullptr) << w.name;
      EXPECT_EQ(schedule_text(o), w.name);
      o.format = Precision::bf16;
      const Buffers in = draw(w.world, count, o.format, 40 + count);
      ScheduleOptions plain;
      plain.format = o.format;
      plain.schedule = count < w.first_own ? w.below : w.own;
      EXPECT_TRUE(same_bits(emulate_allreduce(o, in), emulate_allreduce(plain, in)))
          << w.name << " on " << w.world << " ranks, " << count << " elements";
      EXPECT_EQ(schedule_at(o, w.world, count).schedule, plain.schedule) << w.name << " " << count;
      EXPECT_EQ(switch_text(o, w.world), "below " + std::to_string(w.first_own) + " elements");
    }
  // Its depth is the deeper of the two: Rabenseifner's linear below p is N - 1 deep.
  EXPECT_EQ(schedule_depth(parse_schedule("open-mpi-rabenseifner"), 8).format, 7);
  EXPECT_EQ(schedule_depth(parse_schedule("open-mpi-ring"), 8).format, 7);
  EXPECT_THROW(parse_schedule("open-mpi-ring:4"), UsageError);
}

// NCCL's own pictures of the double binary tree (src/graph/trees.cc): 12 ranks mirrored, 13 shifted.
TEST(AllreduceSchedule, TheDoubleBinaryTreeIsNcclsShape) {
  const DoubleTree even = double_binary_tree(12);
  EXPECT_EQ(even.parent[0], (std::vector<int>{-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 8, 10}));
  EXPECT_EQ(even.parent[1], (std::vector<int>{1, 3, 1, 11, 5, 7, 5, 3, 9, 7, 9, -1}));
  const DoubleTree odd = double_binary_tree(13);
  EXPECT_EQ(odd.parent[0], (std::vector<int>{-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8}));
  EXPECT_EQ(odd.parent[1], (std::vector<int>{9, -1, 3, 5, 3, 9, 7, 5, 7, 1, 11, 0, 11}));
}

TEST(AllreduceSchedule, TheLocalBackendReducesInRankOrder) {
  for (const int world : {2, 3, 5, 8})
    for (const Precision f : {Precision::fp32, Precision::bf16}) {
      const Buffers in = draw(world, 101, f, 100 + world);
      ScheduleOptions o;
      o.format = f;
      const std::vector<float> want = emulate_allreduce(o, in);
      std::mutex mu;
      run_local(world, [&](Communicator& c) {
        std::vector<float> got(in[c.rank()].size());
        if (f == Precision::fp32) {
          got = in[c.rank()];
          c.allreduce(got.data(), got.size(), DType::f32, ReduceOp::sum);
        } else {
          std::vector<std::uint16_t> bits(got.size());
          for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16_bits(in[c.rank()][i]);
          c.allreduce(bits.data(), bits.size(), DType::bf16, ReduceOp::sum);
          for (std::size_t i = 0; i < bits.size(); ++i) got[i] = bf16_bits_to_float(bits[i]);
        }
        const std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(same_bits(got, want)) << "rank " << c.rank() << " of " << world << " in " << precision_name(f);
      });
    }
}

// ---- depth and bound ---------------------------------------------------------------------------------

// The roundings on the deepest path of tree `tree`'s partial sum at `rank`, from the test's own child
// formulas: each child's partial sum is added, and rounded, in turn.
std::int64_t tree_depth(int world, int tree, int rank) {
  int a = -1, b = -1;
  nccl_tree_children(world, tree, rank, a, b);
  if (a > b) std::swap(a, b);
  std::int64_t acc = 0;
  for (const int child : {a, b})
    if (child >= 0) acc = std::max(acc, tree_depth(world, tree, child)) + 1;
  return acc;
}

ScheduleOptions schedule_of(AllreduceSchedule s, Precision f, bool average = false, int group = 8) {
  ScheduleOptions o;
  o.schedule = s;
  o.format = f;
  o.average = average;
  o.group_size = group;
  return o;
}

TEST(AllreduceSchedule, EachScheduleHasTheDepthOfItsShape) {
  using S = AllreduceSchedule;
  const auto depth = [](S s, int world, int group = 8) {
    return schedule_depth(schedule_of(s, Precision::bf16, false, group), world).format;
  };
  for (const int world : {1, 2, 3, 5, 8, 64, 1000, 4096, 65536}) {
    EXPECT_EQ(depth(S::rank_order, world), 1) << world;
    EXPECT_EQ(schedule_depth(schedule_of(S::rank_order, Precision::bf16), world).float32, world - 1) << world;
    EXPECT_EQ(depth(S::ring, world), world - 1) << world;
  }
  // Halving-doubling: log2 of the largest power of two, and one more for the pairs folded first.
  EXPECT_EQ(depth(S::halving_doubling, 1), 0);
  EXPECT_EQ(depth(S::halving_doubling, 2), 1);
  EXPECT_EQ(depth(S::halving_doubling, 6), 3);
  EXPECT_EQ(depth(S::halving_doubling, 8), 3);
  EXPECT_EQ(depth(S::halving_doubling, 4096), 12);
  EXPECT_EQ(depth(S::halving_doubling, 65535), 16);
  EXPECT_EQ(depth(S::halving_doubling, 65536), 16);
  // Hierarchical: a ring in a group, then a ring across the groups.
  EXPECT_EQ(depth(S::hierarchical, 10, 4), 3 + 2);
  EXPECT_EQ(depth(S::hierarchical, 4096, 8), 7 + 511);
  EXPECT_EQ(depth(S::hierarchical, 3, 8), 2);
  // The tree, against the depth of the test's own trees, for every world size to 300 and a few beyond.
  std::vector<int> worlds;
  for (int w = 1; w <= 300; ++w) worlds.push_back(w);
  for (const int w : {1000, 1023, 1024, 1025, 4095, 4096}) worlds.push_back(w);
  for (const int world : worlds) {
    const int roots[2] = {0, world % 2 == 1 ? (world > 1 ? 1 : 0) : world - 1};
    const std::int64_t want = std::max(tree_depth(world, 0, roots[0]), tree_depth(world, 1, roots[1]));
    ASSERT_EQ(depth(S::tree, world), want) << world;
  }
  // About twice log2 N: a rank adds its two children one after the other.
  EXPECT_LE(depth(S::tree, 4096), 2 * 12);
  EXPECT_LE(depth(S::tree, 65536), 2 * 16);
  // avg divides once more: in float32, then rounded to the format (but for rank-order, which rounds once).
  const ScheduleDepth ring_avg = schedule_depth(schedule_of(S::ring, Precision::bf16, true), 8);
  EXPECT_EQ(ring_avg.format, 8);
  EXPECT_EQ(ring_avg.float32, 1);
  const ScheduleDepth rank_avg = schedule_depth(schedule_of(S::rank_order, Precision::bf16, true), 8);
  EXPECT_EQ(rank_avg.format, 1);
  EXPECT_EQ(rank_avg.float32, 8);
  EXPECT_EQ(schedule_depth(schedule_of(S::rank_order, Precision::fp32, true), 8).format, 0);
}

// Every schedule's result stays within gamma of its depth times the sum of the inputs' magnitudes of the
// exact sum, for inputs over many magnitudes and both signs, in every format, at world sizes up to 4096;
// and the bound is not slack where it is worth having: summing 1 and N - 1 halves of its spacing, each
// addition of a chain rounds down by all it can, which reaches (1 - (N - 1) u) / (1 + (N - 1) u) of the
// ring's bound: over three quarters up to 32 ranks.
TEST(AllreduceSchedule, EveryScheduleStaysWithinTheBoundOfItsDepth) {
  std::uint64_t seed = 11;
  for (const Precision f : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (const int world : {2, 3, 7, 8, 31, 64, 65, 255, 256, 1000, 4096})
      for (const ScheduleRow& row : allreduce_schedules())
        for (const bool average : {false, true}) {
          const ScheduleOptions o = schedule_of(row.schedule, f, average, 8);
          const std::size_t n = world >= 1000 ? 16 : 64;
          Buffers in = draw(world, n, f, ++seed);
          if (f == Precision::fp16)  // within fp16's range whatever the sum
            for (auto& b : in)
              for (float& v : b) v = round_to_precision(v / 64.0f, f);
          const std::vector<float> got = emulate_allreduce(o, in);
          const double g = schedule_gamma(o, world);
          for (std::size_t i = 0; i < n; ++i) {
            double exact = 0, magnitude = 0;
            for (const auto& b : in) exact += b[i], magnitude += std::abs(b[i]);
            if (average) exact /= world, magnitude /= world;
            // Below the normal range a rounding's error is absolute: the format's smallest spacing per rounding.
            const double floor = (f == Precision::fp16 ? 0x1p-24 : 0x1p-133) * static_cast<double>(world + 2);
            ASSERT_LE(std::abs(got[i] - exact), g * magnitude + floor)
                << row.name << " " << precision_name(f) << " N=" << world << (average ? " avg" : " sum") << " element "
                << i;
          }
        }
  for (const int world : {2, 8, 32}) {
    Buffers in(static_cast<std::size_t>(world), std::vector<float>(1, 0x1p-8f));  // half of bf16's spacing at 1
    in[0][0] = 1.0f;
    const ScheduleOptions o = schedule_of(AllreduceSchedule::ring, Precision::bf16);
    const float got = emulate_allreduce(o, in)[0];  // chunk 0 starts at rank 0: 1, then each half spacing lost
    const double exact = 1.0 + (world - 1) * 0x1p-8;
    const double bound = schedule_gamma(o, world) * exact;
    EXPECT_EQ(got, 1.0f) << world;
    EXPECT_GE((exact - got) / bound, 0.75) << world;
  }
}

// The tree's bound is not slack either. Element 0 goes up tree 0; a chain puts 1 on one rank and, on
// its way to the root, half bf16's spacing h where it meets the partial sum at each ancestor: the
// ancestor's own value (added to the lower child's sum first), and when the chain comes up through the
// lower child, the higher child's subtree too (its root holds h). Every such addition rounds the h away
// (ties to even), so the error is h times the additions on the path. Over every rank as the chain's
// start, the largest error reaches over three quarters of the bound of the tree's depth (0.96 at 8
// ranks, 0.86 at 1000: the depth counts two additions a level, where a path up through a higher child
// has one).
TEST(AllreduceSchedule, TheTreesBoundIsReachedByAChainUpItsDeepestPath) {
  const float h = 0x1p-8f;
  for (const int world : {8, 13, 64, 1000}) {
    const ScheduleOptions o = schedule_of(AllreduceSchedule::tree, Precision::bf16);
    const std::vector<int>& parent = double_binary_tree(world).parent[0];
    double best = 0;
    for (int start = 0; start < world; ++start) {
      Buffers in(static_cast<std::size_t>(world), std::vector<float>(1, 0.0f));
      in[static_cast<std::size_t>(start)][0] = 1.0f;
      std::size_t halves = 0;
      for (int child = start, a = parent[static_cast<std::size_t>(start)]; a >= 0;
           child = a, a = parent[static_cast<std::size_t>(a)]) {
        in[static_cast<std::size_t>(a)][0] = h, ++halves;
        // The higher-ranked child of a, when the chain comes up through the lower one: its own h.
        int higher = -1;
        for (int r = 0; r < world; ++r)
          if (parent[static_cast<std::size_t>(r)] == a && r != child && r > child) higher = r;
        if (higher >= 0) in[static_cast<std::size_t>(higher)][0] = h, ++halves;
      }
      const float got = emulate_allreduce(o, in)[0];
      const double exact = 1.0 + static_cast<double>(halves) * h;
      best = std::max(best, (exact - got) / (schedule_gamma(o, world) * exact));
    }
    EXPECT_GE(best, 0.75) << world;
    std::printf("tree N=%d: %.3f of the bound\n", world, best);
    EXPECT_LE(best, 1.0) << world;
  }
}

TEST(AllreduceSchedule, NamesAreOneEachAndAnUnknownOneIsRefused) {
  for (const ScheduleRow& row : allreduce_schedules()) EXPECT_EQ(find_schedule(row.name).schedule, row.schedule);
  try {
    (void)find_schedule("butterfly");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--schedule butterfly: no such schedule (choose rank-order, ring, tree, halving-doubling, hierarchical, "
              "linear, "
              "open-mpi-ring, open-mpi-rabenseifner)");
  }
}

}  // namespace
}  // namespace dpcheck::reference
