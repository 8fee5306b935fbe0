// The checks dpcheck.torch runs on a real PyTorch job, in C++ over the same reference, bound, share
// counts and replica vote that `verify` uses; python/bindings.cpp hands them to Python. Nothing here
// knows PyTorch: tensors arrive as bytes and shapes, batches as float32 arrays.
//
// The gradient check. DDP's ranks each back-propagate a loss over their own micro-batches and average
// the results; the promise is that the average is the whole global batch's gradient. The float64
// gradient of the union of every rank's batch and the derived bound (reference/bound.hpp) judge it,
// with the roundings of the sharded path: the largest share's examples, N - 1 additions of the
// all-reduce, and the scale factors. Beside the verdict, the weight each example carries in the
// all-reduced gradient is measured: the gradient is fitted, in float64 least squares, as a weighted sum
// of each part's (rank and micro-batch) summed gradient. A correct job weighs every example 1/B; a loss
// averaged per rank or per micro-batch over uneven parts weighs them 1/(N b), and the fit names the
// parts whose weights differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/train/data.hpp"
#include "src/train/model.hpp"

namespace dpcheck::torchjob {

// One micro-batch one rank trained on in the checked step.
struct GradientPart {
  int rank = 0;
  Batch batch;
};

struct GradientInput {
  ModelConfig model;
  std::vector<float> params;  // at the step's forward pass, in the layout of src/train/model.hpp
  std::vector<GradientPart> parts;
  std::vector<float> gradient;  // what the optimizer used: the all-reduced gradient
  int world_size = 1;
};

struct PartWeight {
  int rank = 0;
  int micro_batch = 0;  // its place among the rank's parts
  std::int64_t examples = 0;
  double weight = 0;  // fitted weight of each of its examples (a correct job: 1 / B)
};

struct GradientJudgement {
  bool passed = true;
  double ratio = 0;     // largest error / bound; at most 1 passes
  std::string element;  // where it is largest: "layers.0.weight[1, 2]"
  double value = 0, reference = 0, bound = 0;
  std::string bound_terms;  // the bound there, split into its parts
  std::int64_t batch = 0, largest_share = 0, roundings = 0;
  std::vector<PartWeight> weights;
  double fit_residual = 0;      // |gradient - fitted| / |gradient| of the weight fit
  bool weights_differ = false;  // some part's weight is not 1 / B (relative 1e-3)
  std::string message;          // the verdict in words
};

GradientJudgement judge_gradient(const GradientInput& input);

// The first element where the ranks' copies of one tensor differ. `dtype` is PyTorch's name without
// the "torch." ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
// "uint8", "bool"); every buffer holds the tensor's bytes, row-major.
struct TensorDifference {
  bool differs = false;
  std::int64_t flat_index = 0;
  std::string index;               // "[3, 1]"; "" for a tensor of one element
  std::int64_t differing = 0;      // elements where some rank differs from rank 0
  std::vector<double> values;      // each rank's value there
  std::vector<std::string> texts;  // each rank's value with its bits: "0.25 (0x3e800000)"
  std::vector<int> minority;
  std::uint64_t distance = 0;  // from the majority: ULPs (floats) or the difference (integers)
  std::string unit;            // "ulp" or "" (integers)
};
TensorDifference locate_difference(const std::string& dtype, const std::vector<std::string_view>& ranks,
                                   const std::vector<std::int64_t>& shape);

}  // namespace dpcheck::torchjob
