// plugin_abi_rules_hold: the plugin ABI's rules (include/dpcheck/plugin.h), held to what a plugin's
// communicator does -- src/target/plugin_comm.cpp, the code every `--comm ./libmine.so` run goes through.
// A case draws a table of ABI 1, 2 or 3 (ABI 3 with any dtype and op mask, 0 included; an earlier ABI's
// table with whatever its memory holds past its end, which dpcheck must not read), a world of 2 to 6
// ranks as threads, and a few collectives of drawn dtypes and ops, and demands:
//   - what the table declares is handed to the plugin, as the same dtype and op, on every rank; what it
//     does not declare is refused on every rank (a UsageError before any rank calls the plugin):
//     ABI 1 float32, float64 and int64 with every op; ABI 2 those and bfloat16 and float16; ABI 3 its
//     masks, a mask of 0 meaning ABI 1's, never a set added later;
//   - no rank's finalize runs while a peer is still inside a collective (the plugin may free what its
//     peers still read: "Finalize" in plugin.h), and every rank is finalized once.
// The plugin is in-process: its collectives swap bytes over the bootstrap and its ranks leave them at
// staggered times, so that a finalize before the ranks' barrier meets a peer still inside.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <dpcheck/plugin.h>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "src/comm/local_comm.hpp"
#include "src/dtype.hpp"
#include "src/error.hpp"
#include "src/target/plugin_comm.hpp"

namespace dpcheck {

namespace {

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16};
constexpr dpcheck_dtype_t kAbiDtypes[] = {DPCHECK_FLOAT32, DPCHECK_FLOAT64, DPCHECK_INT64, DPCHECK_BFLOAT16,
                                          DPCHECK_FLOAT16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};
constexpr dpcheck_op_t kAbiOps[] = {DPCHECK_SUM, DPCHECK_AVG, DPCHECK_MIN, DPCHECK_MAX};
constexpr std::size_t kNoOp = std::size(kOps);  // a broadcast: a dtype, no op

// plugin.h's rules, restated from its text: what a table of `abi` with masks `dtypes` and `ops` takes.
bool declares_dtype(unsigned abi, std::uint32_t dtypes, std::size_t d) {
  const std::uint32_t bit = DPCHECK_DTYPE_BIT(kAbiDtypes[d]);
  if (abi == 1) return bit & DPCHECK_ABI1_DTYPES;
  if (abi == 2) return true;  // every dtype of ABI 2
  return bit & (dtypes == 0 ? DPCHECK_ABI1_DTYPES : dtypes);
}
bool declares_op(unsigned abi, std::uint32_t ops, std::size_t o) {
  if (abi < 3 || ops == 0) return DPCHECK_OP_BIT(kAbiOps[o]) & DPCHECK_ABI1_OPS;
  return DPCHECK_OP_BIT(kAbiOps[o]) & ops;
}

struct Call {
  std::size_t dtype = 0;
  std::size_t op = kNoOp;  // kNoOp: a broadcast
  std::size_t count = 1;
};

struct AbiCase {
  unsigned abi = 3;
  std::uint32_t dtypes = 0, ops = 0;  // the table's masks (past the end of an ABI 1 or 2 table)
  int world = 2;
  std::vector<Call> calls;
  std::string call_text(const Call& c) const {
    return c.op == kNoOp ? "broadcast " + std::string(dtype_name(kDtypes[c.dtype]))
                         : "all-reduce " + std::string(dtype_name(kDtypes[c.dtype])) + " " +
                               std::string(reduce_op_name(kOps[c.op]));
  }
  // "ABI 3, dtypes 0x9, ops 0x0, 3 ranks: all-reduce float32 sum, broadcast bfloat16"
  std::string describe() const {
    char masks[64];
    std::snprintf(masks, sizeof masks, ", dtypes 0x%x, ops 0x%x", dtypes, ops);
    std::string s = "ABI " + std::to_string(abi) + masks + (abi < 3 ? " (past the table's end)" : "") + ", " +
                    std::to_string(world) + " ranks:";
    for (std::size_t i = 0; i < calls.size(); ++i) s += (i == 0 ? " " : ", ") + call_text(calls[i]);
    return s;
  }
};

void showValue(const AbiCase& c, std::ostream& os) { os << c.describe(); }

rc::Gen<AbiCase> gen_abi_case() {
  return rc::gen::exec([] {
    AbiCase c;
    c.abi = *uniform(rc::gen::element(3u, 1u, 2u));
    // Each bit of the five dtypes and four ops; a third of the masks 0.
    const auto mask = [](unsigned bits) {
      return *rc::gen::weightedOneOf<std::uint32_t>(
          {{1, rc::gen::just(std::uint32_t{0})},
           {2, uniform(rc::gen::inRange<std::uint32_t>(1, std::uint32_t{1} << bits))}});
    };
    c.dtypes = mask(5);
    c.ops = mask(4);
    c.world = *rc::gen::inRange(2, 7);
    const int n = *rc::gen::inRange(1, 5);
    for (int i = 0; i < n; ++i) {
      Call call;
      call.dtype = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kDtypes)));
      call.op = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kOps) + 1));
      call.count = *rc::gen::inRange<std::size_t>(1, 5);
      c.calls.push_back(call);
    }
    return c;
  });
}

// What one case's plugin saw, shared by its ranks (a plugin's state in one process).
struct AbiWorld {
  std::mutex mutex;
  std::atomic<int> inside{0};  // ranks inside a collective now
  std::atomic<int> finalized{0};
  // Per rank, the collectives handed to it: "all-reduce float32 sum" as the plugin read its arguments.
  std::vector<std::vector<std::string>> handed;
  std::string violation;  // the first finalize with a peer inside a collective
};

// The in-process plugin: one case runs at a time, and its world is the one below.
std::mutex g_case_mutex;
AbiWorld* g_world = nullptr;

struct AbiRank {
  const dpcheck_bootstrap_t* boot = nullptr;
  int rank = 0;
};

int abi_init(const dpcheck_bootstrap_t* boot, void** comm) {
  *comm = new AbiRank{boot, boot->rank};
  return 0;
}

// Swaps the buffer's bytes with every rank over the bootstrap, then leaves at a time of its own (rank r
// about 2 r ms later than rank 0), as ranks leave a real collective: a finalize that does not wait for
// its peers meets one still inside.
int collective(AbiRank* me, std::string what, std::size_t bytes) {
  g_world->inside.fetch_add(1);
  {
    std::lock_guard lock(g_world->mutex);
    g_world->handed[static_cast<std::size_t>(me->rank)].push_back(std::move(what));
  }
  std::vector<unsigned char> send(bytes, static_cast<unsigned char>(me->rank)),
      recv(bytes * static_cast<std::size_t>(me->boot->size));
  const int rc = me->boot->allgather(me->boot->ctx, send.data(), recv.data(), bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * me->rank));
  g_world->inside.fetch_sub(1);
  return rc;
}

std::size_t abi_size(dpcheck_dtype_t t) {
  return t == DPCHECK_FLOAT64 || t == DPCHECK_INT64 ? 8 : t == DPCHECK_FLOAT32 ? 4 : 2;
}

std::string abi_dtype_text(dpcheck_dtype_t t) {
  for (std::size_t d = 0; d < std::size(kAbiDtypes); ++d)
    if (kAbiDtypes[d] == t) return std::string(dtype_name(kDtypes[d]));
  return "dtype " + std::to_string(static_cast<int>(t));
}

int abi_allreduce(void* comm, void*, std::size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op, void*) {
  std::string o = "op " + std::to_string(static_cast<int>(op));
  for (std::size_t k = 0; k < std::size(kAbiOps); ++k)
    if (kAbiOps[k] == op) o = std::string(reduce_op_name(kOps[k]));
  return collective(static_cast<AbiRank*>(comm), "all-reduce " + abi_dtype_text(dtype) + " " + o,
                    count * abi_size(dtype));
}

int abi_broadcast(void* comm, void*, std::size_t count, dpcheck_dtype_t dtype, int, void*) {
  return collective(static_cast<AbiRank*>(comm), "broadcast " + abi_dtype_text(dtype), count * abi_size(dtype));
}

int abi_allgather(void* comm, const void*, void*, std::size_t count, dpcheck_dtype_t dtype, void*) {
  return collective(static_cast<AbiRank*>(comm), "all-gather " + abi_dtype_text(dtype), count * abi_size(dtype));
}

int abi_barrier(void* comm) {
  auto* me = static_cast<AbiRank*>(comm);
  return me->boot->barrier(me->boot->ctx);
}

const char* abi_last_error(void*) { return "the bootstrap failed"; }

void abi_finalize(void* comm) {
  auto* me = static_cast<AbiRank*>(comm);
  if (const int peers = g_world->inside.load(); peers > 0) {
    std::lock_guard lock(g_world->mutex);
    if (g_world->violation.empty())
      g_world->violation = "rank " + std::to_string(me->rank) + " was finalized while " + std::to_string(peers) +
                           (peers == 1 ? " peer was" : " peers were") + " still inside a collective";
  }
  g_world->finalized.fetch_add(1);
  delete me;
}

}  // namespace

void plugin_abi_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const AbiCase c = *gen_abi_case();
  record.size = {0, c.world, 0, 0};
  record.note = c.describe();
  RC_CLASSIFY(c.abi < 3, "ABI " + std::to_string(c.abi));
  RC_CLASSIFY(c.abi == 3 && (c.dtypes == 0 || c.ops == 0), "ABI 3 with a mask of 0");

  dpcheck_comm_plugin_t table{};
  table.abi = c.abi;
  table.name = "abi rules";
  table.memory = DPCHECK_HOST;
  table.init = abi_init;
  table.allreduce = abi_allreduce;
  table.broadcast = abi_broadcast;
  table.allgather = abi_allgather;
  table.barrier = abi_barrier;
  table.last_error = abi_last_error;
  table.finalize = abi_finalize;
  // Past the end of an ABI 1 or 2 table: what its memory happens to hold, which dpcheck must not read.
  table.version = c.abi >= 3 ? "1.0" : "past the end";
  table.dtypes = c.dtypes;
  table.ops = c.ops;
  const PluginRules rules = mutant_plugin_rules(target.mutant);

  const std::size_t n = static_cast<std::size_t>(c.world);
  std::vector<std::vector<std::string>> outcome(n);  // per rank and call: "handed" or "refused: ..."
  AbiWorld world;
  world.handed.resize(n);
  {
    std::lock_guard lock(g_case_mutex);
    g_world = &world;
    try {
      run_local(c.world, [&](Communicator& base) {
        run_on_plugin(
            table, "abi-rules", base,
            [&](Communicator& comm) {
              std::vector<std::string>& mine = outcome[static_cast<std::size_t>(comm.rank())];
              for (const Call& call : c.calls) {
                std::vector<std::uint64_t> buf(call.count, 0);  // room for count elements of any dtype
                try {
                  if (call.op == kNoOp) comm.broadcast(buf.data(), call.count, kDtypes[call.dtype], 0);
                  else comm.allreduce(buf.data(), call.count, kDtypes[call.dtype], kOps[call.op]);
                  mine.push_back("handed");
                } catch (const UsageError& e) {
                  mine.push_back(std::string("refused: ") + e.what());
                }
              }
            },
            rules);
      });
    } catch (...) {
      g_world = nullptr;
      throw;
    }
    g_world = nullptr;
  }

  std::vector<std::string> want;  // the declared calls, in order, as the plugin should read them
  for (std::size_t i = 0; i < c.calls.size(); ++i) {
    const Call& call = c.calls[i];
    const bool declared =
        declares_dtype(c.abi, c.dtypes, call.dtype) && (call.op == kNoOp || declares_op(c.abi, c.ops, call.op));
    if (declared) want.push_back(c.call_text(call));
    for (std::size_t r = 0; r < n; ++r) {
      const std::string& got = outcome[r][i];
      const std::string which = "call " + std::to_string(i) + " (" + c.call_text(call) + ")";
      if (declared && got != "handed")
        fail_case("rank " + std::to_string(r) + " refused " + which + ", which the table declares: " + got);
      if (!declared && got == "handed")
        fail_case("rank " + std::to_string(r) + " handed the plugin " + which + ", which the table does not declare");
    }
  }
  // What the plugin read: each rank was handed the declared calls, in order, as the same dtype and op.
  for (std::size_t r = 0; r < n; ++r)
    if (world.handed[r] != want) {
      std::string got;
      for (const std::string& h : world.handed[r]) got += (got.empty() ? "" : ", ") + h;
      fail_case("rank " + std::to_string(r) + "'s plugin was handed [" + got + "], not the calls the table declares");
    }
  if (!world.violation.empty()) fail_case(world.violation);
  if (world.finalized.load() != c.world)
    fail_case(std::to_string(world.finalized.load()) + " finalize calls on " + std::to_string(c.world) + " ranks");
}

}  // namespace dpcheck
