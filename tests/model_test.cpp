// Tests for src/train/model: the parsing of --model and the names, the flat parameter layout against
// PyTorch's names and offsets worked out by hand, and init_params against torch.nn.Linear's default
// initialization (the interval, and the first two moments of a large layer within a tolerance
// derived from the sample size).
#include "src/train/model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/error.hpp"

namespace dpcheck {
namespace {

ModelConfig model_of(std::vector<int> dims) {
  ModelConfig m;
  m.dims = std::move(dims);
  return m;
}

// ---- names ----------------------------------------------------------------------------------------

TEST(ModelNames, ActivationAndLossRoundTrip) {
  for (Activation a : {Activation::relu, Activation::tanh, Activation::identity})
    EXPECT_EQ(parse_activation(activation_name(a)), a);
  for (Loss l : {Loss::mse, Loss::cross_entropy}) EXPECT_EQ(parse_loss(loss_name(l)), l);
  EXPECT_EQ(activation_name(Activation::relu), "relu");
  EXPECT_EQ(activation_name(Activation::tanh), "tanh");
  EXPECT_EQ(activation_name(Activation::identity), "identity");
  EXPECT_EQ(loss_name(Loss::mse), "mse");
  EXPECT_EQ(loss_name(Loss::cross_entropy), "cross-entropy");
}

TEST(ModelNames, UnknownNamesAreUsageErrorsNamingTheInput) {
  EXPECT_THROW(parse_activation(""), UsageError);
  EXPECT_THROW(parse_activation("ReLU"), UsageError);
  EXPECT_THROW(parse_loss("cross_entropy"), UsageError);  // the enum's spelling, not the command's
  try {
    parse_activation("gelu");
    FAIL() << "parse_activation accepted gelu";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("gelu"), std::string::npos) << e.what();
  }
  try {
    parse_loss("hinge");
    FAIL() << "parse_loss accepted hinge";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("hinge"), std::string::npos) << e.what();
  }
}

// ---- parse_dims -----------------------------------------------------------------------------------

TEST(ParseDims, AcceptsCommaSeparatedPositiveWidths) {
  EXPECT_EQ(parse_dims("4,16,1"), (std::vector<int>{4, 16, 1}));
  EXPECT_EQ(parse_dims("784,256,10"), (std::vector<int>{784, 256, 10}));
  EXPECT_EQ(parse_dims("1,1"), (std::vector<int>{1, 1}));
  EXPECT_EQ(dims_string(parse_dims("4,16,1")), "4,16,1");
}

TEST(ParseDims, RejectsAnythingButTwoOrMorePositiveIntegers) {
  for (const char* bad :
       {"", "4", "4,,1", "4,0", "-1,2", "4,x", "4,1,", ",4,1", "4, 1", "+4,1", "4.5,1", "99999999999999999999,1"}) {
    EXPECT_THROW(parse_dims(bad), UsageError) << "'" << bad << "'";
  }
  try {
    parse_dims("4,x");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("4,x"), std::string::npos) << e.what();
  }
}

TEST(ModelConfigCheck, ValidateRejectsTooFewOrNonPositiveWidths) {
  EXPECT_THROW(model_of({}).validate(), UsageError);
  EXPECT_THROW(model_of({4}).validate(), UsageError);
  EXPECT_THROW(model_of({4, 0}).validate(), UsageError);
  EXPECT_THROW(model_of({4, -3, 1}).validate(), UsageError);
  EXPECT_NO_THROW(model_of({4, 1}).validate());
  EXPECT_THROW(ParamLayout(model_of({4})), UsageError);
}

// Widths beyond max_width, or more parameters than max_parameters (2^31 - 1: MPI's int counts), are
// refused by the parser and by validate() with the count, before anything is allocated.
TEST(ModelConfigCheck, RefusesAbsurdWidthsAndParameterCounts) {
  EXPECT_EQ(parameter_count({4, 3, 1}), 4 * 3 + 3 + 3 + 1);
  EXPECT_EQ(parameter_count({100000, 100000}), 10000100000);
  const struct {
    const char* text;
    const char* words;
  } cases[] = {
      {"100000,100000", "10000100000 parameters, more than the 2147483647"},
      {"50000,50000,50000", "5000100000 parameters"},
      {"16777217,1", "width 16777217 is larger than 16777216"},
      {"4,99999999999", "width 99999999999 is larger than 16777216"},
      {"4,99999999999999999999999", "width 99999999999999999999999 is larger"},
  };
  for (const auto& c : cases) {
    try {
      parse_dims(c.text);
      ADD_FAILURE() << c.text << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.text), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(model_of({100000, 100000}).validate(), UsageError);
  EXPECT_THROW(ParamLayout(model_of({46341, 46341})), UsageError);  // (46341 + 1) * 46341 > 2^31 - 1
  EXPECT_NO_THROW(model_of({46340, 46340}).validate());             // (46340 + 1) * 46340 < 2^31 - 1
  EXPECT_EQ(parse_dims("16777216,1"), (std::vector<int>{16777216, 1}));
}

// ---- layout ---------------------------------------------------------------------------------------

TEST(ParamLayoutNames, MatchesPytorchModuleListOfLinear) {
  // nn.ModuleList([nn.Linear(3, 4), nn.Linear(4, 2)]).named_parameters(), flattened in order.
  const ParamLayout layout(model_of({3, 4, 2}));
  ASSERT_EQ(layout.slices().size(), 4u);
  struct Expected {
    const char* name;
    std::size_t offset;
    std::vector<std::int64_t> shape;
  };
  const Expected expected[] = {{"layers.0.weight", 0, {4, 3}},
                               {"layers.0.bias", 12, {4}},
                               {"layers.1.weight", 16, {2, 4}},
                               {"layers.1.bias", 24, {2}}};
  for (std::size_t k = 0; k < 4; ++k) {
    SCOPED_TRACE(expected[k].name);
    EXPECT_EQ(layout.slices()[k].name, expected[k].name);
    EXPECT_EQ(layout.slices()[k].offset, expected[k].offset);
    EXPECT_EQ(layout.slices()[k].shape, expected[k].shape);
  }
  EXPECT_EQ(layout.size(), 26u);
  EXPECT_EQ(&layout.weight(1), &layout.slices()[2]);
  EXPECT_EQ(&layout.bias(0), &layout.slices()[1]);
  EXPECT_EQ(layout.weight(0).size(), 12u);
  EXPECT_EQ(layout.bias(1).size(), 2u);
}

TEST(ParamLayoutNames, DescribeElementGivesRowMajorIndex) {
  const ParamLayout layout(model_of({3, 4, 2}));
  EXPECT_EQ(layout.describe_element(0), "layers.0.weight[0, 0]");
  EXPECT_EQ(layout.describe_element(5), "layers.0.weight[1, 2]");  // row 1 (of 4), column 2 (of 3)
  EXPECT_EQ(layout.describe_element(11), "layers.0.weight[3, 2]");
  EXPECT_EQ(layout.describe_element(12), "layers.0.bias[0]");
  EXPECT_EQ(layout.describe_element(13), "layers.0.bias[1]");
  EXPECT_EQ(layout.describe_element(16), "layers.1.weight[0, 0]");
  EXPECT_EQ(layout.describe_element(23), "layers.1.weight[1, 3]");
  EXPECT_EQ(layout.describe_element(25), "layers.1.bias[1]");
}

TEST(ParamLayoutNames, SliceAtCoversEveryElementAndNothingElse) {
  const ParamLayout layout(model_of({3, 4, 2}));
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const Slice& s = layout.slice_at(i);
    EXPECT_LE(s.offset, i);
    EXPECT_LT(i, s.offset + s.size());
  }
  EXPECT_EQ(layout.slice_at(15).name, "layers.0.bias");
  EXPECT_EQ(layout.slice_at(16).name, "layers.1.weight");
  EXPECT_THROW(layout.slice_at(26), Error);
  EXPECT_THROW(layout.slice_at(1000), Error);
  EXPECT_THROW(layout.describe_element(26), Error);
}

TEST(ParamLayoutNames, DeepModelSlicesAreContiguous) {
  const ParamLayout layout(model_of({5, 7, 1, 3}));
  std::size_t next = 0;
  for (const Slice& s : layout.slices()) {
    EXPECT_EQ(s.offset, next) << s.name;
    next += s.size();
  }
  EXPECT_EQ(layout.size(), next);
  EXPECT_EQ(layout.size(), 5u * 7 + 7 + 7 * 1 + 1 + 1 * 3 + 3);
  EXPECT_EQ(layout.weight(2).name, "layers.2.weight");
  EXPECT_EQ(layout.weight(2).shape, (std::vector<std::int64_t>{3, 1}));
}

// ---- init_params ----------------------------------------------------------------------------------

// PyTorch computes the bound 1/sqrt(in) in double and draws in float32 between the float bounds.
float float_bound(int in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(in))); }

TEST(InitParams, DeterministicPerSeedAndDifferentAcrossSeeds) {
  const ModelConfig m = model_of({3, 5, 2});
  const std::vector<float> a = init_params(m, 42), b = init_params(m, 42), c = init_params(m, 43);
  ASSERT_EQ(a.size(), ParamLayout(m).size());
  EXPECT_EQ(a, b);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != c[i];
  // Independent draws agree with probability about 2^-24 each; a handful would mean a shared stream.
  EXPECT_GE(differ, a.size() - 2);
}

TEST(InitParams, EveryLayerWithinPlusMinusOneOverSqrtFanIn) {
  const ModelConfig m = model_of({3, 5, 10, 100, 2});
  const ParamLayout layout(m);
  const std::vector<float> p = init_params(m, 7);
  for (int l = 0; l < m.layers(); ++l) {
    const int in = m.dims[static_cast<std::size_t>(l)];
    const float bound = float_bound(in);
    float largest = 0;
    for (const Slice* s : {&layout.weight(l), &layout.bias(l)}) {
      for (std::size_t i = s->offset; i < s->offset + s->size(); ++i) {
        EXPECT_GE(p[i], -bound) << layout.describe_element(i);
        EXPECT_LT(p[i], bound) << layout.describe_element(i);
        largest = std::max(largest, std::abs(p[i]));
      }
    }
    // The interval is used, not a narrower one: with 5 to 1000 draws the largest is well above half.
    EXPECT_GT(largest, 0.5f * bound) << "layer " << l;
  }
}

TEST(InitParams, LargeLayerHasUniformMeanAndVariance) {
  // One 512 -> 256 layer: 131072 weights uniform on [-b, b), b = 1/sqrt(512). For the uniform law
  // E x = 0, E x^2 = b^2/3 and Var x^2 = E x^4 - (E x^2)^2 = b^4/5 - b^4/9 = 4 b^4/45, so the sample
  // mean has standard error b/sqrt(3n) and the sample mean of x^2 has sqrt(4/45) b^2/sqrt(n). Six
  // standard errors leave a false alarm at about 2e-9 while a wrong scale (1/in instead of
  // 1/sqrt(in), or a normal law, whose E x^2 differs by far more than 6 SE) cannot pass.
  const ModelConfig m = model_of({512, 256});
  const ParamLayout layout(m);
  const std::vector<float> p = init_params(m, 2024);
  const Slice& w = layout.weight(0);
  const auto n = static_cast<double>(w.size());
  const double b = 1.0 / std::sqrt(512.0);
  double sum = 0, sum_sq = 0;
  for (std::size_t i = w.offset; i < w.offset + w.size(); ++i) {
    sum += p[i];
    sum_sq += static_cast<double>(p[i]) * p[i];
  }
  const double mean = sum / n, mean_sq = sum_sq / n;
  EXPECT_NEAR(mean, 0.0, 6 * b / std::sqrt(3 * n));
  EXPECT_NEAR(mean_sq, b * b / 3, 6 * std::sqrt(4.0 / 45.0) * b * b / std::sqrt(n));
}

TEST(InitParams, LayersAndTensorsAreNotCopiesOfEachOther) {
  // Each tensor draws from its own counters: the bias must not repeat the weight's first row, and
  // two layers of the same shape (hence the same bound) must not repeat each other.
  const ModelConfig m = model_of({4, 4, 4});
  const ParamLayout layout(m);
  const std::vector<float> p = init_params(m, 1);
  std::size_t same_row = 0, same_layer = 0;
  for (std::size_t j = 0; j < 4; ++j) same_row += p[layout.bias(0).offset + j] == p[layout.weight(0).offset + j];
  for (std::size_t j = 0; j < 16; ++j) same_layer += p[layout.weight(0).offset + j] == p[layout.weight(1).offset + j];
  EXPECT_LE(same_row, 1u);
  EXPECT_LE(same_layer, 1u);
}

}  // namespace
}  // namespace dpcheck
