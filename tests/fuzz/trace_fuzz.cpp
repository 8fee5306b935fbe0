// libFuzzer target for the trace reader of `dpcheck diff` (divergence/diff.hpp): the input is a whole trace
// file (corpus/trace/ holds ones that train --trace wrote, a resumed one and a failing step that a live
// check stopped part way). Diffing a file against itself must either refuse it with a UsageError naming
// it, or find the two identical: every step compared, no mismatch.
#include <cstddef>
#include <cstdint>

#include "divergence/diff.hpp"
#include "src/error.hpp"
#include "tests/fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const dpcheck::fuzz::ScratchDir dir;
  const std::filesystem::path trace = dir.path() / "trace.jsonl";
  dpcheck::fuzz::write_input(trace, data, size);
  try {
    const dpcheck::TraceDiff d = dpcheck::diff_traces(trace, trace);
    DPCHECK_FUZZ_CHECK(d.identical());
    DPCHECK_FUZZ_CHECK(d.steps_a == d.steps_b && d.steps_compared == d.steps_a);
  } catch (const dpcheck::UsageError&) {
    // the documented refusal
  }
  return 0;
}
