// NumPy .npy files (format versions 1.0, 2.0 and 3.0 on read; 1.0 on write): float32, float64 and
// int64, little-endian, C order. Anything else -- another dtype, Fortran order, a truncated file, a
// shape that does not match what the caller expects -- is a UsageError naming the file and the problem.
// Parameters travel as a directory of <name>.npy files, one per tensor (layers.0.weight.npy, ...).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "src/dtype.hpp"

namespace dpcheck {

struct NpyArray {
  DType dtype = DType::f32;         // f32, f64 or i64
  std::vector<std::int64_t> shape;  // empty for a 0-d array
  std::vector<unsigned char> data;  // raw little-endian elements, C order

  std::int64_t count() const;        // product of shape (1 for 0-d)
  std::string shape_string() const;  // "(256, 4)"

  // The elements converted to T: float32 from float32 or float64 (float64 is rounded once, to
  // nearest); double from either float type; int64 from int64 only. Other conversions throw UsageError.
  std::vector<float> as_float32() const;
  std::vector<double> as_float64() const;
  std::vector<std::int64_t> as_int64() const;

  // as_float32, for data and parameters that must be finite: a NaN, an infinity or a float64 beyond
  // float32's range is a UsageError naming `path`, the element ("element [3, 1]") and its value.
  std::vector<float> as_finite_float32(const std::filesystem::path& path) const;
};

NpyArray read_npy(const std::filesystem::path& path);

// A shape as NumPy prints it: "(256, 4)", "(3,)", "()".
std::string shape_text(std::span<const std::int64_t> shape);

// Flat element `flat` of a C-order array of `shape` as NumPy indexes it: "[3, 1]" ("[]" for 0-d).
std::string index_text(std::span<const std::int64_t> shape, std::size_t flat);

// Writes with write_file_atomic (src/io/files.hpp): a reader never sees half a file, and a symbolic link
// is written through to its target, as np.save does.
void write_npy(const std::filesystem::path& path, DType dtype, std::span<const std::int64_t> shape, const void* data);
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const float> data);
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const double> data);
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const std::int64_t> data);

// Reads path and checks its shape against `expected` (-1 matches any extent); the error message
// names the file, what was expected and what was found.
NpyArray read_npy_expect(const std::filesystem::path& path, std::span<const std::int64_t> expected);

}  // namespace dpcheck
