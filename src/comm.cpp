#include "src/comm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dpcheck {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
  }
  return "?";
}

void Communicator::to_host(const void* src, void* dst, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Communicator::from_host(const void* src, void* dst, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

bool Communicator::all(bool verdict) {
  std::int64_t v = verdict ? 1 : 0;
  host().allreduce(&v, 1, DType::i64, ReduceOp::min);
  return v == 1;
}

std::vector<std::string> allgather_strings(Communicator& host, const std::string& mine) {
  return host.gather_strings(mine);
}

std::vector<std::string> Communicator::gather_strings(const std::string& mine) {
  Communicator& host = *this;
  const std::vector<std::int64_t> sizes = host.allgather_value<std::int64_t>(static_cast<std::int64_t>(mine.size()));
  const auto most = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::string> out(sizes.size());
  if (most == 0) return out;
  std::string padded = mine;
  padded.resize(most);
  std::string all(most * sizes.size(), '\0');
  host.allgather(padded.data(), all.data(), most, DType::u8);
  for (std::size_t r = 0; r < sizes.size(); ++r) out[r] = all.substr(r * most, static_cast<std::size_t>(sizes[r]));
  return out;
}

}  // namespace dpcheck
