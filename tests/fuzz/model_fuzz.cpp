// libFuzzer target for the model spec parser, parse_dims (src/train/model.hpp): "784,256,10" -> widths. What
// it accepts is at least two widths, each >= 1, that the model's own validation accepts too, and that
// print back (dims_string) to a spec parsing to the same widths.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/error.hpp"
#include "src/train/model.hpp"
#include "tests/fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<int> dims;
  try {
    dims = dpcheck::parse_dims(dpcheck::fuzz::as_text(data, size));
  } catch (const dpcheck::UsageError&) {
    return 0;  // the documented refusal
  }
  DPCHECK_FUZZ_CHECK(dims.size() >= 2);
  for (const int d : dims) DPCHECK_FUZZ_CHECK(d >= 1);
  dpcheck::ModelConfig config;
  config.dims = dims;
  config.validate();  // a UsageError here escapes: the parser let through what the model refuses
  DPCHECK_FUZZ_CHECK(dpcheck::parse_dims(dpcheck::dims_string(dims)) == dims);
  return 0;
}
