// Bundles name their backend (divergence/backend_record.hpp): a bundle records its plugins' files and
// tables and the variables that choose their algorithm, `dpcheck replay` warns of each difference by
// name and says nothing when there is none, the replay line sets the recorded variables again, and a
// bundle written before the record replays as before. End to end over the tests' plugin whose variable
// chooses its order of summation (DPCHECK_TEST_COMM_ORDER), and over Gloo's adapter where it is built
// (DPCHECK_GLOO_ALGORITHM=ring leaves three ranks with different bits; allreduce_ring does not).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "divergence/backend_record.hpp"
#include "divergence/divergence.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

const std::string kOrderPlugin = std::string(DPCHECK_COMM_PLUGIN_DIR) + "/libdpcheck_comm_order-env.so";
constexpr const char* kOrder = "DPCHECK_TEST_COMM_ORDER";

// Sets or unsets a variable for one test (each case runs in a process of its own under ctest).
void set_env(const char* name, const char* value) {
  if (value) ::setenv(name, value, 1);
  else ::unsetenv(name);
}

PluginRecord gloo_like() {
  PluginRecord p;
  p.option = "--comm";
  p.path = "./libgloo.so";
  p.resolved = "/opt/plugins/libgloo.so";
  p.xxh3 = "0123456789abcdef";
  p.name = "gloo ring";
  p.version = "Gloo 0.5.0";
  p.abi = 3;
  p.dtypes = {"float32", "float64", "int64"};
  p.ops = {"sum", "avg"};
  p.env = {{"DPCHECK_GLOO_ALGORITHM", "ring"}};
  return p;
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

std::string joined_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST(BackendRecord, JsonRoundTrips) {
  BackendRecord r;
  r.plugins.push_back(gloo_like());
  PluginRecord k;
  k.option = "--kernels";
  k.path = "libk.so";
  k.resolved = "/x/libk.so";
  k.xxh3 = "fedcba9876543210";
  k.name = "naive";
  k.abi = 1;  // no version
  k.env = {{"K_ALGO", std::nullopt}};
  r.plugins.push_back(k);
  r.env_prefixes = mpi_env_prefixes();
  r.library_env = {{"OMPI_MCA_coll_tuned_allreduce_algorithm", "4"}};
  const nlohmann::json j = r.to_json();
  EXPECT_TRUE(j["plugins"][1]["version"].is_null()) << j.dump();
  EXPECT_TRUE(j["plugins"][1]["env"]["K_ALGO"].is_null()) << j.dump();
  EXPECT_FALSE(j["plugins"][1].contains("dtypes")) << "a kernel plugin declares no dtypes: " << j.dump();
  const BackendRecord back = BackendRecord::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  ASSERT_EQ(back.plugins.size(), 2u);
  EXPECT_EQ(back.plugins[0].env.at("DPCHECK_GLOO_ALGORITHM"), std::optional<std::string>("ring"));
  EXPECT_EQ(back.plugins[1].env.at("K_ALGO"), std::nullopt);
  EXPECT_EQ(back.library_env.at("OMPI_MCA_coll_tuned_allreduce_algorithm"), std::optional<std::string>("4"));
}

TEST(BackendRecord, DamagedRecordsAreRefusedByField) {
  nlohmann::json good = [] {
    BackendRecord r;
    r.plugins.push_back(gloo_like());
    r.env_prefixes = mpi_env_prefixes();
    return r.to_json();
  }();
  const auto refusal = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return message_of<UsageError>([&] { BackendRecord::from_json(j); });
  };
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& words) {
    const std::string message = refusal(edit);
    EXPECT_NE(message.find(words), std::string::npos) << message;
  };
  refused([](nlohmann::json& j) { j = "gloo"; }, "\"backend\" is \"gloo\", not an object");
  refused([](nlohmann::json& j) { j["plugins"] = 3; }, "\"backend.plugins\" is 3, not a list");
  refused([](nlohmann::json& j) { j["plugins"][0].erase("resolved"); }, "\"backend.plugins[0].resolved\" is missing");
  refused([](nlohmann::json& j) { j["plugins"][0]["abi"] = "3"; }, "\"backend.plugins[0].abi\" is \"3\"");
  refused([](nlohmann::json& j) { j["plugins"][0]["option"] = "--engine"; }, "not --comm or --kernels");
  // A name goes into the replay line, so only a variable's name is taken.
  refused([](nlohmann::json& j) { j["plugins"][0]["env"] = {{"A; rm -rf x", "1"}}; }, "not an environment variable");
  EXPECT_NE(refusal([](nlohmann::json& j) {
              j["plugins"][0]["env"]["DPCHECK_GLOO_ALGORITHM"] = 4;
            }).find("\"backend.plugins[0].env.DPCHECK_GLOO_ALGORITHM\" is 4, not a string or null"),
            std::string::npos);
  EXPECT_NE(refusal([](nlohmann::json& j) {
              j["mpi_env"]["set"] = {{"OMPI_MCA_coll", nullptr}};
            }).find("\"backend.mpi_env.set.OMPI_MCA_coll\" is null, not a string"),
            std::string::npos);
}

TEST(BackendRecord, TheSameBackendAndEnvironmentDifferInNothing) {
  set_env("DPCHECK_GLOO_ALGORITHM", "ring");
  BackendRecord r;
  r.plugins.push_back(gloo_like());
  EXPECT_TRUE(backend_differences(r, r).empty()) << joined_lines(backend_differences(r, r));
}

TEST(BackendRecord, EachDifferenceIsOneLineNamingIt) {
  BackendRecord was;
  was.plugins.push_back(gloo_like());
  BackendRecord now = was;
  PluginRecord& p = now.plugins[0];
  p.name = "gloo allreduce_ring";
  p.version = "Gloo 0.6.0";
  p.abi = 2;
  p.xxh3 = "00000000000000ff";
  p.dtypes = {"float32"};
  set_env("DPCHECK_GLOO_ALGORITHM", "allreduce_ring");
  const std::vector<std::string> lines = backend_differences(was, now);
  EXPECT_EQ(lines.size(), 6u) << joined_lines(lines);
  for (const char* line : {"the bundle ran with DPCHECK_GLOO_ALGORITHM=ring; it is now allreduce_ring",
                           "the bundle ran with --comm plugin 'gloo ring'; it is now 'gloo allreduce_ring'",
                           "the bundle ran with --comm plugin version Gloo 0.5.0; it is now Gloo 0.6.0",
                           "the bundle ran with --comm plugin ABI 3; it is now 2",
                           "the bundle ran with --comm plugin file of XXH3 0123456789abcdef; it is now "
                           "00000000000000ff (the file changed since the run)",
                           "the bundle ran with --comm plugin dtypes float32, float64, int64; it is now float32"})
    EXPECT_TRUE(contains(lines, line)) << "lacks: " << line << "\n" << joined_lines(lines);

  set_env("DPCHECK_GLOO_ALGORITHM", nullptr);
  EXPECT_TRUE(
      contains(backend_differences(was, was), "the bundle ran with DPCHECK_GLOO_ALGORITHM=ring; it is now unset"));
  was.plugins[0].env["DPCHECK_GLOO_ALGORITHM"] = std::nullopt;
  set_env("DPCHECK_GLOO_ALGORITHM", "bcube");
  EXPECT_EQ(backend_differences(was, was),
            std::vector<std::string>{"the bundle ran with DPCHECK_GLOO_ALGORITHM unset; it is now bcube"});
  set_env("DPCHECK_GLOO_ALGORITHM", "");
  EXPECT_EQ(backend_differences(was, was),
            std::vector<std::string>{"the bundle ran with DPCHECK_GLOO_ALGORITHM unset; it is now ''"});
}

// A replay re-targeted to another communicator compares nothing of the recorded one: it says it is
// re-targeted, and the other plugin is not a difference.
TEST(BackendRecord, ARetargetedPluginIsNotCompared) {
  set_env("DPCHECK_GLOO_ALGORITHM", "bcube");
  BackendRecord was;
  was.plugins.push_back(gloo_like());
  EXPECT_TRUE(backend_differences(was, BackendRecord{}).empty());
  BackendRecord other = was;
  other.plugins[0].path = "./libother.so";
  other.plugins[0].name = "other";
  EXPECT_TRUE(backend_differences(was, other).empty()) << joined_lines(backend_differences(was, other));
}

TEST(BackendRecord, MpiVariablesSetOrChangedAreNamed) {
  set_env("OMPI_MCA_coll_tuned_allreduce_algorithm", "2");
  set_env("OMPI_MCA_coll_tuned_use_dynamic_rules", "1");
  set_env("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM", nullptr);
  BackendRecord was;
  was.env_prefixes = mpi_env_prefixes();
  was.library_env = {{"OMPI_MCA_coll_tuned_allreduce_algorithm", "4"}, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM", "ring"}};
  const std::vector<std::string> lines = backend_differences(was, was);
  EXPECT_TRUE(contains(lines, "the bundle ran with OMPI_MCA_coll_tuned_allreduce_algorithm=4; it is now 2"))
      << joined_lines(lines);
  EXPECT_TRUE(contains(lines, "the bundle ran with MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring; it is now unset"))
      << joined_lines(lines);
  EXPECT_TRUE(contains(lines, "the bundle ran with OMPI_MCA_coll_tuned_use_dynamic_rules unset; it is now 1"))
      << joined_lines(lines);
  // On a backend that is not MPI's (a replay re-targeted to local), they are not compared.
  EXPECT_TRUE(backend_differences(was, BackendRecord{}).empty());
  // Recorded on a built-in MPI backend, and only those that are set.
  if (!find_backend("mpi")) GTEST_SKIP() << "this build has no MPI backend";
  Target mpi;
  mpi.backend = find_backend("mpi");
  const BackendRecord rec = record_backend(mpi);
  EXPECT_EQ(rec.env_prefixes, mpi_env_prefixes());
  EXPECT_EQ(rec.library_env.at("OMPI_MCA_coll_tuned_allreduce_algorithm"), std::optional<std::string>("2"));
  EXPECT_FALSE(rec.library_env.contains("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"));
  Target local;
  local.backend = find_backend("local");
  EXPECT_TRUE(record_backend(local).to_json() == nlohmann::json({{"plugins", nlohmann::json::array()}}))
      << record_backend(local).to_json().dump();
}

TEST(BackendRecord, TheReplayLineSetsTheRecordedVariables) {
  BackendRecord r;
  EXPECT_EQ(recorded_env_prefix(r), "");
  Target local;
  local.backend = find_backend("local");
  EXPECT_EQ(bundle_replay_command(local, "b", &r), "dpcheck replay b");
  r.plugins.push_back(gloo_like());
  EXPECT_EQ(bundle_replay_command(local, "b", &r), "DPCHECK_GLOO_ALGORITHM=ring dpcheck replay b");
  r.plugins[0].env = {{"DPCHECK_GLOO_ALGORITHM", std::nullopt}, {"GLOO_CHUNK", "a b"}};
  // Unset as it was, whatever the shell holds now; values as one shell word.
  EXPECT_EQ(recorded_env_prefix(r), "env -u DPCHECK_GLOO_ALGORITHM GLOO_CHUNK='a b' ");
}

// The tests' plugin lists its variable; the record has its file, its table and the variable's value.
TEST(BackendRecord, APluginsVariablesAreRecorded) {
  set_env(kOrder, "own");
  Target t;
  t.backend = &backend_for("cpu", kOrderPlugin);
  const BackendRecord r = record_backend(t);
  ASSERT_EQ(r.plugins.size(), 1u);
  const PluginRecord& p = r.plugins[0];
  EXPECT_EQ(p.option, "--comm");
  EXPECT_EQ(p.path, kOrderPlugin);
  EXPECT_EQ(p.resolved, fs::canonical(kOrderPlugin).string());
  EXPECT_EQ(p.xxh3, file_xxh3(kOrderPlugin));
  EXPECT_EQ(p.name, "broken");
  EXPECT_EQ(p.version, "test 1");
  EXPECT_EQ(p.abi, 3u);
  EXPECT_EQ(p.env, (EnvValues{{kOrder, "own"}}));
  EXPECT_TRUE(r.env_prefixes.empty());
  set_env(kOrder, nullptr);
  EXPECT_EQ(record_backend(t).plugins[0].env, (EnvValues{{kOrder, std::nullopt}}));
}

// ---- end to end: train leaves a bundle, replay compares -------------------------------------------

fs::path only_bundle(const fs::path& dir) {
  fs::path bundle;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("dpcheck-bundle-")) bundle = e.path();
  return bundle;
}

std::size_t warnings_in(const std::string& output) {
  std::size_t n = 0;
  for (std::size_t at = output.find("\nwarning: "); at != std::string::npos; at = output.find("\nwarning: ", at + 1))
    ++n;
  return n;
}

// Trains over `plugin` on 3 ranks with `env` in front, which must fail the replica check, and returns
// the bundle it leaves.
fs::path failing_bundle(const fs::path& dir, const std::string& plugin, const std::string& env) {
  const CommandResult run =
      run_command(env + " " + DPCHECK_BINARY + " train --comm " + plugin +
                      " --world-size 3 --steps 3 --model 8,16,4 --batch 12 --bundle-dir " + dir.string(),
                  120);
  EXPECT_EQ(run.status, 1) << run.output;
  const fs::path bundle = only_bundle(dir);
  EXPECT_FALSE(bundle.empty()) << run.output;
  EXPECT_NE(run.output.find("replay it with: " + env + " dpcheck replay " + bundle.string()), std::string::npos)
      << run.output;
  return bundle;
}

TEST(BackendRecord, AChangedVariableIsNamedOnReplayAndAnUnchangedOneIsNot) {
  const ScratchDir dir;
  const fs::path bundle = failing_bundle(dir.path(), kOrderPlugin, "DPCHECK_TEST_COMM_ORDER=own");
  ASSERT_FALSE(bundle.empty());
  const nlohmann::json m = nlohmann::json::parse(read_file(bundle / "manifest.json"));
  EXPECT_EQ(m["backend"]["plugins"][0]["env"], nlohmann::json({{kOrder, "own"}})) << m["backend"].dump();

  const std::string replay = std::string(DPCHECK_BINARY) + " replay " + bundle.string();
  const CommandResult same = run_command("DPCHECK_TEST_COMM_ORDER=own " + replay, 120);
  EXPECT_EQ(same.status, 1) << same.output;
  EXPECT_EQ(warnings_in(same.output), 0u) << same.output;
  EXPECT_EQ(same.output.find("to replay with the bundle's environment"), std::string::npos) << same.output;
  EXPECT_NE(same.output.find("reproduced bit for bit"), std::string::npos) << same.output;

  const CommandResult changed = run_command("DPCHECK_TEST_COMM_ORDER=rank " + replay, 120);
  EXPECT_EQ(changed.status, 0) << changed.output;
  EXPECT_EQ(warnings_in(changed.output), 1u) << changed.output;
  EXPECT_NE(changed.output.find("\nwarning: the bundle ran with DPCHECK_TEST_COMM_ORDER=own; it is now rank\n"),
            std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("to replay with the bundle's environment: DPCHECK_TEST_COMM_ORDER=own dpcheck replay " +
                                bundle.string()),
            std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("NOT reproduced"), std::string::npos) << changed.output;
  EXPECT_NE(changed.output.find("the backend is not the one the bundle ran on"), std::string::npos) << changed.output;

  const CommandResult unset = run_command("env -u DPCHECK_TEST_COMM_ORDER " + replay, 120);
  EXPECT_NE(unset.output.find("\nwarning: the bundle ran with DPCHECK_TEST_COMM_ORDER=own; it is now unset\n"),
            std::string::npos)
      << unset.output;

  // Re-targeted to dpcheck's own communicator: the plugin's variable is not the replay's.
  const CommandResult local = run_command("env -u DPCHECK_TEST_COMM_ORDER " + replay + " --comm local", 120);
  EXPECT_EQ(local.status, 0) << local.output;
  EXPECT_EQ(warnings_in(local.output), 0u) << local.output;
}

// A bundle names its target by name, and replay finds the rows once it knows the target it runs: a
// bundle whose plugin is gone from this machine is refused on its own target in one line naming the
// plugin, and replays re-targeted to another communicator.
TEST(BackendRecord, ABundleWhosePluginIsGoneReplaysOnAnotherCommunicator) {
  const ScratchDir dir;
  const fs::path bundle = failing_bundle(dir.path(), kOrderPlugin, "DPCHECK_TEST_COMM_ORDER=own");
  ASSERT_FALSE(bundle.empty());
  const std::string gone = (dir.path() / "moved" / "libdpcheck_test_comm_order.so").string();
  nlohmann::json m = nlohmann::json::parse(read_file(bundle / "manifest.json"));
  m["target"]["comm"] = gone;
  std::ofstream(bundle / "manifest.json", std::ios::trunc) << m.dump(2) << "\n";
  EXPECT_EQ(read_bundle(bundle).manifest.target.comm, gone);  // read, not loaded

  const std::string replay =
      "env -u DPCHECK_TEST_COMM_ORDER " + std::string(DPCHECK_BINARY) + " replay " + bundle.string();
  const CommandResult own = run_command(replay, 120);
  EXPECT_EQ(own.status, 2) << own.output;
  EXPECT_NE(own.output.find(gone), std::string::npos) << own.output;
  EXPECT_EQ(own.output.find('\n'), own.output.size() - 1) << own.output;
  const CommandResult local = run_command(replay + " --comm local", 120);
  EXPECT_EQ(local.status, 0) << local.output;
  EXPECT_NE(local.output.find("(re-targeted)"), std::string::npos) << local.output;
}

// A bundle written before bundles named their backend replays as it did, saying that nothing is compared.
TEST(BackendRecord, ABundleWithoutARecordStillReplays) {
  const ScratchDir dir;
  const fs::path bundle = failing_bundle(dir.path(), kOrderPlugin, "DPCHECK_TEST_COMM_ORDER=own");
  ASSERT_FALSE(bundle.empty());
  nlohmann::json m = nlohmann::json::parse(read_file(bundle / "manifest.json"));
  m.erase("backend");
  std::ofstream(bundle / "manifest.json", std::ios::trunc) << m.dump(2) << "\n";
  EXPECT_EQ(read_bundle(bundle).manifest.backend, std::nullopt);
  const CommandResult again =
      run_command("DPCHECK_TEST_COMM_ORDER=rank " + std::string(DPCHECK_BINARY) + " replay " + bundle.string(), 120);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(warnings_in(again.output), 0u) << again.output;
  EXPECT_NE(again.output.find("note: the bundle records no backend"), std::string::npos) << again.output;
}

#ifdef DPCHECK_GLOO_PLUGIN
// Gloo's ring at 3 ranks leaves the ranks with different bits (examples/comm_gloo/README.md): its bundle
// replays with its algorithm, bit for bit, and a replay under another algorithm is told which variable.
TEST(BackendRecord, AGlooBundleReplaysWithItsAlgorithm) {
  const ScratchDir dir;
  const fs::path bundle = failing_bundle(dir.path(), DPCHECK_GLOO_PLUGIN, "DPCHECK_GLOO_ALGORITHM=ring");
  ASSERT_FALSE(bundle.empty());
  const nlohmann::json plugin = nlohmann::json::parse(read_file(bundle / "manifest.json"))["backend"]["plugins"][0];
  EXPECT_EQ(plugin["name"], "gloo ring") << plugin.dump();
  EXPECT_EQ(plugin["env"], nlohmann::json({{"DPCHECK_GLOO_ALGORITHM", "ring"}})) << plugin.dump();

  const std::string replay = std::string(DPCHECK_BINARY) + " replay " + bundle.string();
  const CommandResult same = run_command("DPCHECK_GLOO_ALGORITHM=ring " + replay, 120);
  EXPECT_EQ(same.status, 1) << same.output;
  EXPECT_EQ(warnings_in(same.output), 0u) << same.output;
  EXPECT_NE(same.output.find("reproduced bit for bit"), std::string::npos) << same.output;

  const CommandResult changed = run_command("DPCHECK_GLOO_ALGORITHM=allreduce_ring " + replay, 120);
  EXPECT_EQ(changed.status, 0) << changed.output;
  EXPECT_EQ(warnings_in(changed.output), 2u) << changed.output;
  EXPECT_NE(changed.output.find("\nwarning: the bundle ran with DPCHECK_GLOO_ALGORITHM=ring; "
                                "it is now allreduce_ring\n"),
            std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("\nwarning: the bundle ran with --comm plugin 'gloo ring'; "
                                "it is now 'gloo allreduce_ring'\n"),
            std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("to replay with the bundle's environment: DPCHECK_GLOO_ALGORITHM=ring dpcheck replay"),
            std::string::npos)
      << changed.output;
}
#endif

}  // namespace
}  // namespace dpcheck
