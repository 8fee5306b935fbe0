// libFuzzer target for the .npy reader (src/io/npy.hpp): the input is a whole file. read_npy reads from a
// path, so each input is written to a private scratch directory first. A file it accepts must hold
// exactly shape x dtype bytes, convert as documented, and come back unchanged through write_npy.
#include <cstddef>
#include <cstdint>

#include "src/error.hpp"
#include "src/io/npy.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

void check_accepted(const dpcheck::NpyArray& a, const std::filesystem::path& copy) {
  using dpcheck::DType;
  DPCHECK_FUZZ_CHECK(a.dtype == DType::f32 || a.dtype == DType::f64 || a.dtype == DType::i64);
  DPCHECK_FUZZ_CHECK(a.count() >= 0);
  DPCHECK_FUZZ_CHECK(a.data.size() == static_cast<std::size_t>(a.count()) * dpcheck::dtype_size(a.dtype));
  for (const std::int64_t d : a.shape) DPCHECK_FUZZ_CHECK(d >= 0);

  const auto n = static_cast<std::size_t>(a.count());
  if (a.dtype == DType::i64) {
    DPCHECK_FUZZ_CHECK(a.as_int64().size() == n);
  } else {
    DPCHECK_FUZZ_CHECK(a.as_float32().size() == n);
    DPCHECK_FUZZ_CHECK(a.as_float64().size() == n);
  }

  dpcheck::write_npy(copy, a.dtype, a.shape, a.data.data());
  const dpcheck::NpyArray b = dpcheck::read_npy(copy);
  DPCHECK_FUZZ_CHECK(b.dtype == a.dtype && b.shape == a.shape && b.data == a.data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const dpcheck::fuzz::ScratchDir dir;
  const std::filesystem::path input = dir.path() / "input.npy";
  dpcheck::fuzz::write_input(input, data, size);
  dpcheck::NpyArray a;
  try {
    a = dpcheck::read_npy(input);
  } catch (const dpcheck::UsageError&) {
    return 0;  // the documented refusal of a malformed file
  }
  check_accepted(a, dir.path() / "copy.npy");
  return 0;
}
