// The all-reduce schedules of reference/allreduce_schedule.hpp written a second way: N rank buffers
// and the messages of each algorithm, step by step, as a backend sends them -- the ring's
// reduce-scatter and all-gather, NCCL's trees from its own child formulas (ncclGetBtree), MPICH's
// recursive halving with its counts and displacements, Open MPI's basic_linear. emulate_allreduce
// computes each element's sum along the schedule's order; this follows the buffers. The two must give
// the same bits for every input, format, world and length: the schedule property holds them to it in
// every run (properties/schedule_bound.cpp), so that an emulation that drifts from the algorithm it
// names fails verify, not only a unit test.
#pragma once

#include <span>
#include <vector>

#include "reference/allreduce_schedule.hpp"

namespace dpcheck::reference {

// What every rank receives from the all-reduce of inputs[r] under options' schedule (a library's at
// the schedule it follows at this count), message by message. Its cost grows as N^2 times the length
// for the ring's all-gather: meant for worlds of a few hundred ranks at most.
std::vector<float> allreduce_by_messages(const ScheduleOptions& options, std::span<const std::vector<float>> inputs);

// The children of `rank` in tree 0 or 1 of NCCL's double binary tree over `world` ranks, from NCCL's own
// child formulas (a rank's children from its lowest set bit; tree 1 the mirror for N even, the shift by
// one rank for N odd): a and b, -1 where there is none. (double_binary_tree gives the parents, from the
// parent formulas.)
void nccl_tree_children(int world, int tree, int rank, int& a, int& b);

}  // namespace dpcheck::reference
