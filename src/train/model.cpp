#include "src/train/model.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "src/error.hpp"
#include "src/io/npy.hpp"
#include "src/rng.hpp"

namespace dpcheck {

std::int64_t parameter_count(const std::vector<int>& dims) {
  std::int64_t n = 0;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    // Widths up to max_width keep each product within 2^49, so the sum is checked before it can overflow.
    const std::int64_t in = std::min<std::int64_t>(dims[l], max_width),
                       out = std::min<std::int64_t>(dims[l + 1], max_width);
    n += (in + 1) * out;
    if (n > (std::int64_t{1} << 62)) return std::int64_t{1} << 62;
  }
  return n;
}

namespace {

// Why these widths are too large, or "" when they are not.
std::string too_large(const std::vector<int>& dims) {
  for (int d : dims)
    if (d > max_width) return "width " + std::to_string(d) + " is larger than " + std::to_string(max_width);
  if (const std::int64_t n = parameter_count(dims); n > max_parameters)
    return std::to_string(n) + " parameters, more than the " + std::to_string(max_parameters) +
           " (2^31 - 1) dpcheck handles";
  return {};
}

}  // namespace

void ModelConfig::validate() const {
  if (dims.size() < 2) throw UsageError("a model needs at least two widths (input and output)");
  for (int d : dims)
    if (d < 1) throw UsageError("model widths must be positive, got " + dims_string(dims));
  if (const std::string why = too_large(dims); !why.empty())
    throw UsageError("model " + dims_string(dims) + " is too large: " + why);
}

std::vector<int> parse_dims(std::string_view text, std::string_view option) {
  std::vector<int> dims;
  const std::string model =
      option.empty() ? "bad model '" + std::string(text) + "'" : std::string(option) + " " + std::string(text);
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (!item.empty() && ec == std::errc::result_out_of_range && item.front() != '-')
      throw UsageError(model + ": width " + std::string(item) + " is larger than " + std::to_string(max_width));
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 1)
      throw UsageError(model + ": expected comma-separated positive widths such as 784,256,10");
    if (value > max_width)
      throw UsageError(model + ": width " + std::string(item) + " is larger than " + std::to_string(max_width));
    dims.push_back(static_cast<int>(value));
    pos = comma + 1;
  }
  if (dims.size() < 2) throw UsageError(model + ": give at least an input and an output width");
  if (const std::string why = too_large(dims); !why.empty()) throw UsageError(model + ": " + why);
  return dims;
}

std::string dims_string(const std::vector<int>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s;
}

std::size_t Slice::size() const {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

ParamLayout::ParamLayout(const ModelConfig& config) {
  config.validate();
  for (int l = 0; l < config.layers(); ++l) {
    const std::int64_t in = config.dims[static_cast<std::size_t>(l)];
    const std::int64_t out = config.dims[static_cast<std::size_t>(l) + 1];
    const std::string prefix = "layers." + std::to_string(l) + ".";
    slices_.push_back({prefix + "weight", size_, {out, in}});
    size_ += slices_.back().size();
    slices_.push_back({prefix + "bias", size_, {out}});
    size_ += slices_.back().size();
  }
}

const Slice& ParamLayout::slice_at(std::size_t i) const {
  for (const Slice& s : slices_)
    if (i >= s.offset && i < s.offset + s.size()) return s;
  throw Error("element " + std::to_string(i) + " is outside the parameter buffer of " + std::to_string(size_) +
              " elements");
}

std::string ParamLayout::describe_element(std::size_t i) const {
  const Slice& s = slice_at(i);
  return s.name + index_text(s.shape, i - s.offset);
}

std::vector<float> init_params(const ModelConfig& config, std::uint64_t seed) {
  const ParamLayout layout(config);
  std::vector<float> params(layout.size());
  const std::uint64_t key = mix_key(seed, 0x1A17);
  for (int l = 0; l < config.layers(); ++l) {
    // PyTorch computes 1/sqrt(fan_in) in double, then draws in float32.
    const auto bound =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.dims[static_cast<std::size_t>(l)])));
    for (const Slice* s : {&layout.weight(l), &layout.bias(l)})
      for (std::size_t i = s->offset; i < s->offset + s->size(); ++i) params[i] = bound * random_symmetric(key, 0, i);
  }
  return params;
}

}  // namespace dpcheck
