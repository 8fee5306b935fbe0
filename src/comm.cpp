#include "src/comm.hpp"

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

}  // namespace dpcheck
