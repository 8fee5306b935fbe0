// Examples and batches. The synthetic data set is a pure function of (seed, example index), drawn from
// the counter-based generator, so every rank -- and the GPU -- produces the same examples with no
// communication. Real data loads from .npy files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "src/train/model.hpp"

namespace dpcheck {

struct Batch {
  std::int64_t size = 0;
  int in_dim = 0;
  int out_dim = 0;
  Loss loss = Loss::mse;
  std::vector<float> x;              // size x in_dim, row-major
  std::vector<float> y;              // mse: size x out_dim targets
  std::vector<std::int64_t> labels;  // cross-entropy: size class indices in [0, out_dim)

  // Examples [begin, end) as a batch of their own.
  Batch slice(std::int64_t begin, std::int64_t end) const;
};

// Concatenates batches of the same shape and loss, in order.
Batch concat(std::span<const Batch> parts);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual int in_dim() const = 0;
  virtual int out_dim() const = 0;
  virtual Loss loss() const = 0;
  // Writes example `index`: in_dim inputs to x, and out_dim targets to y (mse) or one class to label
  // (cross-entropy); the pointer the loss does not use may be null.
  virtual void example(std::int64_t index, float* x, float* y, std::int64_t* label) const = 0;

  // The examples at `indices` (repeats allowed), in that order.
  Batch gather(std::span<const std::int64_t> indices) const;
};

class SyntheticDataset final : public Dataset {
 public:
  // Inputs uniform in [-1, 1); mse targets uniform in [-1, 1); classes uniform in [0, out_dim).
  SyntheticDataset(std::int64_t size, const ModelConfig& model, std::uint64_t seed);

  std::int64_t size() const override { return size_; }
  int in_dim() const override { return in_dim_; }
  int out_dim() const override { return out_dim_; }
  Loss loss() const override { return loss_; }
  void example(std::int64_t index, float* x, float* y, std::int64_t* label) const override;

 private:
  std::int64_t size_;
  int in_dim_, out_dim_;
  Loss loss_;
  std::uint64_t key_;
};

class ArrayDataset final : public Dataset {
 public:
  explicit ArrayDataset(Batch all);

  // x: float32 or float64 of shape (B, in); y: for mse float of shape (B, out) (or (B,) when out is 1),
  // for cross-entropy int64 of shape (B,) with classes in [0, out); every float finite in float32.
  // UsageError naming the file otherwise.
  static ArrayDataset load(const std::filesystem::path& x, const std::filesystem::path& y, const ModelConfig& model);

  std::int64_t size() const override { return all_.size; }
  int in_dim() const override { return all_.in_dim; }
  int out_dim() const override { return all_.out_dim; }
  Loss loss() const override { return all_.loss; }
  void example(std::int64_t index, float* x, float* y, std::int64_t* label) const override;

 private:
  Batch all_;
};

}  // namespace dpcheck
