// Tests for src/train/data: the synthetic data set as a pure function of (seed, example index), batches
// that slice and concatenate back to themselves, and ArrayDataset::load on .npy fixtures written
// into a fresh temporary directory -- every accepted layout, and every rejection, each checked for a
// UsageError whose message names the offending file.
#include "src/train/data.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "src/error.hpp"
#include "src/io/npy.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

ModelConfig model_of(std::vector<int> dims, Loss loss) {
  ModelConfig m;
  m.dims = std::move(dims);
  m.loss = loss;
  return m;
}

// Rows of a batch as (x, y or label) so that two batches compare example by example.
void expect_same_example(const Batch& a, std::int64_t i, const Batch& b, std::int64_t j) {
  const auto in = static_cast<std::size_t>(a.in_dim), out = static_cast<std::size_t>(a.out_dim);
  const auto ui = static_cast<std::size_t>(i), uj = static_cast<std::size_t>(j);
  for (std::size_t k = 0; k < in; ++k) EXPECT_EQ(a.x[ui * in + k], b.x[uj * in + k]) << "x[" << k << "]";
  if (a.loss == Loss::mse)
    for (std::size_t k = 0; k < out; ++k) EXPECT_EQ(a.y[ui * out + k], b.y[uj * out + k]) << "y[" << k << "]";
  else EXPECT_EQ(a.labels[ui], b.labels[uj]);
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.in_dim, b.in_dim);
  EXPECT_EQ(a.out_dim, b.out_dim);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.labels, b.labels);
}

// ---- SyntheticDataset -----------------------------------------------------------------------------

TEST(SyntheticData, ExampleDependsOnlyOnSeedAndIndex) {
  for (Loss loss : {Loss::mse, Loss::cross_entropy}) {
    SCOPED_TRACE(std::string(loss_name(loss)));
    const ModelConfig m = model_of({3, 8, 4}, loss);
    const SyntheticDataset small(10, m, 7), large(1000, m, 7);
    const std::vector<std::int64_t> order{5, 2, 5};
    const Batch a = small.gather(order), b = large.gather(order);
    expect_same_batch(a, b);
    // Gather order changes nothing about an example: row k is example order[k] on its own.
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::vector<std::int64_t> one{order[k]};
      expect_same_example(a, static_cast<std::int64_t>(k), large.gather(one), 0);
    }
    expect_same_example(a, 0, a, 2);
    // ... and the example is the one example() writes directly.
    std::vector<float> x(3), y(4);
    std::int64_t label = -1;
    small.example(2, x.data(), loss == Loss::mse ? y.data() : nullptr, loss == Loss::cross_entropy ? &label : nullptr);
    for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(a.x[3 + k], x[k]);
    if (loss == Loss::mse)
      for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(a.y[4 + k], y[k]);
    else EXPECT_EQ(a.labels[1], label);
  }
}

TEST(SyntheticData, InputsAndTargetsInHalfOpenUnitIntervalLabelsInRange) {
  const std::int64_t n = 2000;
  const Batch reg = first_examples(model_of({4, 3}, Loss::mse), n, 11);
  ASSERT_EQ(reg.x.size(), static_cast<std::size_t>(n) * 4);
  ASSERT_EQ(reg.y.size(), static_cast<std::size_t>(n) * 3);
  EXPECT_TRUE(reg.labels.empty());
  float lo = 1, hi = -1;
  for (const std::vector<float>* v : {&reg.x, &reg.y}) {
    for (float f : *v) {
      EXPECT_GE(f, -1.0f);
      EXPECT_LT(f, 1.0f);
      lo = std::min(lo, f);
      hi = std::max(hi, f);
    }
  }
  // The whole interval is used (14000 draws: the extremes are within 1e-2 of the ends).
  EXPECT_LT(lo, -0.99f);
  EXPECT_GT(hi, 0.99f);

  const int classes = 5;
  const Batch cls = first_examples(model_of({4, classes}, Loss::cross_entropy), n, 11);
  ASSERT_EQ(cls.labels.size(), static_cast<std::size_t>(n));
  EXPECT_TRUE(cls.y.empty());
  std::vector<int> count(classes, 0);
  for (std::int64_t c : cls.labels) {
    ASSERT_GE(c, 0);
    ASSERT_LT(c, classes);
    ++count[static_cast<std::size_t>(c)];
  }
  // 400 expected per class, standard deviation sqrt(2000 * 0.2 * 0.8) = 17.9: 6 SD is 107.
  for (int c = 0; c < classes; ++c) EXPECT_NEAR(count[static_cast<std::size_t>(c)], 400, 107) << "class " << c;
}

TEST(SyntheticData, DifferentSeedsGiveDifferentExamples) {
  const ModelConfig m = model_of({6, 2}, Loss::mse);
  const std::vector<std::int64_t> idx{0, 1, 2, 3};
  const Batch a = SyntheticDataset(4, m, 1).gather(idx), b = SyntheticDataset(4, m, 2).gather(idx);
  std::size_t same = 0;
  for (std::size_t k = 0; k < a.x.size(); ++k) same += a.x[k] == b.x[k];
  for (std::size_t k = 0; k < a.y.size(); ++k) same += a.y[k] == b.y[k];
  EXPECT_LE(same, 1u);
  // Distinct examples of one seed differ too: inputs and targets are separate streams.
  EXPECT_NE(std::vector<float>(a.x.begin(), a.x.begin() + 6), std::vector<float>(a.x.begin() + 6, a.x.begin() + 12));
  EXPECT_NE(std::vector<float>(a.x.begin(), a.x.begin() + 2), std::vector<float>(a.y.begin(), a.y.begin() + 2));
}

TEST(SyntheticData, GatherOutOfRangeThrows) {
  const SyntheticDataset d(5, model_of({2, 1}, Loss::mse), 0);
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{5}, std::int64_t{1} << 40}) {
    const std::vector<std::int64_t> idx{0, bad};
    EXPECT_THROW(d.gather(idx), Error) << bad;
  }
  const Batch empty = d.gather({});
  EXPECT_EQ(empty.size, 0);
  EXPECT_TRUE(empty.x.empty());
  EXPECT_EQ(empty.in_dim, 2);
}

TEST(SyntheticData, RejectsNegativeSizeAndBadModel) {
  EXPECT_THROW(SyntheticDataset(-1, model_of({2, 1}, Loss::mse), 0), UsageError);
  EXPECT_THROW(SyntheticDataset(4, model_of({2}, Loss::mse), 0), UsageError);
  EXPECT_THROW(SyntheticDataset(4, model_of({2, 0}, Loss::mse), 0), UsageError);
  EXPECT_NO_THROW(SyntheticDataset(0, model_of({2, 1}, Loss::mse), 0));
}

// The constructor must validate the model before it reads in_dim() (dims.front()) and out_dim()
// (dims.back()): read first, a model with no widths dereferences an empty vector instead of raising
// a UsageError. Runs in a child process so that a regression fails this test alone.
TEST(SyntheticData, ModelWithoutWidthsIsUsageErrorNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        try {
          const SyntheticDataset d(4, ModelConfig{}, 0);
        } catch (const UsageError&) {
          std::_Exit(0);
        } catch (...) {
          std::_Exit(2);
        }
        std::_Exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- Batch ----------------------------------------------------------------------------------------

TEST(BatchSlices, SliceAndConcatRoundTrip) {
  for (Loss loss : {Loss::mse, Loss::cross_entropy}) {
    SCOPED_TRACE(std::string(loss_name(loss)));
    const SyntheticDataset d(10, model_of({3, 2}, loss), 5);
    std::vector<std::int64_t> all;
    for (std::int64_t i = 0; i < 10; ++i) all.push_back(i);
    const Batch whole = d.gather(all);

    const std::vector<Batch> parts{whole.slice(0, 3), whole.slice(3, 3), whole.slice(3, 10)};
    EXPECT_EQ(parts[0].size, 3);
    EXPECT_EQ(parts[1].size, 0);
    EXPECT_EQ(parts[2].size, 7);
    expect_same_example(parts[2], 0, whole, 3);
    expect_same_example(parts[2], 6, whole, 9);
    expect_same_batch(concat(parts), whole);

    // A slice is the gather of its indices.
    const std::vector<std::int64_t> mid{4, 5, 6};
    expect_same_batch(whole.slice(4, 7), d.gather(mid));
    EXPECT_THROW(whole.slice(3, 11), Error);
    EXPECT_THROW(whole.slice(4, 3), Error);
  }
}

TEST(BatchSlices, ConcatRejectsMismatchedShapes) {
  const Batch a = SyntheticDataset(2, model_of({3, 2}, Loss::mse), 0).gather(std::vector<std::int64_t>{0});
  const Batch b = SyntheticDataset(2, model_of({4, 2}, Loss::mse), 0).gather(std::vector<std::int64_t>{0});
  const std::vector<Batch> parts{a, b};
  EXPECT_THROW(concat(parts), Error);
}

// ---- ArrayDataset::load ---------------------------------------------------------------------------

template <class T> fs::path write_fixture(const ScratchDir& dir, const std::string& name,
                                          std::vector<std::int64_t> shape, const std::vector<T>& data) {
  const fs::path p = dir / name;
  write_npy(p, std::span<const std::int64_t>(shape), std::span<const T>(data));
  return p;
}

// Expects a UsageError from load whose message names `culprit`.
void expect_load_error(const fs::path& x, const fs::path& y, const ModelConfig& m, const fs::path& culprit) {
  try {
    ArrayDataset::load(x, y, m);
    ADD_FAILURE() << "load accepted " << x << " and " << y;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(culprit.string()), std::string::npos) << e.what();
  }
}

TEST(ArrayDataLoad, Float32InputsAndMseTargets) {
  const ScratchDir dir;
  const std::vector<float> x{1, 2, 3, 4, 5, 6};  // 3 examples x 2 inputs
  const std::vector<float> y{0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f};
  const ModelConfig m = model_of({2, 4, 2}, Loss::mse);
  const ArrayDataset d =
      ArrayDataset::load(write_fixture(dir, "x.npy", {3, 2}, x), write_fixture(dir, "y.npy", {3, 2}, y), m);
  EXPECT_EQ(d.size(), 3);
  EXPECT_EQ(d.in_dim(), 2);
  EXPECT_EQ(d.out_dim(), 2);
  EXPECT_EQ(d.loss(), Loss::mse);
  const Batch b = d.gather(std::vector<std::int64_t>{2, 0});
  EXPECT_EQ(b.x, (std::vector<float>{5, 6, 1, 2}));
  EXPECT_EQ(b.y, (std::vector<float>{2.5f, -2.5f, 0.5f, -0.5f}));
}

TEST(ArrayDataLoad, Float64IsRoundedToFloatOnce) {
  const ScratchDir dir;
  // 1 + 2^-24 + 2^-50 lies just above the midpoint of 1 and 1 + 2^-23: rounded once it is 1 + 2^-23,
  // where a second rounding through a narrower intermediate would give 1.
  const std::vector<double> x{0.1, 1.0 / 3.0, 1.0 + 0x1p-24 + 0x1p-50, -2.5e-30};
  const std::vector<double> y{0.2, -0.7};
  const ModelConfig m = model_of({2, 1}, Loss::mse);
  const ArrayDataset d =
      ArrayDataset::load(write_fixture(dir, "x.npy", {2, 2}, x), write_fixture(dir, "y.npy", {2, 1}, y), m);
  const Batch b = d.gather(std::vector<std::int64_t>{0, 1});
  ASSERT_EQ(b.x.size(), 4u);
  for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(b.x[k], static_cast<float>(x[k])) << k;
  EXPECT_EQ(b.x[2], 1.0f + 0x1p-23f);
  EXPECT_EQ(b.y, (std::vector<float>{0.2f, -0.7f}));
}

TEST(ArrayDataLoad, MseTargetsOfShapeBWhenOneOutput) {
  const ScratchDir dir;
  const ModelConfig m = model_of({1, 1}, Loss::mse);
  const ArrayDataset d = ArrayDataset::load(write_fixture(dir, "x.npy", {3, 1}, std::vector<float>{1, 2, 3}),
                                            write_fixture(dir, "y.npy", {3}, std::vector<float>{7, 8, 9}), m);
  EXPECT_EQ(d.gather(std::vector<std::int64_t>{1, 2}).y, (std::vector<float>{8, 9}));
}

TEST(ArrayDataLoad, CrossEntropyInt64Labels) {
  const ScratchDir dir;
  const ModelConfig m = model_of({2, 3}, Loss::cross_entropy);
  const ArrayDataset d =
      ArrayDataset::load(write_fixture(dir, "x.npy", {4, 2}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}),
                         write_fixture(dir, "y.npy", {4}, std::vector<std::int64_t>{2, 0, 1, 2}), m);
  const Batch b = d.gather(std::vector<std::int64_t>{3, 2, 1, 0});
  EXPECT_EQ(b.labels, (std::vector<std::int64_t>{2, 1, 0, 2}));
  EXPECT_EQ(b.x, (std::vector<float>{7, 8, 5, 6, 3, 4, 1, 2}));
  EXPECT_TRUE(b.y.empty());
}

TEST(ArrayDataLoad, RejectsInt64Inputs) {
  const ScratchDir dir;
  const ModelConfig m = model_of({2, 1}, Loss::mse);
  const fs::path x = write_fixture(dir, "x.npy", {2, 2}, std::vector<std::int64_t>{1, 2, 3, 4});
  const fs::path y = write_fixture(dir, "y.npy", {2}, std::vector<float>{1, 2});
  expect_load_error(x, y, m, x);
}

TEST(ArrayDataLoad, RejectsWrongInputWidthOrRank) {
  const ScratchDir dir;
  const ModelConfig m = model_of({3, 1}, Loss::mse);
  const fs::path y = write_fixture(dir, "y.npy", {2}, std::vector<float>{1, 2});
  const fs::path wide = write_fixture(dir, "wide.npy", {2, 2}, std::vector<float>{1, 2, 3, 4});
  expect_load_error(wide, y, m, wide);
  const fs::path flat = write_fixture(dir, "flat.npy", {6}, std::vector<float>{1, 2, 3, 4, 5, 6});
  expect_load_error(flat, y, m, flat);
}

TEST(ArrayDataLoad, RejectsTargetsOfWrongShapeOrType) {
  const ScratchDir dir;
  const ModelConfig m = model_of({2, 2}, Loss::mse);
  const fs::path x = write_fixture(dir, "x.npy", {3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const fs::path rows = write_fixture(dir, "rows.npy", {2, 2}, std::vector<float>{1, 2, 3, 4});
  expect_load_error(x, rows, m, rows);
  const fs::path cols = write_fixture(dir, "cols.npy", {3, 1}, std::vector<float>{1, 2, 3});
  expect_load_error(x, cols, m, cols);
  // (B,) is accepted only when there is a single output.
  const fs::path flat = write_fixture(dir, "flat.npy", {3}, std::vector<float>{1, 2, 3});
  expect_load_error(x, flat, m, flat);
  const fs::path ints = write_fixture(dir, "ints.npy", {3, 2}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  expect_load_error(x, ints, m, ints);
}

TEST(ArrayDataLoad, RejectsFloatOrOutOfRangeLabels) {
  const ScratchDir dir;
  const ModelConfig m = model_of({1, 3}, Loss::cross_entropy);
  const fs::path x = write_fixture(dir, "x.npy", {2, 1}, std::vector<float>{1, 2});
  const fs::path floats = write_fixture(dir, "floats.npy", {2}, std::vector<float>{0, 1});
  expect_load_error(x, floats, m, floats);
  const fs::path high = write_fixture(dir, "high.npy", {2}, std::vector<std::int64_t>{0, 3});
  expect_load_error(x, high, m, high);
  const fs::path negative = write_fixture(dir, "negative.npy", {2}, std::vector<std::int64_t>{-1, 0});
  expect_load_error(x, negative, m, negative);
  const fs::path rows = write_fixture(dir, "rows.npy", {3}, std::vector<std::int64_t>{0, 1, 2});
  expect_load_error(x, rows, m, rows);
  const fs::path matrix = write_fixture(dir, "matrix.npy", {2, 1}, std::vector<std::int64_t>{0, 1});
  expect_load_error(x, matrix, m, matrix);
}

TEST(ArrayDataLoad, MissingFileNamesIt) {
  const ScratchDir dir;
  const ModelConfig m = model_of({1, 1}, Loss::mse);
  const fs::path x = write_fixture(dir, "x.npy", {1, 1}, std::vector<float>{1});
  const fs::path y = write_fixture(dir, "y.npy", {1}, std::vector<float>{1});
  expect_load_error(dir / "absent-x.npy", y, m, dir / "absent-x.npy");
  expect_load_error(x, dir / "absent-y.npy", m, dir / "absent-y.npy");
}

// Non-finite inputs or targets would turn every gradient into NaN and the comparison into a failure
// that blames rounding; they are refused up front, naming the file and the element.
TEST(ArrayDataLoad, RejectsNonFiniteInputsAndTargetsNamingFileAndElement) {
  const ScratchDir dir;
  const ModelConfig m = model_of({2, 1}, Loss::mse);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const fs::path x = write_fixture(dir, "x.npy", {2, 2}, std::vector<float>{1, 2, 3, 4});
  const fs::path y = write_fixture(dir, "y.npy", {2, 1}, std::vector<float>{1, 2});
  const fs::path x_nan = write_fixture(dir, "x_nan.npy", {2, 2}, std::vector<float>{1, 2, nan, 4});
  const fs::path y_inf = write_fixture(dir, "y_inf.npy", {2, 1}, std::vector<float>{1, -inf});
  const fs::path x_big = write_fixture(dir, "x_big.npy", {2, 2}, std::vector<double>{1, 1e39, 3, 4});
  for (const auto& [bad_x, bad_y, culprit, element] :
       {std::tuple{x_nan, y, x_nan, "element [1, 0] is nan"}, std::tuple{x, y_inf, y_inf, "element [1, 0] is -inf"},
        std::tuple{x_big, y, x_big, "element [0, 1] is 1e+39, beyond float32's range"}}) {
    expect_load_error(bad_x, bad_y, m, culprit);
    try {
      ArrayDataset::load(bad_x, bad_y, m);
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(element), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(ArrayDataset::load(x, y, m).size(), 2);
}

}  // namespace
}  // namespace dpcheck
