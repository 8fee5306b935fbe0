#include "divergence/trace.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck {

namespace {

constexpr std::size_t kLanes = 16;

// m elements (a multiple of kLanes) into per-lane sums, largest magnitudes and non-finite counts,
// without a branch, so that the compiler keeps the lanes in vector registers: a NaN or an infinity
// (exponent bits all ones) is masked to zero and counted.
void summarize_block(const float* p, std::size_t m, float* acc, float* most, std::int32_t* bad) {
  for (std::size_t i = 0; i < m; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(p[i + l]);
      const std::uint32_t keep = (bits & 0x7f800000u) == 0x7f800000u ? 0u : 0xffffffffu;
      acc[l] += std::bit_cast<float>(bits & keep);
      const float a = std::bit_cast<float>(bits & keep & 0x7fffffffu);
      most[l] = most[l] > a ? most[l] : a;
      bad[l] += static_cast<std::int32_t>(keep & 1u) ^ 1;
    }
}

}  // namespace

TensorSummary summarize(std::span<const float> values) {
  TensorSummary s;
  s.digest = hash_bytes(values.data(), values.size_bytes());
  // Each block of 1024 elements is summed in float lanes and folded into a double, so that the sum of
  // a large tensor does not lose its small terms.
  constexpr std::size_t kBlock = 1024;
  float most[kLanes] = {};
  std::int32_t bad[kLanes] = {};
  double sum = 0;
  const float* p = values.data();
  const std::size_t n = values.size(), whole = n - n % kLanes;
  for (std::size_t i = 0; i < whole; i += kBlock) {
    float acc[kLanes] = {};
    summarize_block(p + i, std::min(kBlock, whole - i), acc, most, bad);
    for (std::size_t l = 0; l < kLanes; ++l) sum += acc[l];
  }
  float top = 0;
  std::int64_t non_finite = 0;
  for (std::size_t l = 0; l < kLanes; ++l) {
    top = std::max(top, most[l]);
    non_finite += bad[l];
  }
  for (std::size_t i = whole; i < n; ++i) {
    const float a = std::fabs(p[i]);
    if (!(a <= std::numeric_limits<float>::max())) {
      ++non_finite;
      continue;
    }
    sum += p[i];
    top = std::max(top, a);
  }
  s.sum = sum;
  s.max_abs = top;
  s.non_finite = non_finite;
  return s;
}

std::string digest_hex(std::uint64_t digest) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

nlohmann::json to_json(const TensorSummary& s) {
  return {{"digest", digest_hex(s.digest)}, {"max_abs", s.max_abs}, {"sum", s.sum}, {"non_finite", s.non_finite}};
}

namespace {

nlohmann::json to_json(const std::vector<TensorSummary>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const TensorSummary& s : v) a.push_back(to_json(s));
  return a;
}

}  // namespace

TraceRecorder::TraceRecorder(const ModelConfig& model, std::vector<std::string> state_names)
    : layout_(model), state_names_(std::move(state_names)) {}

std::vector<TensorSummary> TraceRecorder::tensors(const float* flat, std::size_t n) const {
  DPCHECK_ASSERT(n >= layout_.size());
  std::vector<TensorSummary> out;
  out.reserve(layout_.slices().size());
  for (const Slice& s : layout_.slices()) {
    out.push_back(summarize({flat + s.offset, s.size()}));
    if (prefix_digest_) out.back().digest = hash_bytes(flat + s.offset, s.size());
  }
  return out;
}

void TraceRecorder::local_gradient(Trainer& trainer, std::int64_t step, double, std::int64_t) {
  const std::vector<std::int64_t> idx = trainer.local_indices(step);
  indices_count_ = static_cast<std::int64_t>(idx.size());
  indices_digest_ = hash_bytes(idx.data(), idx.size() * (prefix_digest_ ? 1 : sizeof(std::int64_t)));
  local_ = gradient_tensors(trainer.engine());
}

void TraceRecorder::reduced_gradient(Trainer& trainer, std::int64_t) { reduced_ = gradient_tensors(trainer.engine()); }

std::vector<TensorSummary> TraceRecorder::gradient_tensors(Engine& e) {
  if (e.memory_space() == MemorySpace::host) return tensors(e.grads(), e.param_count());
  host_.resize(e.param_count());
  e.store_grads(host_);
  return tensors(host_.data(), host_.size());
}

void TraceRecorder::updated(Trainer& trainer, std::int64_t) {
  Engine& e = trainer.engine();
  Optimizer& o = trainer.optimizer();
  const std::size_t n = e.param_count();
  state_.assign(state_names_.size(), {});
  if (e.memory_space() == MemorySpace::host && o.memory_space() == MemorySpace::host) {
    params_ = tensors(e.params(), n);
    for (std::size_t b = 0; b < state_names_.size(); ++b) state_[b] = tensors(o.state() + b * n, n);
    return;
  }
  host_.resize(n);
  e.store_params(host_);
  params_ = tensors(host_.data(), n);
  if (!state_names_.empty()) {
    std::vector<float> state(o.state_size());
    o.store_state(state);
    for (std::size_t b = 0; b < state_names_.size(); ++b) state_[b] = tensors(state.data() + b * n, n);
  }
}

nlohmann::json TraceRecorder::rank_part(int rank) const {
  nlohmann::json state = nlohmann::json::array();
  for (const auto& block : state_) state.push_back(to_json(block));
  nlohmann::json calls = nlohmann::json::array();
  for (const CollectiveRecord& c : calls_) {
    nlohmann::json j = {{"seq", c.seq},     {"call", c.call},         {"dtype", dtype_name(c.dtype)},
                        {"count", c.count}, {"in", digest_hex(c.in)}, {"out", digest_hex(c.out)}};
    if (!c.op.empty()) j["op"] = c.op;
    calls.push_back(std::move(j));
  }
  return {{"rank", rank},
          {"indices", {{"count", indices_count_}, {"digest", digest_hex(indices_digest_)}}},
          {"local_grad", to_json(local_)},
          {"reduced_grad", to_json(reduced_)},
          {"params", to_json(params_)},
          {"state", std::move(state)},
          {"collectives", std::move(calls)}};
}

nlohmann::json TraceRecorder::finish_step(Communicator& host, std::int64_t step, nlohmann::json extra) {
  const std::vector<std::string> parts = allgather_strings(host, rank_part(host.rank()).dump());
  // A step that a check stopped part way leaves the phases it did not reach empty, not last step's.
  calls_.clear();
  local_.clear();
  reduced_.clear();
  params_.clear();
  state_.clear();
  indices_count_ = 0;
  indices_digest_ = 0;
  if (host.rank() != 0) return nullptr;
  nlohmann::json line = {{"step", step}};
  for (auto& [key, value] : extra.items()) line[key] = value;
  // Every rank makes the same calls in the same order (a rank that does not is itself a finding): the
  // line lists each call once, from rank 0's record, with every rank's digests.
  nlohmann::json ranks = nlohmann::json::array();
  nlohmann::json collectives = nlohmann::json::array();
  for (std::size_t r = 0; r < parts.size(); ++r) {
    nlohmann::json part = nlohmann::json::parse(parts[r]);
    nlohmann::json calls = std::move(part["collectives"]);
    part.erase("collectives");
    for (std::size_t k = 0; k < calls.size(); ++k) {
      if (k >= collectives.size()) {
        nlohmann::json c = calls[k];
        c.erase("in");
        c.erase("out");
        c["ranks"] = nlohmann::json::array();
        collectives.push_back(std::move(c));
      }
      nlohmann::json mine = {{"in", calls[k]["in"]}, {"out", calls[k]["out"]}};
      for (const char* key : {"call", "op", "dtype", "count"})
        if (calls[k].value(key, nlohmann::json()) != collectives[k].value(key, nlohmann::json()))
          mine[key] = calls[k][key];
      while (collectives[k]["ranks"].size() < r) collectives[k]["ranks"].push_back(nullptr);  // a rank that skipped it
      collectives[k]["ranks"].push_back(std::move(mine));
    }
    ranks.push_back(std::move(part));
  }
  for (nlohmann::json& c : collectives)  // the last ranks that skipped a call
    while (c["ranks"].size() < parts.size()) c["ranks"].push_back(nullptr);
  line["ranks"] = std::move(ranks);
  line["collectives"] = std::move(collectives);
  return line;
}

nlohmann::json trace_header(const nlohmann::json& config, const nlohmann::json& target, int world_size,
                            const ModelConfig& model, const std::vector<std::string>& state_names) {
  nlohmann::json names = nlohmann::json::array();
  const ParamLayout layout(model);
  for (const Slice& s : layout.slices()) names.push_back(s.name);
  return {{"dpcheck_trace", kTraceVersion},
          {"dpcheck_version", DPCHECK_VERSION},
          {"config", config},
          {"target", target},
          {"world_size", world_size},
          {"digest", "xxh3"},
          {"tensors", std::move(names)},
          {"state", state_names}};
}

std::uint64_t TracingCommunicator::digest(const void* buf, std::size_t bytes) {
  if (memory_space() == MemorySpace::host) return hash_bytes(buf, bytes);
  staging_.resize(bytes);
  inner_.to_host(buf, staging_.data(), bytes);
  return hash_bytes(staging_.data(), bytes);
}

void TracingCommunicator::allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  CollectiveRecord r{recorder_.next_seq(), "allreduce", std::string(reduce_op_name(op)), dtype, count, 0, 0};
  r.in = digest(buf, count * dtype_size(dtype));
  inner_.allreduce(buf, count, dtype, op);
  r.out = digest(buf, count * dtype_size(dtype));
  recorder_.record(std::move(r));
}

void TracingCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  CollectiveRecord r{recorder_.next_seq(), "broadcast", {}, dtype, count, 0, 0};
  r.in = digest(buf, count * dtype_size(dtype));
  inner_.broadcast(buf, count, dtype, root);
  r.out = digest(buf, count * dtype_size(dtype));
  recorder_.record(std::move(r));
}

void TracingCommunicator::allgather(const void* send, void* recv, std::size_t count, DType dtype) {
  CollectiveRecord r{recorder_.next_seq(), "allgather", {}, dtype, count, 0, 0};
  r.in = digest(send, count * dtype_size(dtype));
  inner_.allgather(send, recv, count, dtype);
  r.out = digest(recv, count * dtype_size(dtype) * static_cast<std::size_t>(size()));
  recorder_.record(std::move(r));
}

}  // namespace dpcheck
