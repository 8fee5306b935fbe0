// All-reduce schedules, emulated bit for bit. A schedule is the order in which an all-reduce adds the
// ranks' buffers: which partial sums meet at which hop, and where each is rounded to the buffers'
// format (float32, bfloat16 or float16: an addition is done in float32 and rounded to the format, as
// a kernel that widens its 16-bit inputs does). Floating-point addition is commutative but not
// associative, so a schedule fixes the bits of the result, and two backends with the same schedule
// give the same bits. Each schedule here is a function from the N rank buffers to the one buffer every
// rank receives:
//
//   rank-order        ((x0 + x1) + x2) + ... in float32, rounded to the format once at the end: dpcheck's
//                     own host backends (local, mpi; src/comm/collective.hpp).
//   ring              the buffer cut into N chunks (the first count % N one element longer); chunk c
//                     starts at rank c and gathers x(c+1), x(c+2), ... around the ring, each partial
//                     sum rounded as it is passed on (the reduce-scatter of a ring all-reduce, as the
//                     comm_ring example and NCCL's ring do it); long buffers in slices of
//                     slice_elements, each cut into N chunks of its own.
//   tree              NCCL's double binary tree: the first half of the buffer (rounded up) reduced up
//                     the binary tree of nccl's src/graph/trees.cc (root 0; a rank's parent is found by
//                     flipping its lowest set bit and setting the next), the second half up its mirror
//                     (N even) or its shift by one rank (N odd). A rank's partial sum is its own value
//                     plus its children's, the lower-ranked child first.
//   halving-doubling  Rabenseifner's reduce-scatter by recursive halving then all-gather by recursive
//                     doubling, as MPICH and Gloo implement it: with p the largest power of two up to N
//                     and r = N - p, rank 2i + 1 first adds rank 2i's buffer (i < r); the p remaining
//                     partial sums then meet in pairs that differ in bit 0 of their new rank, then bit
//                     1, and so on.
//   hierarchical      the ranks in groups of group_size consecutive ranks (the last may be smaller): a
//                     ring within each group, then a ring across the groups' sums.
//   linear            ((x(N-1) + x(N-2)) + ...) + x0, each addition rounded to the format: a linear reduce
//                     to rank 0 that starts from the last rank (Open MPI's basic_linear, whose reduce
//                     receives from rank N - 1 first and folds each lower rank into what it holds).
//
// A library's algorithm may hand some calls to another algorithm: Open MPI's ring takes a call of fewer
// elements than ranks to recursive doubling, its Rabenseifner one of fewer elements than the largest
// power of two up to N to basic_linear (ompi/mca/coll/base/coll_base_allreduce.c, 4.1.x). The library
// schedules (library_schedules()) model those switches: a schedule, the count below which the call goes
// elsewhere, and the schedule it goes to.
//
// For avg the sum is divided by N in float32 and rounded to the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/low_precision.hpp"

namespace dpcheck::reference {

enum class AllreduceSchedule { rank_order, ring, tree, halving_doubling, hierarchical, linear };

struct ScheduleRow {
  AllreduceSchedule schedule;
  std::string_view name;  // as --schedule takes it
  std::string_view help;
};
// Every schedule, in the order above.
std::span<const ScheduleRow> allreduce_schedules();
// The row named `name`; UsageError naming --schedule and the names otherwise.
const ScheduleRow& find_schedule(std::string_view name);
std::string_view schedule_name(AllreduceSchedule s);

// Where a library hands a call to another algorithm: never, below N elements, or below the largest
// power of two up to N.
enum class SwitchRule { none, count_below_world, count_below_pof2 };

struct LibrarySchedule {
  std::string_view name;       // as --schedule takes it: "open-mpi-ring"
  AllreduceSchedule schedule;  // what the algorithm follows
  SwitchRule rule;
  AllreduceSchedule below;  // what the calls the rule takes away follow
  std::string_view help;    // the switch, and where the library's source makes it
};
// The library schedules, each a library's algorithm with its switch.
std::span<const LibrarySchedule> library_schedules();

struct ScheduleOptions {
  AllreduceSchedule schedule = AllreduceSchedule::rank_order;
  Precision format = Precision::fp32;        // the buffers' format
  bool average = false;                      // avg instead of sum
  int group_size = 8;                        // hierarchical: ranks per group
  std::size_t slice_elements = 0;            // ring: elements per slice (0: the whole buffer is one)
  const LibrarySchedule* library = nullptr;  // a library's algorithm: `schedule` is its own, with its switch
  // halving-doubling's pairs differ in bit 0 of their new ranks first, as MPICH's and Gloo's do. Off only
  // in the mutant that pairs the highest bit first (the same depth and bound, other bits), which the
  // schedule property's comparison with the messages catches.
  bool halving_from_lowest_bit = true;
};

// The schedule that a call of `count` elements on `world` ranks follows: options itself, or, where a
// library's switch takes the call, the schedule it goes to (with the same format and op).
ScheduleOptions schedule_at(const ScheduleOptions& options, int world, std::size_t count);
// "below 4 elements" for a library schedule's switch on `world` ranks; "" where it has none.
std::string switch_text(const ScheduleOptions& options, int world);

// --schedule's text: a schedule's name, a library schedule's, or "hierarchical:G" for groups of G ranks
// (8 without).
// UsageError naming --schedule otherwise.
ScheduleOptions parse_schedule(std::string_view text);
// The text that parse_schedule reads back: "ring", "hierarchical:4".
std::string schedule_text(const ScheduleOptions& options);

// The chunk of element i when n elements are cut into `parts` chunks, the first n % parts one longer
// (a ring's chunks, within a group and across groups too).
std::size_t chunk_of(std::size_t i, std::size_t n, std::size_t parts);

// What every rank receives from an all-reduce of inputs[r], rank r's buffer (all of one length, each
// value one of the format's), under the schedule.
std::vector<float> emulate_allreduce(const ScheduleOptions& options, std::span<const std::vector<float>> inputs);

// The roundings that one rank's value meets on its way into an element of the result, on the deepest
// path of the schedule: to the buffers' format (each of the schedule's additions; avg's division, for
// a 16-bit format) and to float32 (rank-order's additions, which are float32's; avg's division). An
// element is then within gamma of their unit roundoffs' sum times the sum of the inputs' magnitudes
// (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 4.2), so that
//   rank-order        format 1 (none in float32), float32 N - 1
//   ring              format N - 1
//   tree              twice the trees' height at most: a rank adds its children one at a time
//   halving-doubling  log2 p, plus 1 where N is not a power of two p
//   hierarchical      (G - 1) + (groups - 1)
//   linear            format N - 1
// and avg adds one of each (one only, in float32). A library schedule: the deeper of its two.
struct ScheduleDepth {
  std::int64_t format = 0;
  std::int64_t float32 = 0;
};
ScheduleDepth schedule_depth(const ScheduleOptions& options, int world);
// That gamma: n u / (1 - n u), n u being the sum of the depth's unit roundoffs; +infinity once n u >= 1.
double schedule_gamma(const ScheduleOptions& options, int world);

// How far a schedule's result falls from the exact sum over many elements, in units of each element's
// sum of magnitudes (divided by N for avg): the scale of the bound, which is gamma of the depth's unit
// roundoffs there whatever the inputs. Measured against the float64 sum of the same inputs.
struct ScheduleError {
  double max = 0;    // the largest over the elements
  double mean = 0;   // the mean over them
  double bound = 0;  // schedule_gamma
};
ScheduleError measure_schedule_error(const ScheduleOptions& options, std::span<const std::vector<float>> inputs);

// NCCL's double binary tree over `world` ranks: the parent of each rank in tree 0 and tree 1 (-1 for
// a root).
struct DoubleTree {
  std::vector<int> parent[2];
};
DoubleTree double_binary_tree(int world);

}  // namespace dpcheck::reference
