// The float32 to bfloat16 and fp16 conversions of src/low_precision.hpp against Eigen's own
// bfloat16 and half (an independent implementation of the same rounding), over every float32 whose
// low bits matter to the rounding: all exponents, both signs, and significands around every tie.
#include <Eigen/Core>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {
namespace {

// Every exponent and sign, with significands whose discarded bits lie at, just below and just above a
// tie and at the extremes, for fp16 (13 bits discarded) and for bf16 (16 bits): about 1.3 million values.
template <class F> void for_rounding_cases(F&& f) {
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent)
      for (std::uint32_t high = 0; high < 1024; high += 3) {
        for (std::uint32_t low : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFFu})  // fp16: bits 12..0
          f(std::bit_cast<float>(sign << 31 | exponent << 23 | high << 13 | low));
        for (std::uint32_t low : {0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})  // bf16: bits 15..0
          f(std::bit_cast<float>(sign << 31 | exponent << 23 | (high & 0x7Fu) << 16 | low));
      }
}

bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// Ours against Eigen's conversion to the same format: the same value back, and the same bits.
template <class EigenType> void expect_rounding_as_eigen(Precision p, std::uint16_t (*to_bits)(float)) {
  long checked = 0;
  for_rounding_cases([&](float f) {
    ++checked;
    const float ours = round_to_precision(f, p);
    const float eigen = static_cast<float>(EigenType(f));
    ASSERT_TRUE(same_value(ours, eigen)) << f << ": " << ours << " vs Eigen's " << eigen;
    if (!std::isnan(f)) {
      ASSERT_EQ(to_bits(f), Eigen::numext::bit_cast<std::uint16_t>(EigenType(f))) << f;
    }
  });
  EXPECT_GT(checked, 1000000);
}

TEST(LowPrecision, Bf16RoundsToNearestEvenAsEigenDoes) {
  expect_rounding_as_eigen<Eigen::bfloat16>(Precision::bf16, float_to_bf16_bits);
}

TEST(LowPrecision, Fp16RoundsToNearestEvenAsEigenDoes) {
  expect_rounding_as_eigen<Eigen::half>(Precision::fp16, float_to_fp16_bits);
}

TEST(LowPrecision, EdgesOfTheFormats) {
  // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the even one, 1.
  EXPECT_EQ(round_to_precision(1.0f + 0x1p-8f, Precision::bf16), 1.0f);
  EXPECT_EQ(round_to_precision(1.0f + 3 * 0x1p-8f, Precision::bf16), 1.0f + 0x1p-6f);
  EXPECT_EQ(round_to_precision(std::numeric_limits<float>::max(), Precision::bf16), INFINITY);
  // fp16: 65504 is the largest; 65519 rounds to it, 65520 (the tie) to infinity.
  EXPECT_EQ(round_to_precision(65504.0f, Precision::fp16), 65504.0f);
  EXPECT_EQ(round_to_precision(65519.0f, Precision::fp16), 65504.0f);
  EXPECT_EQ(round_to_precision(65520.0f, Precision::fp16), INFINITY);
  EXPECT_EQ(round_to_precision(-65520.0f, Precision::fp16), -INFINITY);
  // Below 2^-14 the spacing is 2^-24: half of it is a tie that goes to zero, a little more to 2^-24.
  EXPECT_EQ(round_to_precision(0x1p-25f, Precision::fp16), 0.0f);
  EXPECT_EQ(round_to_precision(0x1.000002p-25f, Precision::fp16), 0x1p-24f);
  EXPECT_EQ(round_to_precision(3 * 0x1p-25f, Precision::fp16), 2 * 0x1p-24f);
  EXPECT_TRUE(std::signbit(round_to_precision(-0x1p-30f, Precision::fp16)));
  EXPECT_TRUE(std::isnan(round_to_precision(NAN, Precision::fp16)));
  EXPECT_TRUE(std::isnan(round_to_precision(NAN, Precision::bf16)));
  EXPECT_EQ(round_to_precision(0.1f, Precision::fp32), 0.1f);
  // The unit roundoffs the bound uses are the largest relative errors seen.
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    double worst = 0;
    for (float f = 1.0f; f < 2.0f; f = std::nextafter(f, 4.0f))
      worst = std::max(worst, std::abs(static_cast<double>(round_to_precision(f, p)) - f) / f);
    EXPECT_LE(worst, precision_unit_roundoff(p));
    EXPECT_GT(worst, 0.99 * precision_unit_roundoff(p));
  }
}

TEST(LowPrecision, NamesParseBack) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_THROW(parse_precision("fp8"), UsageError);
  try {
    parse_precision("half");
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpcheck
