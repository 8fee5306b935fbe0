// Communicator plugins (src/comm/plugin_comm.hpp) across the plugin ABIs (include/dpcheck/plugin.h): a
// plugin of ABI 2 (examples/comm_ring, which rounds at every hop, and tests/plugins/comm's correct
// plugin, which rounds once) reduces and moves bfloat16 and float16 through the conformance suite's
// 16-bit checks; a plugin of ABI 1 still loads and runs its own dtypes, and a 16-bit collective on it
// is a UsageError naming the plugin, the dtype and both ABIs, on every rank, before the plugin is
// called (the ABI-1 test plugin fails any call of a dtype it should never see, saying so).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/comm/plugin_comm.hpp"
#include "src/error.hpp"
#include "tests/comm_conformance.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;

const std::string kRing = DPCHECK_RING_PLUGIN;
const std::string kCorrect = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_correct.so";
const std::string kAbi1 = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_abi-1.so";

// fn on every rank of n threads, each with a communicator of the plugin at `path`.
void run_plugin(const std::string& path, int n, const std::function<void(Communicator&)>& fn) {
  const dpcheck_comm_plugin_t& plugin = load_comm_plugin(path);
  run_local(n, [&](Communicator& base) {
    const std::unique_ptr<Communicator> comm = make_plugin_communicator(plugin, path, base);
    fn(*comm);
  }, 30s);
}

TEST(PluginComm, TheExamplesAndTestPluginsDeclareTheAbiTheyWereBuiltFor) {
  EXPECT_EQ(load_comm_plugin(kRing).abi, 2u);
  EXPECT_EQ(load_comm_plugin(kCorrect).abi, 2u);
  EXPECT_EQ(load_comm_plugin(kAbi1).abi, 1u);
  EXPECT_TRUE(comm_plugin_has_dtype(load_comm_plugin(kRing), DType::bf16));
  EXPECT_TRUE(comm_plugin_has_dtype(load_comm_plugin(kRing), DType::f16));
  for (DType t : {DType::f32, DType::f64, DType::i64}) EXPECT_TRUE(comm_plugin_has_dtype(load_comm_plugin(kAbi1), t));
  EXPECT_FALSE(comm_plugin_has_dtype(load_comm_plugin(kAbi1), DType::bf16));
  EXPECT_FALSE(comm_plugin_has_dtype(load_comm_plugin(kAbi1), DType::f16));
  EXPECT_FALSE(comm_plugin_has_dtype(load_comm_plugin(kRing), DType::u8));  // dpcheck's own control messages
}

// Sums of small integers are exact whether the plugin rounds once or at every hop; broadcast and
// allgather move the patterns untouched.
TEST(PluginComm, AbiTwoPluginsReduceAndMoveSixteenBitFloats) {
  for (const std::string& path : {kRing, kCorrect})
    for (int n : {1, 2, 3, 5}) {
      SCOPED_TRACE(path + " N=" + std::to_string(n));
      run_plugin(path, n, [](Communicator& c) {
        conformance::allreduce_16bit_sums_are_exact_on_small_integers(c);
        conformance::broadcast_and_allgather_move_16bit_patterns(c);
      });
    }
}

// The correct plugin sums in float in rank order and rounds once, as dpcheck's backends do; the ring
// rounds at every hop (as NCCL does), and so gives other bits once there are three ranks.
TEST(PluginComm, ThePluginThatRoundsOnceHasTheLocalBackendsBits) {
  for (int n : {1, 2, 3, 5})
    run_plugin(kCorrect, n, conformance::allreduce_16bit_sum_is_rounded_once_at_the_end);
  std::vector<float> ring_sum;
  run_plugin(kRing, 3, [&](Communicator& c) {
    std::vector<Bf16> b(8, conformance::narrow<Bf16>(c.rank() == 0 ? 256.0f : 1.0f));
    c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
    if (c.rank() == 0) ring_sum.push_back(conformance::widen(b[0]));
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
      EXPECT_NE(m.find("need ABI 2"), std::string::npos) << m;
      EXPECT_NE(m.find("DPCHECK_BFLOAT16"), std::string::npos) << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << ": " << dtype << ": not a UsageError: " << e.what();
    }
  };
  run_plugin(kAbi1, 3, [&](Communicator& c) {
    const std::string where = conformance::where(c);
    std::vector<Bf16> b(4, conformance::narrow<Bf16>(1.0f)), bg(12);
    std::vector<Fp16> h(4, conformance::narrow<Fp16>(1.0f)), hg(12);
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
  EXPECT_THROW(run_plugin(kAbi1, 2, [](Communicator& c) {
    std::vector<Bf16> b(4);
    c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
  }), UsageError);
}

}  // namespace
}  // namespace dpcheck
