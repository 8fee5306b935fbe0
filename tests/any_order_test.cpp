// The adversarial evaluator behind bound_holds_for_any_summation_order (properties/any_order.hpp), held
// to what it claims: its evaluations in drawn orders really are different float32 computations (a
// check whose orders all gave the same bits would test one order many times), and it notices a bound
// that lacks the kink term on a case built to sit on a ReLU kink, while the whole bound passes there.
#include <gtest/gtest.h>

#include <cstdio>

#include "properties/any_order.hpp"

namespace dpcheck {
namespace {

// check_any_order reports the largest error ratio over its evaluations, and evaluation e of a case is
// the same whatever the number of orders: the ratio with k + 1 orders exceeds the ratio with k only if
// evaluation k gave a gradient whose bits differ from every earlier one's on the same path.
TEST(AnyOrder, EvaluationsInDifferentOrdersGiveDifferentBits) {
  AnyOrderCase c;
  c.model = {{6, 6, 6, 3}, Activation::tanh, Loss::cross_entropy};
  c.batch = 12;
  c.shares = 3;
  c.micro = 2;
  c.spread = 24;  // full mantissas over many binades: every sum rounds
  c.seed = 11;
  double previous = 0;
  int raised = 0;
  for (int k = 1; k <= 12; ++k) {
    c.orders = k;
    const AnyOrderOutcome o = check_any_order(c, {});
    EXPECT_TRUE(o.passed) << o.worst;
    EXPECT_GE(o.max_ratio, previous);
    if (k == 1) {
      EXPECT_GT(o.max_ratio, 0.0) << "the first evaluation is exact: nothing rounded";
    } else {
      raised += o.max_ratio > previous;
    }
    previous = o.max_ratio;
  }
  std::printf("of 11 further evaluations in their own orders, %d raised the largest error ratio (to %.3g)\n", raised,
              previous);
  EXPECT_GE(raised, 1);
}

// With uncertain_kinks off the bound leaves out the whole contribution of a unit within rounding of its
// kink; an evaluation that takes the other side of the kink than the float64 reference then lands
// outside it. The near-kink cases must show that in at least half of them (33 of 40 when written), and
// pass with the full bound in all.
TEST(AnyOrder, NoticesABoundWithoutTheKinkTerm) {
  constexpr int cases = 40;
  int failed_without = 0, uncertain = 0;
  reference::BoundOptions without;
  without.uncertain_kinks = false;
  for (int k = 0; k < cases; ++k) {
    AnyOrderCase c;
    c.model = {{5, 6, 4}, Activation::relu, k % 2 == 0 ? Loss::mse : Loss::cross_entropy};
    c.batch = 8;
    c.shares = 2;
    c.micro = 2;
    c.near_kink = true;
    c.seed = static_cast<std::uint64_t>(300 + k);
    const AnyOrderOutcome with = check_any_order(c, {});
    EXPECT_TRUE(with.passed) << c.describe() << ": " << with.worst;
    uncertain += with.uncertain_units > 0;
    failed_without += !check_any_order(c, without).passed;
  }
  std::printf(
      "near-kink cases: %d of %d with a unit within rounding of its kink; without the kink term %d of them "
      "fail\n",
      uncertain, cases, failed_without);
  EXPECT_EQ(uncertain, cases);
  EXPECT_GE(failed_without, cases / 2);
}

}  // namespace
}  // namespace dpcheck
