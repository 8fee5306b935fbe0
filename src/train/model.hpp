// The model: a multilayer perceptron with one flat float32 parameter buffer laid out as PyTorch lays
// out a ModuleList `layers` of nn.Linear: layers.<i>.weight (out x in, row-major) then layers.<i>.bias,
// layer by layer. One all-reduce and one hash cover a whole replica, and tensors exported from
// PyTorch load directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/model_kinds.hpp"

namespace dpcheck {

// Limits that keep every index and count of a model within what the engines, the .npy files and the
// collectives (MPI counts are int) handle; what fits in this machine's memory is checked by the commands.
inline constexpr std::int64_t max_width = std::int64_t{1} << 24;
inline constexpr std::int64_t max_parameters = 2147483647;  // 2^31 - 1

// Weights and biases of an MLP with these widths: the sum of (in + 1) * out (saturating at 2^62).
std::int64_t parameter_count(const std::vector<int>& dims);

struct ModelConfig {
  std::vector<int> dims;                     // widths: input, hidden..., output; at least two, each >= 1
  Activation activation = Activation::relu;  // between layers, not after the last
  Loss loss = Loss::mse;                     // mse: mean over batch x outputs; cross-entropy: mean over batch, labels

  int layers() const { return static_cast<int>(dims.size()) - 1; }
  int in_dim() const { return dims.front(); }
  int out_dim() const { return dims.back(); }
  void validate() const;  // throws UsageError, also beyond max_width or max_parameters
};

// "4,16,1" -> {4, 16, 1}; UsageError on anything but a list of at least two positive integers, and for
// a width beyond max_width or more than max_parameters parameters. The message names `option` ("--model")
// when given.
std::vector<int> parse_dims(std::string_view text, std::string_view option = {});
std::string dims_string(const std::vector<int>& dims);

// A named tensor inside a flat buffer.
struct Slice {
  std::string name;                 // "layers.0.weight"
  std::size_t offset = 0;           // in elements
  std::vector<std::int64_t> shape;  // {out, in} or {out}
  std::size_t size() const;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  std::size_t size() const { return size_; }
  const std::vector<Slice>& slices() const { return slices_; }
  const Slice& weight(int layer) const { return slices_[2 * static_cast<std::size_t>(layer)]; }
  const Slice& bias(int layer) const { return slices_[2 * static_cast<std::size_t>(layer) + 1]; }

  // The slice holding flat element i and i's multi-index inside it, e.g. "layers.1.weight[3, 7]".
  const Slice& slice_at(std::size_t i) const;
  std::string describe_element(std::size_t i) const;

 private:
  std::vector<Slice> slices_;
  std::size_t size_ = 0;
};

// torch.nn.Linear's default initialization: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)),
// drawn from the counter-based generator, so the same seed gives the same parameters everywhere.
std::vector<float> init_params(const ModelConfig& config, std::uint64_t seed);

}  // namespace dpcheck
