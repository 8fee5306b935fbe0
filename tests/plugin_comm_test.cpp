// Communicator plugins (src/target/plugin_comm.hpp) across the plugin ABIs (include/dpcheck/plugin.h): the
// table of ABIs (what each is handed: ABI 1 its own dtypes, ABI 2 the 16-bit ones too, ABI 3 what its
// masks declare, 0 meaning ABI 1's, so that a source recompiled unchanged is never handed a newer
// dtype); plugins that declare the 16-bit floats (examples/comm_ring, which rounds at every hop, and
// tests/plugins/comm's correct plugin, which rounds once) reduce and move them through the conformance
// suite's 16-bit checks; a collective a plugin does not declare is a UsageError naming the plugin, the
// dtype and the remedy, on every rank, before the plugin is called (the test plugins fail any call of a
// dtype or op they should never see, saying so); and finalize's contract: a normal end finalizes no
// rank before every rank's last call has returned, with the bootstrap still usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/target/backends.hpp"
#include "src/target/plugin_comm.hpp"
#include "tests/comm_conformance.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;

const std::string kRing = DPCHECK_RING_PLUGIN;
const std::string kCorrect = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_correct.so";
const std::string kAbi1 = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_abi-1.so";
const std::string kAbi2 = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_abi-2.so";
const std::string kUnchanged = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_unchanged-source.so";
const std::string kFloat32Sum = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_float32-sum.so";
const std::string kClosesEarly = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_closes-early.so";
const std::string kFinalizeBarrier = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_finalize-barrier.so";

// fn on every rank of n threads, each with a communicator of the plugin at `path`.
void run_plugin(const std::string& path, int n, const std::function<void(Communicator&)>& fn) {
  const dpcheck_comm_plugin_t& plugin = load_comm_plugin(path);
  run_local(
      n,
      [&](Communicator& base) {
        const std::unique_ptr<Communicator> comm = make_plugin_communicator(plugin, path, base);
        fn(*comm);
      },
      30s);
}

// The table of ABIs: what each table declares, and so what dpcheck hands it.
TEST(PluginComm, EachAbiIsHandedWhatItDeclares) {
  struct Row {
    std::string path;
    unsigned abi;
    std::vector<DType> dtypes;
    std::vector<ReduceOp> ops;
  };
  const std::vector<DType> abi1 = {DType::f32, DType::f64, DType::i64};
  const std::vector<DType> all = {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16};
  const std::vector<ReduceOp> every = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};
  const std::vector<Row> rows = {
      {kAbi1, 1, abi1, every},       // ABI 1: its own dtypes, even with masks set past its table
      {kAbi2, 2, all, every},        // ABI 2: every dtype there was
      {kUnchanged, 3, abi1, every},  // an ABI-2 source recompiled unchanged: masks 0, ABI 1's set
      {kFloat32Sum, 3, {DType::f32}, {ReduceOp::sum}},
      {kCorrect, 3, all, every},
      {kRing, 3, all, every},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.path);
    const dpcheck_comm_plugin_t& p = load_comm_plugin(row.path);
    EXPECT_EQ(p.abi, row.abi);
    for (DType t : all) {
      const bool declared = std::find(row.dtypes.begin(), row.dtypes.end(), t) != row.dtypes.end();
      EXPECT_EQ(comm_plugin_has_dtype(p, t), declared) << dtype_name(t);
      for (ReduceOp op : every) {
        const bool op_declared = std::find(row.ops.begin(), row.ops.end(), op) != row.ops.end();
        EXPECT_EQ(comm_plugin_supports(p, t, op), declared && op_declared)
            << dtype_name(t) << " " << reduce_op_name(op);
      }
    }
    EXPECT_FALSE(comm_plugin_has_dtype(p, DType::u8));  // dpcheck's own control messages
  }
  EXPECT_EQ(comm_plugin_label(load_comm_plugin(kRing)), "'ring' example 1.0");
  EXPECT_EQ(comm_plugin_label(load_comm_plugin(kAbi2)), "'broken'");  // no version before ABI 3
  EXPECT_EQ(comm_plugin_capabilities(load_comm_plugin(kFloat32Sum)), "dtypes float32; all-reduce ops sum");
}

// The test plugins fail a call of a dtype or op they do not declare, so each ABI's set, run through
// dpcheck, shows that nothing else arrives.
TEST(PluginComm, AnUndeclaredCollectiveIsRefusedBeforeThePluginIsCalled) {
  for (const std::string& path : {kUnchanged, kFloat32Sum}) {
    SCOPED_TRACE(path);
    run_plugin(path, 3, [&](Communicator& c) {
      std::vector<Bf16> b(4, narrow16<Bf16>(1.0f));
      try {
        c.allreduce(std::span<Bf16>(b), ReduceOp::avg);
        ADD_FAILURE() << "bfloat16 reached a plugin that does not declare it";
      } catch (const UsageError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("plugin 'broken' (" + path + ")"), std::string::npos) << m;
        EXPECT_NE(m.find("bfloat16"), std::string::npos) << m;
        EXPECT_NE(m.find("DPCHECK_BFLOAT16"), std::string::npos) << m;  // the remedy
      }
      std::vector<float> f(4, 1.0f);
      if (path == kFloat32Sum) {
        EXPECT_THROW(c.allreduce(std::span<float>(f), ReduceOp::avg), UsageError);
        std::vector<double> d(2, 1.0);
        EXPECT_THROW(c.broadcast(std::span<double>(d), 0), UsageError);
      }
      c.allreduce(std::span<float>(f), ReduceOp::sum);  // still in step: no rank called the plugin
      EXPECT_EQ(f[0], 3.0f);
    });
  }
}

// The plugin's ranks close their "connections" in finalize at once, and its last rank reads every
// peer's 50 ms after the others returned from an all-reduce: right only because dpcheck finalizes no
// rank before every rank's last call has returned. Through the backend row, as every command runs it;
// each world ends with an all-reduce and nothing after it.
TEST(PluginComm, NoRankIsFinalizedWhileAPeerIsStillInACollective) {
  const Backend& row = register_comm_plugin(kClosesEarly);
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    EXPECT_NO_THROW(row.run_threads(
        n,
        [](Communicator& c) {
          std::vector<float> f(16, 1.0f);
          c.allreduce(std::span<float>(f), ReduceOp::sum);
        },
        30s));
  }
}

// finalize may use the bootstrap (the plugin aborts the process if its barrier fails there).
TEST(PluginComm, TheBootstrapIsUsableInsideFinalize) {
  const Backend& row = register_comm_plugin(kFinalizeBarrier);
  EXPECT_NO_THROW(row.run_threads(
      3,
      [](Communicator& c) {
        std::vector<float> f(4, 1.0f);
        c.allreduce(std::span<float>(f), ReduceOp::sum);
        EXPECT_EQ(f[0], 3.0f);
      },
      30s));
}

// After a failure the ranks are finalized without waiting for each other: a rank whose peer has
// failed is not held at a barrier until the timeout.
TEST(PluginComm, AfterAFailureFinalizeDoesNotWaitForThePeers) {
  const Backend& row = register_comm_plugin(kCorrect);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(row.run_threads(
                   3,
                   [](Communicator& c) {
                     if (c.rank() == 1) throw Error("rank 1 fails");
                     c.host().barrier();  // the other ranks learn of the failure here
                   },
                   30s),
               Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// Sums of small integers are exact whether the plugin rounds once or at every hop; broadcast and
// allgather move the patterns untouched.
TEST(PluginComm, PluginsThatDeclareSixteenBitFloatsReduceAndMoveThem) {
  for (const std::string& path : {kRing, kCorrect, kAbi2})
    for (int n : {1, 2, 3, 5}) {
      SCOPED_TRACE(path + " N=" + std::to_string(n));
      run_plugin(path, n, [](Communicator& c) {
        for (const char* check : {"16-bit sums are exact on small integers", "broadcast bfloat16", "broadcast float16",
                                  "allgather bfloat16", "allgather float16"})
          conformance::run_check(c, check);
      });
    }
}

// The correct plugin sums in float in rank order and rounds once, as dpcheck's backends do; the ring
// rounds at every hop (as NCCL does), and so gives other bits once there are three ranks.
TEST(PluginComm, ThePluginThatRoundsOnceHasTheLocalBackendsBits) {
  for (int n : {1, 2, 3, 5})
    run_plugin(kCorrect, n,
               [](Communicator& c) { conformance::run_check(c, "16-bit sum is rounded once at the end"); });
  std::vector<float> ring_sum;
  run_plugin(kRing, 3, [&](Communicator& c) {
    std::vector<Bf16> b(8, narrow16<Bf16>(c.rank() == 0 ? 256.0f : 1.0f));
    c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
    if (c.rank() == 0) ring_sum.push_back(widen16(b[0]));
  });
  // 256 + 1 + 1 once rounded is 258; rounded after each hop, 256 + 1 rounds back to 256 (ties to even).
  ASSERT_EQ(ring_sum.size(), 1u);
  EXPECT_EQ(ring_sum[0], 256.0f);
}

TEST(PluginComm, AnAbiOnePluginRunsItsOwnDtypes) {
  run_plugin(kAbi1, 3, [](Communicator& c) {
    std::vector<float> f(5, 1.5f);
    c.allreduce(std::span<float>(f), ReduceOp::sum);
    EXPECT_EQ(f[4], 4.5f);
    std::vector<std::int64_t> i(3, c.rank());
    c.allreduce(std::span<std::int64_t>(i), ReduceOp::max);
    EXPECT_EQ(i[0], 2);
    std::vector<double> d(2, c.rank() + 0.5);
    c.broadcast(std::span<double>(d), 1);
    EXPECT_EQ(d[1], 1.5);
  });
}

TEST(PluginComm, ASixteenBitCollectiveOnAnAbiOnePluginIsAUsageErrorNamingPluginDtypeAndAbis) {
  const auto expect_refused = [](const std::function<void()>& call, const char* dtype, const std::string& where) {
    try {
      call();
      ADD_FAILURE() << where << ": " << dtype << " reached an ABI-1 plugin";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("plugin 'broken' (" + kAbi1 + ")"), std::string::npos) << m;
      EXPECT_NE(m.find("plugin ABI 1, which has no " + std::string(dtype)), std::string::npos) << m;
      EXPECT_NE(m.find("this dpcheck's plugin.h (ABI 3)"), std::string::npos) << m;
      EXPECT_NE(m.find("declare it in its table's dtypes"), std::string::npos) << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << ": " << dtype << ": not a UsageError: " << e.what();
    }
  };
  run_plugin(kAbi1, 3, [&](Communicator& c) {
    const std::string where = conformance::where(c);
    std::vector<Bf16> b(4, narrow16<Bf16>(1.0f)), bg(12);
    std::vector<Fp16> h(4, narrow16<Fp16>(1.0f)), hg(12);
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
      expect_refused([&] { c.allreduce(std::span<Bf16>(b), op); }, "bfloat16", where);
      expect_refused([&] { c.allreduce(std::span<Fp16>(h), op); }, "float16", where);
    }
    expect_refused([&] { c.broadcast(std::span<Bf16>(b), 0); }, "bfloat16", where);
    expect_refused([&] { c.broadcast(std::span<Fp16>(h), 0); }, "float16", where);
    expect_refused([&] { c.allgather(std::span<const Bf16>(b), std::span<Bf16>(bg)); }, "bfloat16", where);
    expect_refused([&] { c.allgather(std::span<const Fp16>(h), std::span<Fp16>(hg)); }, "float16", where);
    // Refused before any rank called the plugin: the ranks are still in step.
    std::vector<float> f(4, 1.0f);
    c.allreduce(std::span<float>(f), ReduceOp::sum);
    EXPECT_EQ(f[0], 3.0f) << where;
  });
}

// From the top: the refusal leaves run_local as the UsageError itself (exit 2 in the command), not as
// another rank's echo of it.
TEST(PluginComm, TheRefusalReachesTheCallerAsAUsageError) {
  EXPECT_THROW(run_plugin(kAbi1, 2,
                          [](Communicator& c) {
                            std::vector<Bf16> b(4);
                            c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
                          }),
               UsageError);
}

}  // namespace
}  // namespace dpcheck
