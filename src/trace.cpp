#include "src/trace.hpp"

#include <cmath>
#include <cstdio>

#include "src/engine.hpp"
#include "src/error.hpp"
#include "src/hash.hpp"
#include "src/optimizer.hpp"

namespace dpcheck {

TensorSummary summarize(std::span<const float> values) {
  TensorSummary s;
  s.digest = hash_bytes(values.data(), values.size_bytes());
  // Four partial sums and maxima, so that the loop is not one long chain of dependent double adds.
  double sum[4] = {0, 0, 0, 0}, most[4] = {0, 0, 0, 0};
  std::int64_t bad = 0;
  const std::size_t n = values.size();
  const auto take = [&](int lane, float v) {
    const double a = std::fabs(static_cast<double>(v));
    if (!(a <= 3.4028234663852886e38)) {  // NaN or an infinity
      ++bad;
      return;
    }
    sum[lane] += v;
    most[lane] = a > most[lane] ? a : most[lane];
  };
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) take(l, values[i + static_cast<std::size_t>(l)]);
  for (; i < n; ++i) take(0, values[i]);
  s.sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  s.max_abs = std::max(std::max(most[0], most[1]), std::max(most[2], most[3]));
  s.non_finite = bad;
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
  for (const Slice& s : layout_.slices()) out.push_back(summarize({flat + s.offset, s.size()}));
  return out;
}

void TraceRecorder::local_gradient(Trainer& trainer, std::int64_t step, double, std::int64_t) {
  const std::vector<std::int64_t> idx = trainer.local_indices(step);
  indices_count_ = static_cast<std::int64_t>(idx.size());
  indices_digest_ = hash_bytes(idx.data(), idx.size() * sizeof(std::int64_t));
  Engine& e = trainer.engine();
  if (e.memory_space() == MemorySpace::host) {
    local_ = tensors(e.grads(), e.param_count());
  } else {
    host_.resize(e.param_count());
    e.store_grads(host_);
    local_ = tensors(host_.data(), host_.size());
  }
}

void TraceRecorder::reduced_gradient(Trainer& trainer, std::int64_t) {
  Engine& e = trainer.engine();
  if (e.memory_space() == MemorySpace::host) {
    reduced_ = tensors(e.grads(), e.param_count());
  } else {
    host_.resize(e.param_count());
    e.store_grads(host_);
    reduced_ = tensors(host_.data(), host_.size());
  }
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
    nlohmann::json j = {{"seq", c.seq}, {"call", c.call}, {"dtype", dtype_name(c.dtype)}, {"count", c.count},
                        {"in", digest_hex(c.in)}, {"out", digest_hex(c.out)}};
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
        if (calls[k].value(key, nlohmann::json()) != collectives[k].value(key, nlohmann::json())) mine[key] = calls[k][key];
      while (collectives[k]["ranks"].size() < r) collectives[k]["ranks"].push_back(nullptr);  // a rank that skipped it
      collectives[k]["ranks"].push_back(std::move(mine));
    }
    ranks.push_back(std::move(part));
  }
  line["ranks"] = std::move(ranks);
  line["collectives"] = std::move(collectives);
  return line;
}

nlohmann::json trace_header(const nlohmann::json& config, const nlohmann::json& target, int world_size,
                            const ModelConfig& model, const std::vector<std::string>& state_names) {
  nlohmann::json names = nlohmann::json::array();
  const ParamLayout layout(model);
  for (const Slice& s : layout.slices()) names.push_back(s.name);
  return {{"dpcheck_trace", kTraceVersion}, {"dpcheck_version", DPCHECK_VERSION}, {"config", config},
          {"target", target}, {"world_size", world_size}, {"digest", "xxh3"},
          {"tensors", std::move(names)}, {"state", state_names}};
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
