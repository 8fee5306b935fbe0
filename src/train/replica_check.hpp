// ReplicaCheck: after every step, every replica's parameters and optimizer state must be bitwise
// identical. Each rank hashes its own state with its engine's MemoryService (XXH3-64 on the CPU, the
// replica hash of kernels/hash.hpp on the GPU) and the hashes are all-gathered; only when they differ is the first
// differing element located (in place when the ranks share an address space -- threads, or replicas on one GPU -- else
// on gathered copies): its tensor and index, every rank's value (decimal and bits), the ULP distance from the majority,
// and which ranks are in the minority.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "src/comm.hpp"
#include "src/train/engine.hpp"
#include "src/train/loss_scaler.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck {

struct ReplicaReport {
  std::int64_t step = 0;
  bool synchronized = true;
  std::vector<std::uint64_t> hashes;          // one per rank
  std::string hash_name;                      // the function that made them: MemoryService::hash_name()
  std::vector<std::int64_t> optimizer_steps;  // one per rank
  // Simulated ranks (Communicator::simulated): one replica plays every rank, so there is nothing to
  // compare; hashes and optimizer_steps hold the one replica's.
  bool simulated = false;

  // Filled on a mismatch.
  std::string buffer;          // "parameters" or "optimizer state exp_avg", ...
  std::string element;         // "layers.0.weight[3, 1]"
  std::size_t flat_index = 0;  // index in the rank's concatenated parameters + state
  std::vector<float> values;   // one per rank
  std::vector<int> minority;   // ranks whose value differs from the most common one
  std::uint64_t max_ulp = 0;   // largest ULP distance from the most common value

  // One line when synchronized; otherwise the located difference over several lines.
  std::string describe() const;
};

// A collective: every rank must call it at the same step. Every rank receives the same report. With
// `scaler` (a run that scales its loss), the loss scaler's scale, counter and skipped steps must agree
// too: a rank that skipped a step the others took has left them for good.
ReplicaReport check_replicas(Communicator& comm, Engine& engine, Optimizer& optimizer, std::int64_t step,
                             const LossScalerState* scaler = nullptr);

// Distance in units in the last place between two floats (0 for +0 and -0; NaNs compare by bits).
std::uint64_t ulp_distance(float a, float b);
// The same for doubles: up to 2^64 - 2 (from the largest negative to the largest positive double).
std::uint64_t ulp_distance(double a, double b);

// The distance in units in the last place between two values of a sign-magnitude floating-point format
// `width` bits wide (16: fp16 or bf16, 32, 64), given as their bit patterns; 0 for +0 and -0.
std::uint64_t ulp_distance_bits(std::uint64_t a, std::uint64_t b, int width);

// The ranks' values of one element, as bit patterns: the most common one (on a tie, the lowest rank's
// among the tied), the ranks that hold another, and their largest distance from it (`distance` of two
// patterns: ULPs for a float, the difference for an integer).
struct ElementVote {
  std::size_t majority_rank = 0;
  std::vector<int> minority;
  std::uint64_t max_distance = 0;
};
ElementVote vote_element(std::span<const std::uint64_t> bits,
                         const std::function<std::uint64_t(std::uint64_t, std::uint64_t)>& distance);

// Text for a float with all the digits that identify it: "-0.401440024", "nan", "inf".
std::string float_text(double v);

// A float with every digit that identifies it and its bits: "-0.401440024 (0xbecd8a3f)".
std::string float_bits_text(float f);

}  // namespace dpcheck
