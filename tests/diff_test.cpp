// dpcheck diff (divergence/diff.hpp). Traces are written here line by line in the format of train --trace, with
// digests that name what they stand for (the step, the rank, the tensor), so that two traces built alike
// agree and a planted change is the only difference: each must be found exactly where it was planted --
// step, phase, rank, tensor -- and not before. Directories of .npy tensors are written with write_npy:
// equal ones pass, a change of one ulp is found at its index and passes --ulp 1 but not bit for bit, and
// so on through relative tolerances, PyTorch names, missing files, shapes, dtypes and NaNs. Last, the
// command itself: its exit statuses 0, 1 and 2 and its JSON report.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "divergence/diff.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/io/npy.hpp"
#include "src/train/replica_check.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- traces written by hand -------------------------------------------------------------------------

std::string digest_of(const std::string& what) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash_bytes(what.data(), what.size())));
  return buf;
}

json tensor(const std::string& what, double max_abs = 0.5) {
  return {{"digest", digest_of(what)}, {"max_abs", max_abs}, {"sum", -1.25}, {"non_finite", 0}};
}

const std::vector<std::string> kTensors{"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"};

struct RunSpec {
  int world = 2;
  int steps = 5;
  double lr = 0.01;
  std::vector<std::string> state{"momentum_buffer"};
  std::vector<std::string> tensors = kTensors;
};

json header(const RunSpec& r) {
  return {{"dpcheck_trace", 1},
          {"dpcheck_version", "0.1.0"},
          {"config",
           {{"model", "4,3,2"},
            {"optimizer", "momentum"},
            {"lr", r.lr},
            {"batch", 8},
            {"seed", 0},
            {"world_size", r.world}}},
          {"target", {{"engine", "cpu"}, {"comm", "local"}, {"kernels", ""}, {"mutant", ""}, {"tf32", false}}},
          {"world_size", r.world},
          {"digest", "xxh3"},
          {"tensors", r.tensors},
          {"state", r.state}};
}

// Step s: what a rank holds alone (its indices, local gradient, collective input) is named by its rank
// and the world size; what every rank holds alike (the reduced gradient, parameters, state, the
// collective's output) is not, so that runs of different world sizes share it.
json step_line(const RunSpec& r, int s) {
  const std::string at = "step " + std::to_string(s) + " ";
  const std::string mine = " of " + std::to_string(r.world);
  const auto list = [&](const std::string& what) {
    json l = json::array();
    for (const std::string& t : r.tensors) l.push_back(tensor(at + what + " " + t));
    return l;
  };
  json ranks = json::array(), coll_ranks = json::array();
  for (int k = 0; k < r.world; ++k) {
    const std::string rank = "rank " + std::to_string(k) + mine;
    json state = json::array();
    for (const std::string& block : r.state) state.push_back(list("state " + block));
    json local = json::array();
    for (const std::string& t : r.tensors) local.push_back(tensor(at + rank + " local " + t));
    ranks.push_back({{"rank", k},
                     {"indices", {{"count", 8 / r.world}, {"digest", digest_of(at + rank + " indices")}}},
                     {"local_grad", local},
                     {"reduced_grad", list("reduced")},
                     {"params", list("params")},
                     {"state", state}});
    coll_ranks.push_back({{"in", digest_of(at + rank + " in")}, {"out", digest_of(at + "out")}});
  }
  return {{"step", s},
          {"loss", 2.0 - 0.125 * s},
          {"global_batch", 8},
          {"ranks", ranks},
          {"collectives", json::array({{{"seq", s},
                                        {"call", "allreduce"},
                                        {"op", "avg"},
                                        {"dtype", "float32"},
                                        {"count", 26},
                                        {"ranks", coll_ranks}}})},
          {"checks", {{"finite", true}}}};
}

struct Trace {
  json head;
  std::vector<json> steps;
};

Trace trace(const RunSpec& r) {
  Trace t{header(r), {}};
  for (int s = 0; s < r.steps; ++s) t.steps.push_back(step_line(r, s));
  return t;
}

fs::path write_trace(const fs::path& path, const Trace& t) {
  std::ofstream out(path);
  out << t.head.dump() << "\n";
  for (const json& s : t.steps) out << s.dump() << "\n";
  return path;
}

class DiffTraces : public testing::Test {
 protected:
  TraceDiff diff(const Trace& a, const Trace& b) {
    return diff_traces(write_trace(dir_ / "a.jsonl", a), write_trace(dir_ / "b.jsonl", b));
  }
  static std::string report(const TraceDiff& d) {
    std::ostringstream out;
    print_trace_diff(out, d);
    return out.str();
  }
  const ScratchDir dir_;
};

TEST_F(DiffTraces, IdenticalTracesMatchEveryStepInOneLine) {
  const TraceDiff d = diff(trace(RunSpec{}), trace(RunSpec{}));
  EXPECT_TRUE(d.identical());
  EXPECT_TRUE(d.config_differences.empty());
  EXPECT_EQ(d.steps_compared, 5);
  // Per step: indices 2, local 8, collective 2x2 + its count 1, reduced 8, params 8, state 8, loss 1.
  EXPECT_EQ(d.items_compared, 5 * 40);
  EXPECT_EQ(d.first(), nullptr);
  EXPECT_EQ(report(d), "identical: 5 steps matched (200 items compared; world size 2)\n");
}

TEST_F(DiffTraces, ADifferentIndexDigestIsFoundOnItsRankInTheDataPhase) {
  Trace a = trace(RunSpec{}), b = trace(RunSpec{});
  b.steps[2]["ranks"][1]["indices"]["digest"] = digest_of("another shard");
  // What follows from other data, later in the step and in later steps, must not hide where it began.
  b.steps[2]["ranks"][1]["local_grad"][0] = tensor("other local");
  b.steps[2]["loss"] = 3.0;
  b.steps[3]["loss"] = 3.0;
  const TraceDiff d = diff(a, b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->step, 2);
  EXPECT_EQ(d.first()->phase, TracePhase::data);
  EXPECT_EQ(d.first()->rank, 1);
  EXPECT_EQ(d.first()->item, "indices");
  EXPECT_NE(d.first()->b.find(digest_of("another shard")), std::string::npos);
  ASSERT_EQ(d.first_step.size(), 3u);
  EXPECT_EQ(d.first_step[1].phase, TracePhase::local_gradient);
  EXPECT_EQ(d.first_step[1].item, "local_grad layers.0.weight");
  EXPECT_EQ(d.first_step[2].phase, TracePhase::loss);
  ASSERT_EQ(d.differing_steps.size(), 2u);
  EXPECT_EQ(d.differing_steps[0].step, 2);
  EXPECT_EQ(d.differing_steps[0].differing, 3);
  EXPECT_EQ(d.differing_steps[0].compared, 40);
  EXPECT_EQ(d.differing_steps[1].step, 3);
  EXPECT_FALSE(d.identical());
  const std::string text = report(d);
  EXPECT_NE(text.find("first difference: step 2, data, rank 1, indices"), std::string::npos) << text;
  EXPECT_NE(text.find("step 2: 3 of 40 items differ (data 1, local gradient 1, loss 1)"), std::string::npos) << text;
  EXPECT_NE(text.find("later: 1 more step differs (3)"), std::string::npos) << text;
}

TEST_F(DiffTraces, ADifferentCollectiveOutputOnRankOneComesBeforeTheReducedGradient) {
  Trace a = trace(RunSpec{}), b = trace(RunSpec{});
  b.steps[1]["collectives"][0]["ranks"][1]["out"] = digest_of("a wrong sum");
  b.steps[1]["ranks"][1]["reduced_grad"][2] = tensor("wrong reduced", 7.5);
  b.steps[1]["ranks"][1]["params"][2] = tensor("wrong params");
  const TraceDiff d = diff(a, b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->step, 1);
  EXPECT_EQ(d.first()->phase, TracePhase::all_reduce);
  EXPECT_EQ(d.first()->rank, 1);
  EXPECT_EQ(d.first()->item, "collective seq 1 allreduce avg float32 count 26 out");
  EXPECT_EQ(d.first()->a, digest_of("step 1 out"));
  EXPECT_EQ(d.first()->b, digest_of("a wrong sum"));
  ASSERT_EQ(d.first_step.size(), 3u);
  EXPECT_EQ(d.first_step[1].item, "reduced_grad layers.1.weight");
  ASSERT_TRUE(d.first_step[1].tensor_b.has_value());
  EXPECT_EQ(d.first_step[1].tensor_b->max_abs, 7.5);
  EXPECT_EQ(d.first_step[2].phase, TracePhase::optimizer);
}

TEST_F(DiffTraces, ADifferentParamTensorOnRankZeroAtStepThreeIsNamedWithBothSummaries) {
  Trace a = trace(RunSpec{}), b = trace(RunSpec{});
  for (int s = 3; s < 5; ++s) {
    b.steps[static_cast<std::size_t>(s)]["ranks"][0]["params"][2] = tensor("drifted", 0.75);
    b.steps[static_cast<std::size_t>(s)]["ranks"][0]["params"][2]["non_finite"] = 1;
  }
  const TraceDiff d = diff(a, b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->where(), "step 3, optimizer, rank 0, params layers.1.weight");
  ASSERT_TRUE(d.first()->tensor_a && d.first()->tensor_b);
  EXPECT_EQ(d.first()->tensor_a->max_abs, 0.5);
  EXPECT_EQ(d.first()->tensor_b->max_abs, 0.75);
  EXPECT_EQ(d.first()->tensor_b->non_finite, 1);
  EXPECT_EQ(d.first_step.size(), 1u);
  ASSERT_EQ(d.differing_steps.size(), 2u);
  EXPECT_EQ(d.differing_steps[1].step, 4);
  const std::string text = report(d);
  EXPECT_NE(
      text.find("  A: digest " + digest_of("step 3 params layers.1.weight") + "  max_abs 0.5  sum -1.25  non_finite 0"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("  B: digest " + digest_of("drifted") + "  max_abs 0.75  sum -1.25  non_finite 1"),
            std::string::npos)
      << text;
}

TEST_F(DiffTraces, TheOptimizerStateIsComparedAfterTheParameters) {
  Trace a = trace(RunSpec{}), b = trace(RunSpec{});
  b.steps[0]["ranks"][1]["state"][0][3] = tensor("other momentum");
  const TraceDiff d = diff(a, b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->where(), "step 0, optimizer, rank 1, state momentum_buffer layers.1.bias");
}

TEST_F(DiffTraces, DifferentWorldSizesCompareOnlyTheReplicatedState) {
  RunSpec two, four;
  four.world = 4;
  const TraceDiff same = diff(trace(two), trace(four));
  // Every rank's own items differ between the runs (other shards); none of them is compared.
  EXPECT_TRUE(same.identical()) << report(same);
  EXPECT_EQ(same.items_compared, 5 * (4 + 4 + 4 + 1));  // reduced_grad, params, state, loss
  ASSERT_EQ(same.notes.size(), 1u);
  EXPECT_NE(same.notes[0].find("only the replicated state"), std::string::npos);
  EXPECT_EQ(same.config_differences, std::vector<std::string>{"world_size 2 vs 4"});

  Trace b = trace(four);
  b.steps[2]["ranks"][0]["params"][0] = tensor("another sum order");
  const TraceDiff d = diff(trace(two), b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->where(), "step 2, optimizer, rank 0, params layers.0.weight");
  const std::string text = report(d);
  EXPECT_NE(text.find("note: the world sizes differ (2 and 4)"), std::string::npos) << text;
}

TEST_F(DiffTraces, AShorterTraceIsSaidAndFails) {
  RunSpec shorter;
  shorter.steps = 3;
  const TraceDiff d = diff(trace(RunSpec{}), trace(shorter));
  EXPECT_FALSE(d.identical());
  EXPECT_EQ(d.first(), nullptr);
  EXPECT_EQ(d.steps_compared, 3);
  EXPECT_EQ(d.only_in_a, 2);
  EXPECT_EQ(d.first_only_in_a, 3);
  const std::string text = report(d);
  EXPECT_NE(text.find("B is shorter: A has 2 steps that B lacks, from step 3"), std::string::npos) << text;
  EXPECT_NE(text.find("the 3 steps both traces hold match"), std::string::npos) << text;
}

TEST_F(DiffTraces, StepsPairByNumberSoAResumedTraceMeetsTheOther) {
  Trace resumed = trace(RunSpec{});
  resumed.steps.erase(resumed.steps.begin(), resumed.steps.begin() + 2);
  const TraceDiff d = diff(trace(RunSpec{}), resumed);
  EXPECT_EQ(d.steps_compared, 3);
  EXPECT_TRUE(d.differing_steps.empty());
  EXPECT_EQ(d.only_in_a, 2);
  EXPECT_EQ(d.first_only_in_a, 0);
  EXPECT_FALSE(d.identical());
}

TEST_F(DiffTraces, AnotherConfigurationIsListedButDoesNotFailByItself) {
  RunSpec other;
  other.lr = 0.1;
  Trace b = trace(other);
  b.head["target"]["engine"] = "cuda";
  const TraceDiff d = diff(trace(RunSpec{}), b);
  EXPECT_TRUE(d.identical());
  EXPECT_EQ(d.config_differences, (std::vector<std::string>{"lr 0.01 vs 0.1", "target.engine \"cpu\" vs \"cuda\""}));
  EXPECT_EQ(report(d),
            "configuration differs: lr 0.01 vs 0.1\nconfiguration differs: target.engine \"cpu\" vs \"cuda\"\n"
            "identical: 5 steps matched (200 items compared; world size 2)\n");
}

TEST_F(DiffTraces, ACollectiveOfAnotherSizeIsOneDifference) {
  Trace a = trace(RunSpec{}), b = trace(RunSpec{});
  b.steps[4]["collectives"][0]["count"] = 25;
  b.steps[4]["collectives"].push_back(b.steps[4]["collectives"][0]);
  const TraceDiff d = diff(a, b);
  ASSERT_NE(d.first(), nullptr);
  EXPECT_EQ(d.first()->where(), "step 4, all-reduce, collective 0 of the step");
  EXPECT_EQ(d.first()->b, "seq 4 allreduce avg float32 count 25");
  ASSERT_EQ(d.first_step.size(), 2u);
  EXPECT_EQ(d.first_step[1].item, "number of collectives");
  EXPECT_EQ(d.first_step[1].b, "2 collectives");
}

TEST_F(DiffTraces, DifferentModelsAreNotComparedStepByStep) {
  RunSpec other;
  other.tensors = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  const TraceDiff d = diff(trace(RunSpec{}), trace(other));
  EXPECT_FALSE(d.comparable);
  EXPECT_FALSE(d.identical());
  EXPECT_EQ(d.items_compared, 0);
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_NE(d.notes[0].find("different tensors"), std::string::npos);
}

TEST_F(DiffTraces, AnotherOptimizerLeavesItsStateUncomparedAndSaysSo) {
  RunSpec adam;
  adam.state = {"exp_avg", "exp_avg_sq"};
  const TraceDiff d = diff(trace(RunSpec{}), trace(adam));
  EXPECT_TRUE(d.comparable);
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_NE(d.notes[0].find("momentum_buffer (A), exp_avg (B), exp_avg_sq (B)"), std::string::npos) << d.notes[0];
}

// Every damaged trace is refused naming the file, the line and what is wrong there.
TEST_F(DiffTraces, ADamagedTraceIsRefusedNamingItsLine) {
  const fs::path good = write_trace(dir_ / "good.jsonl", trace(RunSpec{}));
  const auto refusal = [&](const std::string& text) {
    const fs::path bad = dir_ / "bad.jsonl";
    std::ofstream(bad) << text;
    return message_of<UsageError>([&] { diff_traces(good, bad); });
  };
  const std::string head = header(RunSpec{}).dump() + "\n";
  const std::string step0 = step_line(RunSpec{}, 0).dump() + "\n";
  EXPECT_NE(refusal(head + step0 + "{\"step\": 1, \"loss\n").find("bad.jsonl:3: not JSON"), std::string::npos);
  EXPECT_NE(refusal(head + "\n").find("bad.jsonl:2: empty line"), std::string::npos);
  json v2 = header(RunSpec{});
  v2["dpcheck_trace"] = 2;
  EXPECT_NE(
      refusal(v2.dump() + "\n").find("bad.jsonl:1: trace format version 2 is not one this dpcheck reads (version 1)"),
      std::string::npos);
  json no_digest = step_line(RunSpec{}, 1);
  no_digest["ranks"][1]["params"][2].erase("digest");
  EXPECT_NE(refusal(head + step0 + no_digest.dump() + "\n").find("bad.jsonl:3: ranks[1].params[2] has no \"digest\""),
            std::string::npos);
  json short_hex = step_line(RunSpec{}, 1);
  short_hex["collectives"][0]["ranks"][0]["out"] = "abc";
  EXPECT_NE(refusal(head + step0 + short_hex.dump() + "\n").find("collectives[0].ranks[0].out is \"abc\""),
            std::string::npos);
  json three_ranks = step_line(RunSpec{}, 1);
  three_ranks["ranks"].push_back(three_ranks["ranks"][0]);
  EXPECT_NE(refusal(head + three_ranks.dump() + "\n").find("\"ranks\" holds 3 entries where the header says 2"),
            std::string::npos);
  EXPECT_NE(refusal(head + step0 + step0).find("bad.jsonl:3: step 0 follows step 0"), std::string::npos);
  json other_digest = header(RunSpec{});
  other_digest["digest"] = "sha256";
  EXPECT_NE(refusal(other_digest.dump() + "\n").find("cannot be compared"), std::string::npos);
}

// ---- what a path holds --------------------------------------------------------------------------

TEST(DiffInputKind, TracesDirectoriesAndEverythingElse) {
  const ScratchDir dir;
  const fs::path t = write_trace(dir / "t.jsonl", trace(RunSpec{}));
  EXPECT_EQ(diff_input_kind(t, "A"), DiffInput::trace);
  EXPECT_EQ(diff_input_kind(dir.path(), "B"), DiffInput::npy_dir);
  EXPECT_NE(message_of<UsageError>([&] {
              diff_input_kind(dir / "missing", "B");
            }).find("B " + (dir / "missing").string() + ": no such file"),
            std::string::npos);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_NE(message_of<UsageError>([&] { diff_input_kind(dir / "fifo", "A"); }).find("a FIFO"), std::string::npos);
  const std::vector<std::int64_t> shape{2};
  const std::vector<float> v{1, 2};
  write_npy(dir / "x.npy", shape, std::span<const float>(v));
  EXPECT_NE(message_of<UsageError>([&] { diff_input_kind(dir / "x.npy", "A"); }).find("a single .npy file"),
            std::string::npos);
  std::ofstream(dir / "log.jsonl") << "{\"step\": 0}\n";
  EXPECT_NE(message_of<UsageError>([&] { diff_input_kind(dir / "log.jsonl", "A"); }).find("neither a trace"),
            std::string::npos);
  std::ofstream(dir / "empty");
  EXPECT_NE(message_of<UsageError>([&] { diff_input_kind(dir / "empty", "A"); }).find("neither a trace"),
            std::string::npos);
}

// ---- .npy directories ---------------------------------------------------------------------------

class DiffTensors : public testing::Test {
 protected:
  // A checkpoint-like directory: two layers, an optimizer block, the step count, a manifest.
  fs::path checkpoint(const std::string& name, float w13 = 0.3f) const {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    std::vector<float> w(12);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i) - 0.4f;
    w[3 * 3 + 1] = w13;  // element [3, 1] of a 4 x 3 weight
    write(d / "layers.0.weight.npy", {4, 3}, w);
    write(d / "layers.0.bias.npy", {4}, std::vector<float>{0.5f, -0.25f, 0, 1e-3f});
    write(d / "optimizer.exp_avg.npy", {16}, std::vector<float>(16, 1e-4f));
    const std::vector<std::int64_t> steps{12}, one{1};
    write_npy(d / "steps.npy", one, std::span<const std::int64_t>(steps));
    std::ofstream(d / "manifest.json") << "{\"step\": 12}\n";
    return d;
  }
  static void write(const fs::path& p, std::vector<std::int64_t> shape, const std::vector<float>& v) {
    write_npy(p, shape, std::span<const float>(v));
  }
  static const TensorDiff& named(const std::vector<TensorDiff>& diffs, const std::string& name) {
    for (const TensorDiff& t : diffs)
      if (t.name == name) return t;
    throw Error("no tensor " + name);
  }
  static Tolerance ulp(std::uint64_t k) {
    Tolerance t;
    t.kind = Tolerance::Kind::ulp;
    t.ulp = k;
    return t;
  }
  static Tolerance rtol(double r) {
    Tolerance t;
    t.kind = Tolerance::Kind::rtol;
    t.rtol = r;
    return t;
  }
  static std::string report(const fs::path& a, const fs::path& b, const std::vector<TensorDiff>& d,
                            const Tolerance& t) {
    std::ostringstream out;
    print_tensor_diffs(out, a, b, d, t);
    return out.str();
  }
  const ScratchDir dir_;
};

TEST_F(DiffTensors, EqualDirectoriesPassBitwiseAndTheManifestIsIgnored) {
  const fs::path a = checkpoint("a"), b = checkpoint("b");
  std::ofstream(b / "manifest.json") << "{\"step\": 12, \"written\": \"elsewhere\"}\n";
  const std::vector<TensorDiff> d = diff_tensor_dirs(a, b, Tolerance{});
  ASSERT_EQ(d.size(), 4u);
  EXPECT_TRUE(all_passed(d));
  for (const TensorDiff& t : d) {
    EXPECT_EQ(t.differing, 0) << t.name;
    EXPECT_EQ(t.first, -1) << t.name;
  }
  EXPECT_EQ(named(d, "layers.0.weight").count, 12);
  EXPECT_NE(report(a, b, d, Tolerance{}).find("ok: 4 tensors equal bitwise"), std::string::npos);
}

TEST_F(DiffTensors, OneUlpIsFoundAtItsIndexAndPassesUlpOneButNotBitwise) {
  const float w = 0.3f, next = std::nextafter(w, 1.0f);
  const fs::path a = checkpoint("a", w), b = checkpoint("b", next);
  const std::vector<TensorDiff> bitwise = diff_tensor_dirs(a, b, Tolerance{});
  const TensorDiff& t = named(bitwise, "layers.0.weight");
  EXPECT_FALSE(t.passed);
  EXPECT_FALSE(all_passed(bitwise));
  EXPECT_EQ(t.differing, 1);
  EXPECT_EQ(t.max_ulp, 1u);
  EXPECT_EQ(t.first, 10);
  EXPECT_EQ(t.first_index, "[3, 1]");
  EXPECT_EQ(t.first_a, float_bits_text(w));
  EXPECT_EQ(t.first_b, float_bits_text(next));
  EXPECT_DOUBLE_EQ(t.max_rel, (static_cast<double>(next) - w) / next);
  EXPECT_TRUE(named(bitwise, "layers.0.bias").passed);
  const std::string text = report(a, b, bitwise, Tolerance{});
  EXPECT_NE(text.find("FAILED: 1 of 4 tensors differ (tolerance: bitwise): layers.0.weight"), std::string::npos)
      << text;
  EXPECT_NE(text.find("[3, 1]: " + float_bits_text(w) + " vs " + float_bits_text(next)), std::string::npos) << text;

  EXPECT_TRUE(all_passed(diff_tensor_dirs(a, b, ulp(1))));
  EXPECT_FALSE(all_passed(diff_tensor_dirs(a, b, ulp(0))));
}

TEST_F(DiffTensors, RelativeToleranceIsTheLargerMagnitudesShare) {
  const float w = 0.3f, near = w * (1 + 1e-5f);
  const fs::path a = checkpoint("a", w), b = checkpoint("b", near);
  const TensorDiff t = named(diff_tensor_dirs(a, b, rtol(1e-4)), "layers.0.weight");
  EXPECT_TRUE(t.passed);
  EXPECT_NEAR(t.max_rel, 1e-5, 1e-6);
  EXPECT_GT(t.max_ulp, 1u);
  EXPECT_FALSE(named(diff_tensor_dirs(a, b, rtol(1e-6)), "layers.0.weight").passed);
  EXPECT_FALSE(named(diff_tensor_dirs(a, b, ulp(1)), "layers.0.weight").passed);
}

TEST_F(DiffTensors, APyTorchStateDictPairsByItsOwnNamesInNaturalOrder) {
  const ScratchDir& d = dir_;
  for (const char* side : {"a", "b"}) {
    fs::create_directories(d / side);
    for (const char* layer : {"fc1", "fc2", "fc10"}) {
      write(d / side / (std::string(layer) + ".weight.npy"), {3, 2}, {1, 2, 3, 4, 5, 6});
      write(d / side / (std::string(layer) + ".bias.npy"), {3}, {0.5f, 0.25f, side[0] == 'a' ? 0.125f : -0.125f});
    }
  }
  const std::vector<TensorDiff> diffs = diff_tensor_dirs(d / "a", d / "b", Tolerance{});
  std::vector<std::string> names;
  for (const TensorDiff& t : diffs) names.push_back(t.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "fc10.bias", "fc10.weight"}));
  for (const TensorDiff& t : diffs) {
    EXPECT_EQ(t.passed, t.name.ends_with("weight")) << t.name;
    if (t.name.ends_with("bias")) {
      EXPECT_EQ(t.first_index, "[2]");
      EXPECT_DOUBLE_EQ(t.max_rel, 2.0);  // the sign flipped: |a - b| is twice either magnitude
    }
  }
}

TEST_F(DiffTensors, FilesOnOneSideShapesAndDtypesFailNamed) {
  const fs::path a = checkpoint("a"), b = checkpoint("b");
  fs::remove(b / "optimizer.exp_avg.npy");
  write(b / "layers.0.bias.npy", {2, 2}, {0.5f, -0.25f, 0, 1e-3f});
  const std::vector<std::int64_t> one{1};
  const std::vector<double> twelve{12};
  write_npy(b / "steps.npy", one, std::span<const double>(twelve));
  write(b / "extra.npy", {1}, {0});
  const std::vector<TensorDiff> d = diff_tensor_dirs(a, b, ulp(1000));
  ASSERT_EQ(d.size(), 5u);
  EXPECT_EQ(named(d, "optimizer.exp_avg").status, TensorDiff::Status::only_in_a);
  EXPECT_EQ(named(d, "extra").status, TensorDiff::Status::only_in_b);
  EXPECT_EQ(named(d, "layers.0.bias").status_text(), "shape (4,) vs (2, 2)");
  EXPECT_EQ(named(d, "steps").status_text(), "dtype int64 vs float64");
  EXPECT_TRUE(named(d, "layers.0.weight").passed);
  for (const char* failing : {"optimizer.exp_avg", "extra", "layers.0.bias", "steps"})
    EXPECT_FALSE(named(d, failing).passed) << failing;
  const std::string text = report(a, b, d, ulp(1000));
  EXPECT_NE(
      text.find(
          "FAILED: 4 of 5 tensors differ (tolerance: --ulp 1000): extra (only in B), layers.0.bias (shape (4,) vs "
          "(2, 2)), optimizer.exp_avg (only in A), steps (dtype int64 vs float64)"),
      std::string::npos)
      << text;
}

TEST_F(DiffTensors, NaNsEqualOnlyBitForBitAndInt64ComparesExactly) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float other_nan = std::bit_cast<float>(std::bit_cast<std::uint32_t>(nan) | 1u);
  const fs::path a = checkpoint("a", nan), b = checkpoint("b", nan), c = checkpoint("c", other_nan),
                 n = checkpoint("n", 0.3f);
  EXPECT_TRUE(all_passed(diff_tensor_dirs(a, b, Tolerance{})));
  const TensorDiff payload = named(diff_tensor_dirs(a, c, ulp(1'000'000)), "layers.0.weight");
  EXPECT_FALSE(payload.passed);
  EXPECT_EQ(payload.max_ulp, infinite_ulp);
  const TensorDiff number = named(diff_tensor_dirs(a, n, rtol(1e30)), "layers.0.weight");
  EXPECT_FALSE(number.passed);
  EXPECT_TRUE(std::isinf(number.max_rel));
  EXPECT_EQ(number.first_index, "[3, 1]");
  // The largest --ulp there is still does not admit a NaN against a number.
  EXPECT_FALSE(named(diff_tensor_dirs(a, n, ulp(infinite_ulp)), "layers.0.weight").passed);

  const std::vector<std::int64_t> one{1}, thirteen{13};
  write_npy(b / "steps.npy", one, std::span<const std::int64_t>(thirteen));
  const TensorDiff steps = named(diff_tensor_dirs(a, b, ulp(1'000'000)), "steps");
  EXPECT_FALSE(steps.passed);
  EXPECT_EQ(steps.first_a, "12");
  EXPECT_EQ(steps.first_b, "13");
}

TEST_F(DiffTensors, Float64CountsItsOwnUlps) {
  const ScratchDir& d = dir_;
  const std::vector<std::int64_t> shape{2, 2};
  const std::vector<double> x{1, 2, 3, 4};
  std::vector<double> y = x;
  y[2] = std::nextafter(3.0, 4.0);
  fs::create_directories(d / "a");
  fs::create_directories(d / "b");
  write_npy(d / "a" / "p.npy", shape, std::span<const double>(x));
  write_npy(d / "b" / "p.npy", shape, std::span<const double>(y));
  const TensorDiff t = diff_tensor_dirs(d / "a", d / "b", ulp(1)).front();
  EXPECT_TRUE(t.passed);
  EXPECT_EQ(t.max_ulp, 1u);
  EXPECT_EQ(t.first_index, "[1, 0]");
  EXPECT_EQ(t.first_a, "3 (0x4008000000000000)");
}

TEST_F(DiffTensors, ADirectoryWithoutNpyFilesIsRefusedWithAHint) {
  const fs::path a = checkpoint("a");
  fs::create_directories(dir_ / "ckpt" / "step-00000010");
  fs::create_directories(dir_ / "ckpt" / "step-00000012");
  const std::string m = message_of<UsageError>([&] { diff_tensor_dirs(a, dir_ / "ckpt", Tolerance{}); });
  EXPECT_NE(m.find("B " + (dir_ / "ckpt").string() + " holds no .npy files"), std::string::npos) << m;
  EXPECT_NE(m.find("step-00000010 ... step-00000012: give one of them"), std::string::npos) << m;
  fs::create_directories(dir_ / "empty");
  EXPECT_NE(message_of<UsageError>([&] { diff_tensor_dirs(dir_ / "empty", a, Tolerance{}); }).find("A "),
            std::string::npos);
}

// ---- the command ----------------------------------------------------------------------------------

CommandResult dpcheck_diff(const std::string& args) {
  return run_command(std::string(DPCHECK_BINARY) + " diff " + args, 60);
}

TEST(DiffCommand, ExitStatusesAndTheJsonReport) {
  const ScratchDir dir;
  const Trace same = trace(RunSpec{});
  Trace other = trace(RunSpec{});
  other.steps[3]["ranks"][0]["params"][2] = tensor("drifted");
  const std::string a = write_trace(dir / "a.jsonl", same).string(), b = write_trace(dir / "b.jsonl", same).string(),
                    c = write_trace(dir / "c.jsonl", other).string(), json_path = (dir / "r.json").string();

  CommandResult r = dpcheck_diff(a + " " + b);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "identical: 5 steps matched (200 items compared; world size 2)\n");

  r = dpcheck_diff(a + " " + c + " --json " + json_path);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("first difference: step 3, optimizer, rank 0, params layers.1.weight"), std::string::npos)
      << r.output;
  const json report = json::parse(read_file(json_path));
  EXPECT_FALSE(report["identical"].get<bool>());
  EXPECT_EQ(report["first_difference"]["step"], 3);
  EXPECT_EQ(report["first_difference"]["phase"], "optimizer");
  EXPECT_EQ(report["first_difference"]["rank"], 0);

  fs::create_directories(dir / "p");
  const std::vector<std::int64_t> shape{2};
  const std::vector<float> v{1, 2};
  write_npy(dir / "p" / "fc1.bias.npy", shape, std::span<const float>(v));
  r = dpcheck_diff((dir / "p").string() + " " + (dir / "p").string() + " --rtol 0");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ok: 1 tensor within --rtol 0"), std::string::npos) << r.output;

  // Bad usage: one line, status 2, no report written.
  fs::remove(json_path);
  for (const std::string& bad :
       {a + " " + (dir / "p").string(), a + " " + b + " --ulp 1", a + " " + (dir / "nothing").string(),
        (dir / "p").string() + " " + (dir / "p").string() + " --ulp 1 --rtol 0"}) {
    r = dpcheck_diff(bad + " --json " + json_path);
    EXPECT_EQ(r.status, 2) << bad << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.rfind("dpcheck: error: ", 0), 0u) << r.output;
    EXPECT_FALSE(fs::exists(json_path)) << bad;
  }
}

}  // namespace
}  // namespace dpcheck
