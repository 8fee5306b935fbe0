// What the pieces of `dpcheck conform --kernels` share: a case and its text, one call's result, the table
// of op checks and the classes of shapes cases are drawn from. Internal to conform/conform_kernels*.cpp;
// nothing else includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "reference/kernel_bound.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/train/model.hpp"

namespace dpcheck {
namespace conform_kernels_detail {

using reference::Expected;

// ---- cases (conform_kernels_cases.cpp) ---------------------------------------------------------------

// One call's inputs: the sizes and options that matter to the op (the others keep their defaults), and
// the seed its values are drawn from.
struct Case {
  std::int64_t rows = 1, in = 1, out = 1, n = 1, accumulate = 0, dx = 1, step = 1, offset = 0;
  Activation act = Activation::relu;
  Loss loss = Loss::mse;
  double scale = 1, lr = 0.1, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::uint64_t seed = 0;
};

enum class Field {
  rows,
  in,
  out,
  n,
  accumulate,
  dx,
  step,
  offset,
  act,
  loss,
  scale,
  lr,
  momentum,
  beta1,
  beta2,
  eps,
  seed
};

std::string_view field_name(Field f);
// The field's member of c, when it is an integer one (nullptr otherwise).
std::int64_t* int_field(Case& c, Field f);
const std::int64_t* int_field(const Case& c, Field f);
// The shortest decimal that reads back as the same double.
std::string real_text(double v);
// The case as --case takes it: NAME=VALUE for each of `fields`, in their order.
std::string case_text(Case c, std::span<const Field> fields);
// Whether a check's rows may be 0 (an empty batch): a linear op's may, a loss over no rows has no mean.
bool allows_empty_batch(std::span<const Field> fields);
// The case --case gives for the check named `check`; a UsageError when it is not one.
Case parse_case(const std::string& text, std::span<const Field> fields, const std::string& check);

// ---- running one case (conform_kernels_ops.cpp) ------------------------------------------------------

// A buffer of floats in an allocation of its own, guard elements around it poisoned.
class Buffer;

// What one call did: the largest error ratio, the first reason it fails (empty: it passes), and every
// output's bits, for the determinism check.
struct Run {
  double ratio = 0;
  std::string why;
  std::vector<unsigned char> bits;

  void keep_bits(const void* p, std::size_t bytes);
  // Compares an output with its expected values; `cols` > 0 names elements [row, col].
  void compare(std::string_view name, const Buffer& got, const Expected& want, std::int64_t cols);
  void compare_loss(double got, double want, double bound);
  static double error_ratio(double got, double want, double bound);
};

using Runner = Run (*)(const Kernels&, const Case&, const reference::BoundOptions&);

struct OpCheck {
  KernelOp op;
  std::vector<Field> fields;  // what its case text holds, in this order
  std::string_view promise;
  Runner run;
};

// One check for each op a kernel plugin may provide.
std::vector<OpCheck> op_checks();

// ---- shapes (conform_kernels_shapes.cpp) -------------------------------------------------------------

// The classes of shapes a case is drawn from. Each drawn case belongs to one, since kernels (BLAS
// libraries above all) switch code paths with size and their bugs live on the paths small shapes never
// take:
//   tiny                 every size 1-8, below one vector of floats;
//   tile edges           sizes just around the widths kernels tile by (15-17, 31-33, 63-65) and any up to 70;
//   odd                  one or two sizes odd in the hundreds (101-999), the others odd below 100;
//   past a power of two  one or two sizes of 2^k - 1, 2^k + 1 or 2^k + 3 for k = 7..10, where blocked and
//                        threaded paths leave a remainder of one;
//   large                one or two sizes in 513 up to the size limit, the others moderate (the first
//                        large case of a run has every size past 512, rows, in and out each 513-640);
//   rows = 0             an empty batch for the linear ops: y has no elements, dw and db come back zero
//                        (written) or exactly as they were (accumulated).
// A class's other sizes are moderate (tile edges; odd ones for the odd class), so that a case costs a few
// times 10^8 multiply-adds at most even in a naive kernel. ConformOptions::max_kernel_size caps every drawn
// size: a class shrinks to it or, with no size left below it, is dropped (the row's detail says so) and its
// turns go to the next class. Vectors (n) and the loss's rows and columns take the same classes but rows = 0.
enum class ShapeClass { tiny, tile_edges, odd, past_power_of_two, large, empty_batch };
inline constexpr ShapeClass kShapeClasses[] = {ShapeClass::tiny,  ShapeClass::tile_edges,
                                               ShapeClass::odd,   ShapeClass::past_power_of_two,
                                               ShapeClass::large, ShapeClass::empty_batch};

inline constexpr std::int64_t kLargeMin = 513;
// The most max_kernel_size may be: two sizes at it keep a matrix within check_case's 2^24 elements, so
// that every drawn case replays.
inline constexpr std::int64_t kMaxSizeLimit = 4096;

std::string shape_class_name(ShapeClass s);
// The sizes a check's shape has: rows, in and out (linear ops), rows and out (the loss), or n (vectors).
std::vector<Field> size_fields(std::span<const Field> fields);
// Whether a check draws cases of class s under max_size.
bool drawn_for(ShapeClass s, std::span<const Field> fields, std::int64_t max_size);
// The class a replayed case falls in, by its sizes.
ShapeClass shape_class_of(const Case& c, std::span<const Field> fields);

struct Drawn {
  Case c;
  ShapeClass shape;
};

// Case i of a check, drawn from `seed` with no size past max_size.
Drawn draw_case(const OpCheck& check, std::uint64_t seed, int i, std::int64_t max_size);
// Smaller cases than c, the simplest first, for shrinking a failing one.
std::vector<Case> shrinks_of(const Case& c, std::span<const Field> fields);

}  // namespace conform_kernels_detail
}  // namespace dpcheck
