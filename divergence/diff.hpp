// dpcheck diff: where two runs part. Two traces (train --trace: JSON lines, one header and one line a
// step) are walked step by step, and within a step phase by phase -- data, local gradient, all-reduce,
// optimizer, loss -- rank by rank and tensor by tensor, to the first digest that differs. Two
// directories of .npy tensors (a checkpoint's step directory, or a PyTorch state_dict saved one .npy
// per key) are paired by file name and compared element by element, in units in the last place and in
// relative difference, against a tolerance. The results are values, so that a caller can go on from a
// difference (re-run the step, weigh it against a rounding bound); bad input -- a missing path, a file
// of neither kind, a malformed trace line -- is a UsageError naming the input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/dtype.hpp"

namespace dpcheck {

// ---- what a path holds ----------------------------------------------------------------------------

enum class DiffInput { trace, npy_dir };

// A directory is an .npy directory; a regular file whose first line is a JSON object with a
// "dpcheck_trace" key is a trace. Anything else (a missing path, a FIFO, some other file, a single
// .npy file) is a UsageError naming `label` ("A" or "B") and the path.
DiffInput diff_input_kind(const std::filesystem::path& path, std::string_view label);
std::string_view diff_input_name(DiffInput kind);  // "a trace", "a directory of .npy tensors"

// ---- traces -------------------------------------------------------------------------------------

// The trace format version this dpcheck reads (the header's "dpcheck_trace").
inline constexpr int trace_format_version = 1;

// One tensor as a trace records it: the XXH3-64 of its float32 bytes and, over its finite elements,
// the largest magnitude and the sum, with the count of NaN and infinite elements.
struct TraceTensor {
  std::string digest;  // 16 lower-case hex digits
  double max_abs = 0;
  double sum = 0;
  std::int64_t non_finite = 0;

  std::string describe() const;  // "digest 0123456789abcdef  max_abs 0.5  sum -1.25  non_finite 0"
};

// The phases of a step, in the order a diff walks them.
enum class TracePhase { data, local_gradient, all_reduce, optimizer, loss };
std::string_view phase_name(TracePhase phase);  // "data", "local gradient", "all-reduce", ...

// One compared item whose two sides differ.
struct TraceMismatch {
  std::int64_t step = 0;
  TracePhase phase = TracePhase::data;
  int rank = -1;     // whose item it is; -1 for the loss and for a collective's own fields
  std::string item;  // "indices", "local_grad layers.0.weight", "state exp_avg layers.1.bias", "loss",
                     // "collective seq 3 allreduce avg float32 count 1234 out"
  std::string a, b;  // each side's value as text
  std::optional<TraceTensor> tensor_a, tensor_b;  // set for tensors

  std::string where() const;  // "step 3, optimizer, rank 0, params layers.0.weight"
};

struct TraceStepCount {
  std::int64_t step = 0;
  std::int64_t differing = 0;  // items that differ
  std::int64_t compared = 0;   // items compared
};

struct TraceDiff {
  std::filesystem::path path_a, path_b;
  int world_size_a = 0, world_size_b = 0;
  // Header entries that differ, one a line: "lr 0.01 vs 0.1", "target.engine \"cpu\" vs \"cuda\"". Not
  // a failure by itself: runs of different configurations may still agree, and the diff says where not.
  std::vector<std::string> config_differences;
  std::vector<std::string> notes;  // what was left uncompared, and why
  bool comparable = true;          // false when the traces hold different tensors: no step compared
  std::int64_t steps_a = 0, steps_b = 0;
  std::int64_t steps_compared = 0;            // steps both hold (paired by step number)
  std::int64_t items_compared = 0;            // over all those steps
  std::int64_t only_in_a = 0, only_in_b = 0;  // steps one trace holds and the other does not
  std::int64_t first_only_in_a = -1, first_only_in_b = -1;
  // Every mismatch of the first step that has one, in walk order: the first of them is THE first
  // difference.
  std::vector<TraceMismatch> first_step;
  std::vector<TraceStepCount> differing_steps;  // every step with a mismatch, in order

  const TraceMismatch* first() const { return first_step.empty() ? nullptr : &first_step.front(); }
  bool identical() const { return comparable && differing_steps.empty() && only_in_a == 0 && only_in_b == 0; }
};

// Reads both traces whole (a step at a time). UsageError naming the file (and line) for a missing
// file, a malformed line, an unknown format version, steps out of order, or digests of different kinds.
TraceDiff diff_traces(const std::filesystem::path& a, const std::filesystem::path& b);

// The report: both inputs, the configuration, the first difference with both sides' summaries, the
// other differences of its step, the later differing steps, and a length mismatch; or one line when
// identical.
void print_trace_diff(std::ostream& out, const TraceDiff& d);
nlohmann::json to_json(const TraceDiff& d);

// ---- .npy directories ---------------------------------------------------------------------------

// How far two floating-point tensors may be apart and still pass. int64 tensors compare exactly
// whatever the tolerance.
struct Tolerance {
  enum class Kind { bitwise, ulp, rtol };
  Kind kind = Kind::bitwise;
  std::uint64_t ulp = 0;  // Kind::ulp: largest distance in units in the last place
  double rtol = 0;        // Kind::rtol: largest |a - b| / max(|a|, |b|)

  std::string describe() const;  // "bitwise", "--ulp 2", "--rtol 1e-06"
};

// The ULP distance of a NaN from anything but a NaN of the same bits.
inline constexpr std::uint64_t infinite_ulp = std::numeric_limits<std::uint64_t>::max();

struct TensorDiff {
  enum class Status { compared, only_in_a, only_in_b, dtype_differs, shape_differs };
  std::string name;  // the file name without ".npy": "layers.0.weight", "fc1.bias"
  Status status = Status::compared;
  DType dtype_a = DType::f32, dtype_b = DType::f32;
  std::vector<std::int64_t> shape_a, shape_b;
  std::int64_t count = 0;        // elements compared
  std::int64_t differing = 0;    // elements whose bits differ
  std::uint64_t max_ulp = 0;     // largest ULP distance (floats; infinite_ulp when a NaN meets a number)
  double max_rel = 0;            // largest |a - b| / max(|a|, |b|) (floats; infinity likewise)
  std::int64_t first = -1;       // flat index of the first element whose bits differ
  std::string first_index;       // the same as NumPy indexes it: "[3, 1]"
  std::string first_a, first_b;  // both values there, with their bits for floats
  bool passed = false;

  std::string status_text() const;  // "only in A", "dtype float32 vs float64", "shape (3,) vs (4,)", ""
};

// Pairs the .npy files of the two directories by name (in natural order: layers.2 before layers.10;
// manifest.json and every other file that is not .npy ignored) and compares each pair. UsageError
// naming the directory when it cannot be listed or holds no .npy file, and naming the file when one is
// not a readable .npy file.
std::vector<TensorDiff> diff_tensor_dirs(const std::filesystem::path& a, const std::filesystem::path& b,
                                         const Tolerance& tolerance);

// One row a tensor (shape, dtype, largest ULP and relative difference, elements differing, result,
// first difference with both values), then a verdict line naming every tensor that failed.
void print_tensor_diffs(std::ostream& out, const std::filesystem::path& a, const std::filesystem::path& b,
                        const std::vector<TensorDiff>& diffs, const Tolerance& tolerance);
nlohmann::json to_json(const std::filesystem::path& a, const std::filesystem::path& b,
                       const std::vector<TensorDiff>& diffs, const Tolerance& tolerance);

bool all_passed(const std::vector<TensorDiff>& diffs);

}  // namespace dpcheck
