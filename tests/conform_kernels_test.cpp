// conform --kernels (conform/conform_kernels.cpp) against the naive kernels
// (examples/kernels_naive/) and the broken ones (tests/plugins/kernels/): the naive kernels pass every
// check, on every class of shapes up to the size limit, empty batches included; each broken plugin fails
// the one check its bug breaks, with a small minimal case whose replay (--check NAME --case TEXT) fails
// again while every other check passes; a bug that only shows past 512 is caught by the default sizes and
// not under a limit of 256; and the kill matrix goes on through the engine: verify, train and grad with
// --kernels run the plugin's kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "conform/conform.hpp"
#include "properties/conform_rows.hpp"
#include "src/error.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

constexpr const char* kPrefix = "dpcheck conform --kernels plugin.so";

ConformOptions quick(int cases) {
  ConformOptions o;
  o.cases = cases;
  o.seed = 11;
  o.properties = nullptr;
  o.replay_prefix = kPrefix;
  return o;
}

Target with_kernels(const char* path) {
  Target t;
  t.kernels = path;
  return t;
}

const ConformRow* find_row(const std::vector<ConformRow>& rows, const std::string& check) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const ConformRow& r) { return r.check == check; });
  return it == rows.end() ? nullptr : &*it;
}

std::string describe(const ConformRow& r) {
  return r.check + ": " +
         std::string(r.verdict == ConformVerdict::pass   ? "pass"
                     : r.verdict == ConformVerdict::fail ? "FAIL"
                                                         : "other") +
         " " + r.detail + (r.minimal.empty() ? "" : " [" + r.minimal + "]");
}

constexpr const char* kOps[] = {"linear_forward",        "linear_backward", "activation_forward", "activation_backward",
                                "loss_forward_backward", "sgd_step",        "momentum_step",      "adam_step"};

// The classes of shapes every op draws; the linear ops draw empty batches too.
const std::set<std::string> kShapeClasses = {"tiny", "tile edges", "odd", "past a power of two", "large"};
const std::set<std::string> kLinearShapeClasses = {"tiny",  "tile edges", "odd", "past a power of two",
                                                   "large", "rows = 0"};

std::set<std::string> class_names(const ConformRow& r) {
  std::set<std::string> names;
  for (const auto& [name, ratio] : r.ratio_by_shape_class) names.insert(name);
  return names;
}

// At the command's default of 30 cases: every class of shapes up to the default size limit, rows = 0
// among them, passes, and each row says the largest error ratio of each class.
TEST(ConformKernels, NaiveKernelsPassEveryCheck) {
  int called = 0;
  ConformOptions o = quick(30);
  o.on_row = [&](const ConformRow&) { ++called; };
  const std::vector<ConformRow> rows = conform_kernels(with_kernels(DPCHECK_KERNELS_NAIVE), o);
  for (const ConformRow& r : rows) std::printf("  %s (%.3f s)\n", describe(r).c_str(), r.seconds);
  ASSERT_EQ(rows.size(), 2 * std::size(kOps));
  EXPECT_EQ(called, static_cast<int>(rows.size()));
  for (const char* op : kOps)
    for (const std::string& name : {std::string(op), std::string(op) + " determinism"}) {
      const ConformRow* r = find_row(rows, name);
      ASSERT_NE(r, nullptr) << name;
      EXPECT_EQ(r->section, "kernels");
      EXPECT_EQ(r->verdict, ConformVerdict::pass) << describe(*r);
      EXPECT_TRUE(r->minimal.empty() && r->replay.empty()) << describe(*r);
      if (name != op) {
        EXPECT_TRUE(r->ratio_by_shape_class.empty()) << describe(*r);  // bits, not ratios
        continue;
      }
      EXPECT_NE(r->detail.find("largest error ratio"), std::string::npos) << r->detail;
      const bool linear = name.rfind("linear_", 0) == 0;
      EXPECT_EQ(class_names(*r), linear ? kLinearShapeClasses : kShapeClasses) << describe(*r);
      for (const auto& [shape, ratio] : r->ratio_by_shape_class) EXPECT_LE(ratio, 1.0) << name << ", " << shape;
      // Sizes past 512, and for the linear ops empty batches and one case with rows, in and out past 512.
      EXPECT_NE(r->detail.find("large"), std::string::npos) << r->detail;
      if (linear) {
        EXPECT_NE(r->detail.find("rows 0-"), std::string::npos) << r->detail;
        EXPECT_NE(r->detail.find("one with rows, in and out past 512"), std::string::npos) << r->detail;
      }
    }
}

// A broken plugin, the check it must fail, and the minimal case that check must shrink to (a prefix of
// the case text; where the bug shows only for some values, as a summation order's, the size it needs
// depends on the values drawn, and every size must still be small).
struct Broken {
  const char* path;
  const char* check;
  const char* minimal;
};

const Broken kBroken[] = {
    {DPCHECK_KERNELS_TAIL_TILE, "linear_forward", "rows=1 in=1 out=1 offset=0 "},
    // An empty batch shows it most simply: dw comes back zero where it should come back as it was.
    {DPCHECK_KERNELS_BACKWARD_OVERWRITES, "linear_backward", "rows=0 in=1 out=1 accumulate=1 "},
    {DPCHECK_KERNELS_NONDETERMINISTIC, "linear_forward determinism", "rows=1 in="},
    {DPCHECK_KERNELS_ADAM_OFF_BY_ONE, "adam_step", "n=1 step=1 "},
    {DPCHECK_KERNELS_MOMENTUM_DAMPENING, "momentum_step", "n=1 step=1 "},
    {DPCHECK_KERNELS_XENT_TAIL_ROWS, "loss_forward_backward", "loss=cross_entropy rows=1 out=1 "},
    {DPCHECK_KERNELS_TANH_BACKWARD_X, "activation_backward", "act=tanh n="},
    {DPCHECK_KERNELS_EMPTY_BATCH_SKIPPED, "linear_backward", "rows=0 in=1 out=1 accumulate=0 "},
};

TEST(ConformKernels, EachBrokenPluginFailsItsOwnCheckWithAMinimalCaseThatReplays) {
  // These bugs show at any size, so sizes up to 128 keep the test quick; the other checks' passing at
  // full size is the naive kernels' test (each plugin here is the naive kernels but for one entry).
  ConformOptions o = quick(40);
  o.max_kernel_size = 128;
  for (const Broken& b : kBroken) {
    SCOPED_TRACE(b.path);
    const Target target = with_kernels(b.path);
    const std::vector<ConformRow> rows = conform_kernels(target, o);
    for (const ConformRow& r : rows) {
      if (r.check != b.check) {
        EXPECT_EQ(r.verdict, ConformVerdict::pass) << describe(r);
        continue;
      }
      ASSERT_EQ(r.verdict, ConformVerdict::fail) << describe(r);
      std::printf("  %s\n    replay: %s\n", describe(r).c_str(), r.replay.c_str());
      EXPECT_FALSE(r.promise.empty());
      EXPECT_EQ(r.minimal.rfind(b.minimal, 0), 0u) << describe(r);
      for (const char* size : {" rows=", " in=", " out=", " n="})
        if (const auto at = (" " + r.minimal).find(size); at != std::string::npos) {
          EXPECT_LE(std::stoll((" " + r.minimal).substr(at + std::string(size).size())), 8) << describe(r);
        }
      EXPECT_EQ(r.replay, std::string(kPrefix) + " --check '" + r.check + "' --case '" + r.minimal + "'");

      // The replay: that check alone, on that case alone, fails again.
      ConformOptions replay = quick(40);
      replay.check = r.check;
      replay.case_text = r.minimal;
      const std::vector<ConformRow> again = conform_kernels(target, replay);
      ASSERT_EQ(again.size(), 1u);
      EXPECT_EQ(again[0].verdict, ConformVerdict::fail) << describe(again[0]);
      EXPECT_EQ(again[0].minimal, r.minimal);
    }
    ASSERT_NE(find_row(rows, b.check), nullptr);
  }
}

// The bugs are where they are said to be: a case beside each minimal one passes.
TEST(ConformKernels, ACaseBesideTheBugPasses) {
  const struct {
    const char* path;
    const char* check;
    const char* passing;
  } cases[] = {
      {DPCHECK_KERNELS_TAIL_TILE, "linear_forward", "rows=3 in=5 out=8 offset=1 seed=4"},  // whole tiles only
      {DPCHECK_KERNELS_BACKWARD_OVERWRITES, "linear_backward", "rows=3 in=5 out=7 accumulate=0 dx=1 offset=2 seed=4"},
      {DPCHECK_KERNELS_NONDETERMINISTIC, "linear_forward", "rows=3 in=9 out=7 offset=0 seed=4"},  // accurate
      {DPCHECK_KERNELS_XENT_TAIL_ROWS, "loss_forward_backward",
       "loss=cross_entropy rows=8 out=5 scale=1 offset=0 seed=4"},
      {DPCHECK_KERNELS_TANH_BACKWARD_X, "activation_backward", "act=relu n=33 offset=3 seed=4"},
  };
  for (const auto& c : cases) {
    ConformOptions o = quick(1);
    o.check = c.check;
    o.case_text = c.passing;
    const std::vector<ConformRow> rows = conform_kernels(with_kernels(c.path), o);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].verdict, ConformVerdict::pass) << c.path << ": " << describe(rows[0]);
  }
}

// large_k_drop.c drops the last partial panel of in, on a path it takes only past 512 inputs. The
// command's default run (30 cases, seed 1, sizes up to 1024) catches it and shrinks it to in just past 512
// with every other size 1; under a size limit of 256 no drawn shape takes that path, and the row passes.
// (The linear_forward row alone: its cases are drawn as in the whole run.)
TEST(ConformKernels, ABugPast512IsCaughtByTheDefaultSizesAndNotUnderALimitOf256) {
  const Target target = with_kernels(DPCHECK_KERNELS_LARGE_K_DROP);
  ConformOptions o = quick(30);
  o.seed = 1;
  o.check = "linear_forward";
  const std::vector<ConformRow> rows = conform_kernels(target, o);
  ASSERT_EQ(rows.size(), 1u);
  const ConformRow& r = rows[0];
  std::printf("  %s\n    replay: %s\n", describe(r).c_str(), r.replay.c_str());
  ASSERT_EQ(r.verdict, ConformVerdict::fail) << describe(r);
  ASSERT_EQ(r.minimal.rfind("rows=1 in=", 0), 0u) << describe(r);
  const long long in = std::stoll(r.minimal.substr(std::string("rows=1 in=").size()));
  EXPECT_GT(in, 512) << describe(r);
  EXPECT_LT(in, 512 + 64) << describe(r);  // within the first panel past 512
  EXPECT_NE(r.minimal.find(" out=1 "), std::string::npos) << describe(r);
  // The failing case's class is among those reported, with a ratio past the bound.
  const auto worst = std::max_element(r.ratio_by_shape_class.begin(), r.ratio_by_shape_class.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  ASSERT_NE(worst, r.ratio_by_shape_class.end()) << describe(r);
  EXPECT_GT(worst->second, 1.0) << describe(r);
  EXPECT_NE(r.detail.find(", " + worst->first + ", shrunk)"), std::string::npos) << describe(r);

  ConformOptions replay = o;
  replay.case_text = r.minimal;
  const std::vector<ConformRow> again = conform_kernels(target, replay);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].verdict, ConformVerdict::fail) << describe(again[0]);

  ConformOptions limited = o;
  limited.max_kernel_size = 256;
  const std::vector<ConformRow> under = conform_kernels(target, limited);
  ASSERT_EQ(under.size(), 1u);
  EXPECT_EQ(under[0].verdict, ConformVerdict::pass) << describe(under[0]);
  EXPECT_NE(under[0].detail.find("(max size 256: no large)"), std::string::npos) << describe(under[0]);
  EXPECT_EQ(under[0].ratio_by_shape_class.count("large"), 0u) << describe(under[0]);
  EXPECT_EQ(under[0].ratio_by_shape_class.count("past a power of two"), 1u) << describe(under[0]);  // 127 to 255
}

// An empty batch (rows = 0) replays from its case text. The naive kernels pass it both ways: y has no
// elements, dw and db come back zero (written) or exactly as they were (accumulated). A kernel that
// returns at once on no rows leaves dw unwritten, and one that always writes zeroes what it should keep.
TEST(ConformKernels, AnEmptyBatchReplaysFromItsCaseText) {
  const auto run = [](const char* path, const char* check, const char* text) {
    ConformOptions o = quick(1);
    o.check = check;
    o.case_text = text;
    const std::vector<ConformRow> rows = conform_kernels(with_kernels(path), o);
    EXPECT_EQ(rows.size(), 1u);
    return rows.empty() ? ConformRow{} : rows[0];
  };
  const char* written = "rows=0 in=37 out=5 accumulate=0 dx=1 offset=1 seed=4";
  const char* accumulated = "rows=0 in=37 out=5 accumulate=1 dx=1 offset=1 seed=4";
  for (const char* text : {written, accumulated}) {
    const ConformRow r = run(DPCHECK_KERNELS_NAIVE, "linear_backward", text);
    EXPECT_EQ(r.verdict, ConformVerdict::pass) << text << ": " << describe(r);
    EXPECT_EQ(class_names(r), std::set<std::string>{"rows = 0"}) << describe(r);
  }
  EXPECT_EQ(run(DPCHECK_KERNELS_NAIVE, "linear_forward", "rows=0 in=3 out=9 offset=2 seed=4").verdict,
            ConformVerdict::pass);
  EXPECT_EQ(run(DPCHECK_KERNELS_NAIVE, "linear_backward determinism", written).verdict, ConformVerdict::pass);

  ConformRow r = run(DPCHECK_KERNELS_EMPTY_BATCH_SKIPPED, "linear_backward", written);
  EXPECT_EQ(r.verdict, ConformVerdict::fail) << describe(r);
  EXPECT_EQ(r.minimal, written);
  EXPECT_NE(r.detail.find("was never written"), std::string::npos) << describe(r);
  r = run(DPCHECK_KERNELS_EMPTY_BATCH_SKIPPED, "linear_backward", accumulated);  // keeping them is right
  EXPECT_EQ(r.verdict, ConformVerdict::pass) << describe(r);
  r = run(DPCHECK_KERNELS_BACKWARD_OVERWRITES, "linear_backward", accumulated);
  EXPECT_EQ(r.verdict, ConformVerdict::fail) << describe(r);
  EXPECT_NE(r.detail.find("dw[0,0] = 0, expected"), std::string::npos) << describe(r);
}

TEST(ConformKernels, BadChecksAndCasesAreUsageErrors) {
  const Target t = with_kernels(DPCHECK_KERNELS_NAIVE);
  const auto refuses = [&](const std::string& check, const std::string& text, const std::string& words) {
    ConformOptions o = quick(1);
    o.check = check;
    o.case_text = text;
    try {
      conform_kernels(t, o);
      ADD_FAILURE() << check << " / " << text << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refuses("linear_sideways", "", "no check of conform --kernels");
  refuses("linear_forward", "rows=-1 in=1 out=1", "rows must be in [0, 1048576]");
  refuses("linear_forward", "rows=1 in=0 out=1", "in must be in [1, 1048576]");
  refuses("loss_forward_backward", "rows=0 out=3", "rows must be in [1, 1048576]");  // no mean over no rows
  refuses("linear_forward", "rows=1 colour=blue", "'colour=blue' is not NAME=VALUE");
  refuses("linear_forward", "rows=x", "has a value rows cannot take");
  refuses("activation_forward", "act=sigmoid", "has a value act cannot take");
  refuses("adam_step", "beta1=1", "beta1");
  refuses("", "rows=1", "--case needs --check");
  for (int size : {0, 4097}) {
    ConformOptions o = quick(1);
    o.max_kernel_size = size;
    try {
      conform_kernels(t, o);
      ADD_FAILURE() << "max size " << size << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--max-size must be in [1, 4096]"), std::string::npos) << e.what();
    }
  }
  Target none;
  EXPECT_THROW(conform_kernels(none, quick(1)), UsageError);
  EXPECT_THROW(conform_kernels(with_kernels(DPCHECK_KERNELS_DEVICE_MEMORY), quick(1)), UsageError);
}

// The properties section: verify's properties with the plugin's kernels in the engine, so that a
// broken kernel fails there too.
TEST(ConformKernels, PropertiesRunWithThePluginsKernels) {
  ConformOptions o = quick(6);
  o.properties = &conform_property_rows();
  o.check = "property gradient_average_matches_whole_batch";
  const std::vector<ConformRow> ok = conform_kernels(with_kernels(DPCHECK_KERNELS_NAIVE), o);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].verdict, ConformVerdict::pass) << describe(ok[0]);
  const std::vector<ConformRow> broken = conform_kernels(with_kernels(DPCHECK_KERNELS_TAIL_TILE), o);
  ASSERT_EQ(broken.size(), 1u);
  EXPECT_EQ(broken[0].verdict, ConformVerdict::fail) << describe(broken[0]);
  EXPECT_NE(broken[0].replay.find("--kernels " + std::string(DPCHECK_KERNELS_TAIL_TILE)), std::string::npos)
      << broken[0].replay;
}

// The same at --precision bf16 (conform --kernels --precision): the plugin's linear ops take inputs
// rounded to bf16, and its float32 products must stay within the mixed-precision bound.
TEST(ConformKernels, PropertiesRunWithThePluginsKernelsInBf16) {
  ConformOptions o = quick(6);
  o.properties = &conform_property_rows();
  o.check = "property gradient_average_matches_whole_batch";
  Target naive = with_kernels(DPCHECK_KERNELS_NAIVE), tail = with_kernels(DPCHECK_KERNELS_TAIL_TILE);
  naive.precision = tail.precision = Precision::bf16;
  const std::vector<ConformRow> ok = conform_kernels(naive, o);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].verdict, ConformVerdict::pass) << describe(ok[0]);
  const std::vector<ConformRow> broken = conform_kernels(tail, o);
  ASSERT_EQ(broken.size(), 1u);
  EXPECT_EQ(broken[0].verdict, ConformVerdict::fail) << describe(broken[0]);
  EXPECT_NE(broken[0].replay.find("--precision bf16"), std::string::npos) << broken[0].replay;
}

// --kernels on the command line: verify passes with the naive kernels and fails with a broken one, whose
// replay line carries --kernels; train and grad run with them.
TEST(ConformKernels, CommandsRunThePluginsKernels) {
  const std::string bin = DPCHECK_BINARY;
  const std::string naive = std::string(" --kernels ") + DPCHECK_KERNELS_NAIVE;
  CommandResult r = run_command(bin +
                                    " verify --cases 5 --property gradient_average_matches_whole_batch "
                                    "--property optimizer_update_matches_formula" +
                                    naive,
                                300);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("kernels " + std::string(DPCHECK_KERNELS_NAIVE)), std::string::npos) << r.output;
  r = run_command(bin + " verify --cases 20 --property optimizer_update_matches_formula --kernels " +
                      DPCHECK_KERNELS_MOMENTUM_DAMPENING,
                  300);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--kernels " + std::string(DPCHECK_KERNELS_MOMENTUM_DAMPENING)), std::string::npos)
      << r.output;
  r = run_command(bin +
                      " train --model 4,8,3 --loss cross-entropy --activation tanh --optimizer adam --steps 4 "
                      "--world-size 2 --accumulate 2 --batch 16" +
                      naive,
                  120);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_command(bin + " grad --model 4,8,2 --batch 12 --world-size 3" + naive, 120);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_command(bin + " grad --model 4,8,2 --batch 12 --world-size 3 --kernels " + DPCHECK_KERNELS_TAIL_TILE, 120);
  EXPECT_EQ(r.status, 1) << r.output;
}

// A kernel that returns non-zero ends the run as a runtime error (exit 3) naming the plugin, the call,
// the rank and the plugin's own message; conform reports it the same way.
TEST(ConformKernels, AFailingCallIsNamedWithThePluginsMessage) {
  const CommandResult r = run_command(
      std::string(DPCHECK_BINARY) + " train --model 4,3,2 --steps 2 --kernels " + DPCHECK_KERNELS_FAILING, 60);
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(
      r.output.find("plugin 'failing' linear_forward on rank 0 failed (returned 7): no workspace left for a 4x4 tile"),
      std::string::npos)
      << r.output;
  try {
    conform_kernels(with_kernels(DPCHECK_KERNELS_FAILING), quick(2));
    ADD_FAILURE() << "a failing call passed";
  } catch (const UsageError& e) {
    ADD_FAILURE() << "a runtime error reported as bad usage: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plugin 'failing' linear_forward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpcheck
