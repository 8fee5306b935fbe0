// libFuzzer target for the benchmark's size list parser, bench::parse_sizes (src/bench/bench.hpp): "4K,1M,64M"
// -> bytes. What it accepts is one positive size per comma-separated item, each of which reads back the
// same when written as a plain number of bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/bench/bench.hpp"
#include "src/error.hpp"
#include "tests/fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = dpcheck::fuzz::as_text(data, size);
  std::vector<std::size_t> sizes;
  try {
    sizes = dpcheck::bench::parse_sizes(text);
  } catch (const dpcheck::UsageError&) {
    return 0;  // the documented refusal
  }
  DPCHECK_FUZZ_CHECK(sizes.size() == static_cast<std::size_t>(std::count(text.begin(), text.end(), ',')) + 1);
  for (const std::size_t s : sizes) {
    DPCHECK_FUZZ_CHECK(s > 0);
    DPCHECK_FUZZ_CHECK(dpcheck::bench::parse_size(std::to_string(s)) == s);
  }
  return 0;
}
