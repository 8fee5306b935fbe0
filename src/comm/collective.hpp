// What the host communicators (src/comm/local_comm.cpp, src/comm/mpi_comm.cpp) have in common: how a rank's call
// is described and judged against its peers', the text of the errors a collective throws, how an
// all-reduce's work is split among the ranks, and the fixed rank-order reduction. Both backends judge
// calls and reduce with the same code, so a mismatch reads the same on either and an all-reduce gives
// the same bits on either.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/comm.hpp"

namespace dpcheck {

enum class CallKind : std::uint8_t { allreduce, broadcast, allgather, barrier };

std::string_view kind_name(CallKind k);

// What a rank asked for. Fields a collective does not use stay at their defaults, so that two
// allgathers never differ by an op they ignore.
struct CallDesc {
  CallKind kind = CallKind::barrier;
  std::size_t count = 0;
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool operator==(const CallDesc&) const = default;
};

// "allreduce(count 8, float32, sum)", "broadcast(count 4, float64, root 1)", "barrier()".
std::string describe(const CallDesc& d);

// Whether a call counts as passing a null buffer when some_null of its pointers is null: only a call
// that moves data needs its buffers.
bool passes_null_buffer(const CallDesc& d, bool some_null);

// The verdict on one collective, from every rank's call (descs[r]) and whether it passed a null buffer
// (null_buffer[r], from passes_null_buffer): empty when the calls agree and are supported, otherwise
// why not. Every rank that judges the same calls gets the same text, so all of them throw or none does.
std::string check_calls(std::span<const CallDesc> descs, std::span<const std::uint8_t> null_buffer);

// "rank 3" or "ranks 0, 2, 3".
std::string rank_list(const std::vector<int>& ranks);

// The heads of a collective's errors: "allreduce on rank 2" and "allreduce timed out on rank 2 after
// 2.00 s".
std::string call_on_rank(CallKind k, int rank);
std::string timed_out_on_rank(CallKind k, int rank, std::chrono::milliseconds timeout);

// now + timeout, with "practically forever" capped so that the sum cannot overflow the clock.
std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout);

// Rank r's share [lo, hi) of count elements: N nearly equal runs of whole 64-byte blocks, so that two
// ranks never write the same cache line of an aligned buffer.
std::pair<std::size_t, std::size_t> slice_of(std::size_t count, std::size_t elem_bytes, int rank, int n);

// Where the host reduction's work changes shape for n ranks: beyond n 64-byte blocks every rank
// reduces a slice (below it some are idle), and beyond n chunks a slice spans more than one chunk.
std::vector<std::size_t> host_reduction_thresholds(int n, DType dtype);

// Reduces elements [lo, hi) of in[0], ..., in[n-1] in rank order, ((in[0] + in[1]) + in[2]) + ...
// element by element (then divided by n for avg), and writes the result into out[0], ..., out[m-1].
// bfloat16 and float16 elements are widened to float32, reduced (and divided) in float32 in that
// order, and rounded to their format once, at the end (src/comm.hpp).
// Every pointer points at element 0 of its buffer. An output may be one of the inputs: the local
// backend reduces its slice of all N buffers into all N in place, the mpi backend its slice of the
// received copies into its own buffer. Integer sums wrap; u8 and avg over integers are refused by
// check_calls before any rank gets here.
void reduce_in_rank_order(const void* const* in, int n, void* const* out, int m, std::size_t lo, std::size_t hi,
                          DType dtype, ReduceOp op);

}  // namespace dpcheck
