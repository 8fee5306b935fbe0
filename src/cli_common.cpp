#include "src/cli_common.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "src/error.hpp"
#include "src/npy.hpp"

namespace dpcheck::cli {

void ModelOptions::add_to(CLI::App& sub, bool required) {
  CLI::Option* m = sub.add_option("--model", dims, "Layer widths, input first, e.g. 784,256,10");
  if (required) m->required();
  sub.add_option("--activation", activation, "relu (default), tanh or identity");
  sub.add_option("--loss", loss, "mse (default) or cross-entropy");
}

ModelConfig ModelOptions::config() const {
  ModelConfig c;
  c.dims = parse_dims(dims);
  c.activation = parse_activation(activation);
  c.loss = parse_loss(loss);
  return c;
}

std::vector<float> load_params_dir(const std::string& dir, const ModelConfig& model) {
  if (!std::filesystem::is_directory(dir)) throw UsageError(dir + ": not a directory of .npy parameter files");
  const ParamLayout layout(model);
  std::vector<float> params(layout.size());
  for (const Slice& s : layout.slices()) {
    const NpyArray a = read_npy_expect(std::filesystem::path(dir) / (s.name + ".npy"), s.shape);
    if (a.dtype == DType::i64) throw UsageError(dir + "/" + s.name + ".npy: parameters must be float32 or float64");
    const std::vector<float> v = a.as_float32();
    std::copy(v.begin(), v.end(), params.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  return params;
}

void save_params_dir(const std::string& dir, const ModelConfig& model, std::span<const float> params) {
  std::filesystem::create_directories(dir);
  const ParamLayout layout(model);
  for (const Slice& s : layout.slices())
    write_npy(std::filesystem::path(dir) / (s.name + ".npy"), s.shape, params.subspan(s.offset, s.size()));
}

std::string float_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace dpcheck::cli
