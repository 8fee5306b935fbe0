#include "src/train/data.hpp"

#include <algorithm>
#include <string>

#include "src/error.hpp"
#include "src/io/npy.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

Batch empty_like(int in_dim, int out_dim, Loss loss) {
  Batch b;
  b.in_dim = in_dim;
  b.out_dim = out_dim;
  b.loss = loss;
  return b;
}

}  // namespace

Batch Batch::slice(std::int64_t begin, std::int64_t end) const {
  DPCHECK_ASSERT(0 <= begin && begin <= end && end <= size);
  Batch out = empty_like(in_dim, out_dim, loss);
  out.size = end - begin;
  const auto in = static_cast<std::size_t>(in_dim), o = static_cast<std::size_t>(out_dim);
  const auto b = static_cast<std::size_t>(begin), e = static_cast<std::size_t>(end);
  out.x.assign(x.begin() + static_cast<std::ptrdiff_t>(b * in), x.begin() + static_cast<std::ptrdiff_t>(e * in));
  if (loss == Loss::mse)
    out.y.assign(y.begin() + static_cast<std::ptrdiff_t>(b * o), y.begin() + static_cast<std::ptrdiff_t>(e * o));
  else
    out.labels.assign(labels.begin() + static_cast<std::ptrdiff_t>(b), labels.begin() + static_cast<std::ptrdiff_t>(e));
  return out;
}

Batch concat(std::span<const Batch> parts) {
  DPCHECK_ASSERT(!parts.empty());
  Batch out = empty_like(parts[0].in_dim, parts[0].out_dim, parts[0].loss);
  for (const Batch& p : parts) {
    DPCHECK_ASSERT(p.in_dim == out.in_dim && p.out_dim == out.out_dim && p.loss == out.loss);
    out.size += p.size;
    out.x.insert(out.x.end(), p.x.begin(), p.x.end());
    out.y.insert(out.y.end(), p.y.begin(), p.y.end());
    out.labels.insert(out.labels.end(), p.labels.begin(), p.labels.end());
  }
  return out;
}

Batch Dataset::gather(std::span<const std::int64_t> indices) const {
  Batch b = empty_like(in_dim(), out_dim(), loss());
  b.size = static_cast<std::int64_t>(indices.size());
  const auto in = static_cast<std::size_t>(in_dim()), o = static_cast<std::size_t>(out_dim());
  b.x.resize(indices.size() * in);
  if (loss() == Loss::mse) b.y.resize(indices.size() * o);
  else b.labels.resize(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t i = indices[k];
    if (i < 0 || i >= size())
      throw Error("example " + std::to_string(i) + " is outside the data set of " + std::to_string(size()));
    example(i, b.x.data() + k * in, loss() == Loss::mse ? b.y.data() + k * o : nullptr,
            loss() == Loss::cross_entropy ? b.labels.data() + k : nullptr);
  }
  return b;
}

namespace {
// Validates before the widths are read: dims.front() of an empty list is undefined.
const ModelConfig& validated(const ModelConfig& model) {
  model.validate();
  return model;
}
}  // namespace

SyntheticDataset::SyntheticDataset(std::int64_t size, const ModelConfig& model, std::uint64_t seed)
    : size_(size),
      in_dim_(validated(model).in_dim()),
      out_dim_(model.out_dim()),
      loss_(model.loss),
      key_(mix_key(seed, 0xDA7A)) {
  if (size < 0) throw UsageError("data set size must be >= 0");
}

void SyntheticDataset::example(std::int64_t index, float* x, float* y, std::int64_t* label) const {
  const auto i = static_cast<std::uint64_t>(index);
  // Stream 0 holds inputs, 1 targets, 2 labels; within a stream, element j of example i sits at
  // counter i * width + j, so an example never depends on the data set's size.
  for (int j = 0; j < in_dim_; ++j)
    x[j] = random_symmetric(key_, 0, i * static_cast<std::uint64_t>(in_dim_) + static_cast<std::uint64_t>(j));
  if (y)
    for (int j = 0; j < out_dim_; ++j)
      y[j] = random_symmetric(key_, 1, i * static_cast<std::uint64_t>(out_dim_) + static_cast<std::uint64_t>(j));
  if (label) *label = static_cast<std::int64_t>(random_below(key_, 2, i, static_cast<std::uint64_t>(out_dim_)));
}

ArrayDataset::ArrayDataset(Batch all) : all_(std::move(all)) {}

ArrayDataset ArrayDataset::load(const std::filesystem::path& x_path, const std::filesystem::path& y_path,
                                const ModelConfig& model) {
  model.validate();
  const std::int64_t in = model.in_dim(), out = model.out_dim();
  const NpyArray x = read_npy(x_path);
  if (x.dtype == DType::i64) throw UsageError(x_path.string() + ": inputs must be float32 or float64, found int64");
  if (x.shape.size() != 2 || x.shape[1] != in)
    throw UsageError(x_path.string() + ": expected inputs of shape (B, " + std::to_string(in) + "), found " +
                     x.shape_string());
  Batch all = empty_like(static_cast<int>(in), static_cast<int>(out), model.loss);
  all.size = x.shape[0];
  all.x = x.as_finite_float32(x_path);

  const NpyArray y = read_npy(y_path);
  if (model.loss == Loss::mse) {
    const bool ok = y.dtype != DType::i64 && ((y.shape.size() == 2 && y.shape[0] == all.size && y.shape[1] == out) ||
                                              (out == 1 && y.shape.size() == 1 && y.shape[0] == all.size));
    if (!ok)
      throw UsageError(y_path.string() + ": mse targets must be float32 or float64 of shape (" +
                       std::to_string(all.size) + ", " + std::to_string(out) + "), found " +
                       std::string(dtype_name(y.dtype)) + " " + y.shape_string());
    all.y = y.as_finite_float32(y_path);
  } else {
    if (y.dtype != DType::i64 || y.shape.size() != 1 || y.shape[0] != all.size)
      throw UsageError(y_path.string() + ": cross-entropy labels must be int64 of shape (" + std::to_string(all.size) +
                       ",), found " + std::string(dtype_name(y.dtype)) + " " + y.shape_string());
    all.labels = y.as_int64();
    for (std::int64_t c : all.labels)
      if (c < 0 || c >= out)
        throw UsageError(y_path.string() + ": label " + std::to_string(c) + " is outside [0, " + std::to_string(out) +
                         ")");
  }
  return ArrayDataset(std::move(all));
}

void ArrayDataset::example(std::int64_t index, float* x, float* y, std::int64_t* label) const {
  const auto i = static_cast<std::size_t>(index);
  const auto in = static_cast<std::size_t>(all_.in_dim), o = static_cast<std::size_t>(all_.out_dim);
  std::copy_n(all_.x.begin() + static_cast<std::ptrdiff_t>(i * in), in, x);
  if (y) std::copy_n(all_.y.begin() + static_cast<std::ptrdiff_t>(i * o), o, y);
  if (label) *label = all_.labels[i];
}

}  // namespace dpcheck
