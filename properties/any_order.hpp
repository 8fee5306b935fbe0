// bound_holds_for_any_summation_order: the derived bound (reference/bound.hpp) tested on its own,
// adversarially. A case is a small MLP, a batch and a split of it into shares and micro-batches; its
// float32 gradient is evaluated many times, each time with every dot product and every sum in a drawn
// order -- sequential, reversed, pairwise, blocked as BLAS kernels do, a random association tree, or
// largest magnitude first -- with or without fused multiply-adds, the bias added first or last, the
// loss's scale factor applied before or after, and the shares reduced in a drawn order. Every one of
// those evaluations is a correct float32 computation of the same gradient, so every one must stay
// within the bound; one that does not is a term the derivation is missing.
//
// The cases lean towards where bounds break: a hidden unit whose input is within rounding of a ReLU
// kink (its bias set to cancel one example's dot product), inputs with full mantissas spread over
// many binades, down to subnormal products.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "reference/bound.hpp"
#include "src/train/data.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

struct AnyOrderCase {
  ModelConfig model;
  std::int64_t batch = 1;
  int shares = 1;          // ranks the batch is split among (contiguous, sizes as array_split)
  int micro = 1;           // micro-batches per share
  int spread = 0;          // inputs span 2^-spread .. 2^spread, full mantissas (0: the synthetic data)
  bool near_kink = false;  // one first-layer unit's bias cancels one example's dot product
  int orders = 12;         // evaluations, each in its own drawn orders
  std::uint64_t seed = 0;

  std::string describe() const;
};
void showValue(const AnyOrderCase& c, std::ostream& os);

rc::Gen<AnyOrderCase> gen_any_order_case();

// The case's parameters and batch (what the bound is computed from).
std::vector<float> any_order_params(const AnyOrderCase& c);
Batch any_order_batch(const AnyOrderCase& c);

struct AnyOrderOutcome {
  bool passed = true;
  double max_ratio = 0;  // largest error / bound over every evaluation
  // The same over the elements whose bound has no kink term, whole-batch and sharded: how close plain
  // rounding comes to it.
  double rounding_ratio[2] = {0, 0};
  std::string worst;  // the evaluation and element where it was largest, and the bound's terms
  std::int64_t uncertain_units = 0;
};
AnyOrderOutcome check_any_order(const AnyOrderCase& c, const reference::BoundOptions& options);

}  // namespace dpcheck
