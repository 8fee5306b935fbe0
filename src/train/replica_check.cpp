#include "src/train/replica_check.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "src/error.hpp"

namespace dpcheck {

std::uint64_t ulp_distance(float a, float b) {
  // Map the float bits onto a line where adjacent floats are adjacent integers.
  const auto ordered = [](float f) -> std::int64_t {
    const auto bits = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(f));
    return bits < 0 ? std::int64_t{INT32_MIN} - bits : bits;
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

std::uint64_t ulp_distance_bits(std::uint64_t a, std::uint64_t b, int width) {
  if (width == 64) return ulp_distance(std::bit_cast<double>(a), std::bit_cast<double>(b));
  // Narrower formats: the sign bit at width - 1, the rest the magnitude, as for float and double.
  const std::uint64_t sign = std::uint64_t{1} << (width - 1), mask = (sign << 1) - 1;
  const auto ordered = [&](std::uint64_t v) -> std::int64_t {
    v &= mask;
    const auto magnitude = static_cast<std::int64_t>(v & (sign - 1));
    return (v & sign) != 0 ? -magnitude : magnitude;
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

ElementVote vote_element(std::span<const std::uint64_t> bits,
                         const std::function<std::uint64_t(std::uint64_t, std::uint64_t)>& distance) {
  ElementVote v;
  std::map<std::uint64_t, int> votes;
  for (std::uint64_t b : bits) ++votes[b];
  for (std::size_t r = 0; r < bits.size(); ++r)
    if (votes[bits[r]] > votes[bits[v.majority_rank]]) v.majority_rank = r;
  for (std::size_t r = 0; r < bits.size(); ++r)
    if (bits[r] != bits[v.majority_rank]) {
      v.minority.push_back(static_cast<int>(r));
      v.max_distance = std::max(v.max_distance, distance(bits[r], bits[v.majority_rank]));
    }
  return v;
}

std::string float_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::uint64_t ulp_distance(double a, double b) {
  // As for floats, but the ordered values span nearly 2^64, so their difference is taken unsigned.
  const auto ordered = [](double f) -> std::int64_t {
    const auto bits = std::bit_cast<std::int64_t>(f);
    return bits < 0 ? std::numeric_limits<std::int64_t>::min() - bits : bits;
  };
  const std::int64_t oa = ordered(a), ob = ordered(b);
  const auto ua = static_cast<std::uint64_t>(oa), ub = static_cast<std::uint64_t>(ob);
  return oa >= ob ? ua - ub : ub - ua;
}

std::string float_bits_text(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), std::bit_cast<std::uint32_t>(f));
  return buf;
}

std::string ReplicaReport::describe() const {
  std::ostringstream os;
  if (synchronized) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hashes.empty() ? 0 : hashes[0]));
    if (simulated) os << "one replica for every rank (simulated ranks, " << hash_name << " " << buf << ")";
    else os << "replicas identical (" << hashes.size() << " ranks, " << hash_name << " " << buf << ")";
    return os.str();
  }
  os << "replicas differ after step " << step << ": first difference in " << buffer << " at " << element
     << " (flat index " << flat_index << ")\n";
  for (std::size_t r = 0; r < values.size(); ++r) {
    bool minor = false;
    for (int m : minority) minor |= static_cast<std::size_t>(m) == r;
    os << "  rank " << r << ": " << float_bits_text(values[r]) << (minor ? "  <- minority" : "") << "\n";
  }
  os << "  largest distance from the majority value: " << max_ulp << " ulp";
  bool steps_differ = false;
  for (std::int64_t s : optimizer_steps) steps_differ |= s != optimizer_steps.front();
  if (steps_differ) {
    os << "\n  optimizer step counts differ:";
    for (std::size_t r = 0; r < optimizer_steps.size(); ++r) os << " rank " << r << "=" << optimizer_steps[r];
  }
  return os.str();
}

namespace {

// The first index of the concatenated parameters and optimizer state where some rank's bits differ from
// rank 0's (parameters, then state), or the total size when none does. Ranks whose buffers share an
// address space (threads on the CPU, replicas on one GPU) compare in place against rank 0's buffers, on
// the engine's device; others (processes, or GPUs of their own) gather copies to the host.
std::size_t first_differing_element(Communicator& comm, Engine& engine, Optimizer& optimizer) {
  Communicator& host = comm.host();
  const MemoryService& memory = engine.memory();
  const std::size_t n = engine.param_count(), state = optimizer.state_size(), total = n + state;
  if (comm.shares_address_space()) {
    const std::vector<std::uint64_t> params = host.allgather_value(reinterpret_cast<std::uint64_t>(engine.params()));
    const std::vector<std::uint64_t> states = host.allgather_value(reinterpret_cast<std::uint64_t>(optimizer.state()));
    std::size_t mine = memory.first_difference(engine.params(), reinterpret_cast<const float*>(params[0]), n);
    if (mine == n)
      mine = n + memory.first_difference(optimizer.state(), reinterpret_cast<const float*>(states[0]), state);
    // No rank may change its buffers before every rank has compared: the gather below is that barrier.
    const std::vector<std::uint64_t> firsts = host.allgather_value<std::uint64_t>(mine);
    return static_cast<std::size_t>(*std::min_element(firsts.begin(), firsts.end()));
  }
  std::vector<float> mine(total);
  engine.store_params(std::span<float>(mine.data(), n));
  optimizer.store_state(std::span<float>(mine.data() + n, state));
  const auto world = static_cast<std::size_t>(host.size());
  std::vector<float> all(total * world);
  host.allgather(mine.data(), all.data(), total, DType::f32);
  for (std::size_t i = 0; i < total; ++i)
    for (std::size_t r = 1; r < world; ++r)
      if (std::bit_cast<std::uint32_t>(all[r * total + i]) != std::bit_cast<std::uint32_t>(all[i])) return i;
  return total;
}

}  // namespace

ReplicaReport check_replicas(Communicator& comm, Engine& engine, Optimizer& optimizer, std::int64_t step,
                             const LossScalerState* scaler) {
  Communicator& host = comm.host();
  // The optimizer's state is hashed, compared and copied with the engine's service: it must live beside
  // the parameters.
  const MemoryService& memory = engine.memory();
  DPCHECK_ASSERT(optimizer.memory_space() == memory.memory_space());
  ReplicaReport report;
  report.step = step;
  report.hash_name = memory.hash_name();
  engine.synchronize();
  const std::size_t n = engine.param_count();
  std::uint64_t h = memory.hash(engine.params(), n, static_cast<std::uint64_t>(optimizer.steps()));
  h = memory.hash(optimizer.state(), optimizer.state_size(), h);
  if (comm.simulated()) {
    report.simulated = true;
    report.hashes = {h};
    report.optimizer_steps = {optimizer.steps()};
    return report;
  }
  report.hashes = host.allgather_value<std::uint64_t>(h);
  report.optimizer_steps = host.allgather_value<std::int64_t>(optimizer.steps());
  for (std::uint64_t other : report.hashes) report.synchronized &= other == report.hashes.front();
  for (std::int64_t s : report.optimizer_steps) report.synchronized &= s == report.optimizer_steps.front();
  if (scaler) {
    const std::vector<float> scales = host.allgather_value<float>(scaler->scale);
    const std::vector<std::int64_t> trackers = host.allgather_value<std::int64_t>(scaler->growth_tracker);
    const std::vector<std::int64_t> skipped = host.allgather_value<std::int64_t>(scaler->skipped);
    bool same = true;
    for (std::size_t r = 0; r < scales.size(); ++r)
      same &= std::bit_cast<std::uint32_t>(scales[r]) == std::bit_cast<std::uint32_t>(scales[0]) &&
              trackers[r] == trackers[0] && skipped[r] == skipped[0];
    if (!same) {
      // The scaler is reported first: a rank that skipped alone also differs everywhere else.
      report.synchronized = false;
      report.buffer = "loss scaler";
      std::string text;
      for (std::size_t r = 0; r < scales.size(); ++r)
        text += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " scale " + float_text(scales[r]) +
                " after " + std::to_string(skipped[r]) + " skipped steps";
      report.element = text;
      report.values = scales;
      // The minority: ranks whose (scale, counter, skipped) differs from the most common one.
      const auto key = [&](std::size_t r) {
        return std::tuple(std::bit_cast<std::uint32_t>(scales[r]), trackers[r], skipped[r]);
      };
      std::map<std::tuple<std::uint32_t, std::int64_t, std::int64_t>, int> votes;
      for (std::size_t r = 0; r < scales.size(); ++r) ++votes[key(r)];
      std::size_t majority = 0;
      for (std::size_t r = 0; r < scales.size(); ++r)
        if (votes[key(r)] > votes[key(majority)]) majority = r;
      for (std::size_t r = 0; r < scales.size(); ++r)
        if (key(r) != key(majority)) report.minority.push_back(static_cast<int>(r));
      return report;
    }
  }
  if (report.synchronized) return report;

  // Locate the first element whose bits differ on any rank, then fetch just that element everywhere.
  const std::size_t total = n + optimizer.state_size();
  const std::size_t first = first_differing_element(comm, engine, optimizer);
  if (first == total) {
    // Hashes differed but no element did: only the step counts can differ.
    report.buffer = "optimizer step count";
    report.element = "steps";
    return report;
  }
  report.flat_index = first;
  const ParamLayout layout(engine.model());
  if (first < n) {
    report.buffer = "parameters";
    report.element = layout.describe_element(first);
  } else {
    const std::size_t block = (first - n) / n, in_block = (first - n) % n;
    report.buffer = "optimizer state " + optimizer.state_names()[block];
    report.element = layout.describe_element(in_block);
  }
  float mine = 0.0f;
  memory.copy_to_host(first < n ? engine.params() + first : optimizer.state() + (first - n), &mine, 1);
  report.values = host.allgather_value<float>(mine);

  std::vector<std::uint64_t> bits;
  for (float v : report.values) bits.push_back(std::bit_cast<std::uint32_t>(v));
  ElementVote vote = vote_element(bits, [](std::uint64_t a, std::uint64_t b) { return ulp_distance_bits(a, b, 32); });
  report.minority = std::move(vote.minority);
  report.max_ulp = vote.max_distance;
  return report;
}

}  // namespace dpcheck
