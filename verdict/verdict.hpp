// What every check shares (properties/, conform/, divergence/ and a PyTorch job's checks in python/):
// one verdict across the processes of a world, which rank records a world's results, and a result held
// against its formula element by element. Implemented in verdict.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "src/comm.hpp"
#include "src/target/target.hpp"

namespace dpcheck {

// A check's verdict must be the same on every process of a process backend, so that all follow the
// same shrink path: the AND over processes (the verdict itself for thread backends).
bool agree(const Target& target, bool verdict);

// Whether this rank records the results of a world: rank 0's thread, or every process.
bool records(const Target& target, const Communicator& comm);

// The element whose |got - want| / bound is largest (a non-finite `got`: infinite), kept in `worst` when
// it is larger than what `worst` holds: its ratio, its index and "<what> <element(i)> is <value>, the
// formula gives <want> (error, bound, error ratio)".
struct WorstElement {
  double ratio = 0;
  std::string where;
  std::size_t index = 0;
};
void worst_against_formula(std::span<const float> got, const std::vector<double>& want,
                           const std::vector<double>& bound, const std::string& what,
                           const std::function<std::string(std::size_t)>& element, WorstElement& worst);

}  // namespace dpcheck
