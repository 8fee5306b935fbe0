// dpcheck conform --kernels: each op a kernel plugin provides, against the float64 reference within the
// derived bound (reference/kernel_bound.hpp, reference/optimizer.hpp), on drawn shapes, buffers a few
// floats off their allocation's alignment, and outputs filled with a NaN before each call so that an
// element the kernel never writes cannot pass (and guard elements around each buffer, so that one written
// outside it is caught too). Accumulating outputs are checked both ways. Every op runs each case twice
// more for run-to-run bitwise determinism. A failing case is shrunk (each size and option in turn, while
// it still fails) to the minimal case that `--check NAME --case TEXT` replays alone. Then verify's
// properties run with the plugin's kernels.
//
// Each drawn case belongs to one class of shapes (conform_kernels_internal.hpp says which and why), and
// each row reports the largest error ratio of each class. This file judges and shrinks the cases and
// writes the rows; conform_kernels_cases.cpp holds a case's text, conform_kernels_ops.cpp runs one case
// of each op, and conform_kernels_shapes.cpp draws the cases.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "conform/conform.hpp"
#include "conform/conform_kernels_internal.hpp"
#include "mutants/mutants.hpp"
#include "src/error.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "verdict/bounds.hpp"

namespace dpcheck {
namespace conform_kernels_detail {

namespace {

using Clock = std::chrono::steady_clock;

// Whether a case fails its check: the op's promise, or (determinism) two runs that agree bit for bit.
struct Verdict {
  bool failed = false;
  double ratio = 0;
  std::string why;
};

Verdict judge(const OpCheck& check, bool determinism, const Kernels& k, const Case& c,
              const reference::BoundOptions& bo) {
  const Run first = check.run(k, c, bo);
  if (!determinism) return {!first.why.empty() || !(first.ratio <= 1), first.ratio, first.why};
  const Run second = check.run(k, c, bo);  // fresh buffers at other addresses
  if (first.bits == second.bits) return {false, first.ratio, ""};
  std::size_t byte = 0;
  while (byte < first.bits.size() && byte < second.bits.size() && first.bits[byte] == second.bits[byte]) ++byte;
  return {true, first.ratio,
          "two runs on the same inputs differ (first at output byte " + std::to_string(byte) + " of " +
              std::to_string(first.bits.size()) + ")"};
}

struct Shrunk {
  Case c;
  Verdict v;
};

Shrunk shrink(const OpCheck& check, bool determinism, const Kernels& k, Shrunk failing,
              const reference::BoundOptions& bo) {
  for (int tries = 0; tries < 400;) {
    bool smaller = false;
    for (const Case& candidate : shrinks_of(failing.c, check.fields)) {
      ++tries;
      const Verdict v = judge(check, determinism, k, candidate, bo);
      if (v.failed) {
        failing = {candidate, v};
        smaller = true;
        break;
      }
    }
    if (!smaller) break;
  }
  return failing;
}

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::isfinite(r) ? "%.3g" : "%g", r);
  return buf;
}

std::string check_name(const OpCheck& check, bool determinism) {
  return std::string(kernel_op_name(check.op)) + (determinism ? " determinism" : "");
}

// The class with the largest ratio of all (none when every ratio is 0).
std::string worst_class(const std::map<std::string, double>& ratios) {
  std::string worst;
  double largest = 0;
  for (const auto& [name, ratio] : ratios)
    if (ratio > largest) {
      largest = ratio;
      worst = name;
    }
  return worst;
}

// What the drawn cases covered, for a passing row: the cases of each class, the classes the size limit
// dropped, the range of each size.
std::string coverage(const OpCheck& check, const std::vector<Drawn>& cases, std::int64_t max_size) {
  const std::vector<Field> sizes = size_fields(check.fields);
  std::string text = std::to_string(cases.size()) + " cases:";
  std::string dropped;
  bool first = true;
  for (ShapeClass s : kShapeClasses) {
    if (!drawn_for(s, check.fields, max_size)) {
      if (s != ShapeClass::empty_batch || allows_empty_batch(check.fields))
        dropped += (dropped.empty() ? "" : ", ") + shape_class_name(s);
      continue;
    }
    const auto n = std::count_if(cases.begin(), cases.end(), [&](const Drawn& d) { return d.shape == s; });
    if (n == 0) continue;
    text += (first ? " " : ", ") + shape_class_name(s) + " " + std::to_string(n);
    first = false;
    const auto all_large = [](const Drawn& d) {
      return d.c.rows >= kLargeMin && d.c.in >= kLargeMin && d.c.out >= kLargeMin;
    };
    if (s == ShapeClass::large && sizes.size() == 3 && std::any_of(cases.begin(), cases.end(), all_large))
      text += " (one with rows, in and out past 512)";
  }
  if (!dropped.empty()) text += " (max size " + std::to_string(max_size) + ": no " + dropped + ")";
  text += ";";
  for (Field f : sizes) {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
    for (const Drawn& d : cases) {
      lo = std::min(lo, *int_field(d.c, f));
      hi = std::max(hi, *int_field(d.c, f));
    }
    // The loss's out is its columns.
    const std::string name = f == Field::out && sizes.size() == 2 ? "cols" : std::string(field_name(f));
    text += " " + name + " " + std::to_string(lo) + "-" + std::to_string(hi);
  }
  const auto has = [&](Field f) {
    return std::find(check.fields.begin(), check.fields.end(), f) != check.fields.end();
  };
  std::int64_t step = 0;
  for (const Drawn& d : cases) step = std::max(step, d.c.step);
  if (has(Field::step)) text += ", steps 1-" + std::to_string(step);
  if (has(Field::accumulate)) text += ", accumulate 0 and 1";
  if (has(Field::act)) text += ", relu and tanh";
  if (has(Field::loss)) text += ", mse and cross-entropy";
  return text + ", offsets 0-3, outputs poisoned";
}

ConformRow check_row(const OpCheck& check, bool determinism, const Kernels& k, const ConformOptions& options,
                     const reference::BoundOptions& bo) {
  const auto start = Clock::now();
  ConformRow row;
  row.section = "kernels";
  row.check = check_name(check, determinism);
  row.promise = determinism ? "the same inputs give the same bits, run after run" : std::string(check.promise);
  const auto fail = [&](const Shrunk& s) {
    row.verdict = ConformVerdict::fail;
    row.minimal = case_text(s.c, check.fields);
    row.detail = s.v.why + (determinism ? "" : "; largest error ratio over the outputs " + ratio_text(s.v.ratio));
    row.replay = options.replay_prefix + " --check '" + row.check + "' --case '" + row.minimal + "'";
  };
  // The largest ratio of each class (the determinism rows compare bits, not ratios).
  const auto note_ratio = [&](ShapeClass s, double ratio) {
    if (determinism) return;
    double& largest = row.ratio_by_shape_class[shape_class_name(s)];
    largest = std::max(largest, ratio);
  };
  if (!options.case_text.empty()) {
    const Case c = parse_case(options.case_text, check.fields, row.check);
    const ShapeClass shape = shape_class_of(c, check.fields);
    const Verdict v = judge(check, determinism, k, c, bo);
    note_ratio(shape, v.ratio);
    if (v.failed) fail({c, v});
    else
      row.detail = "the case passes" +
                   (determinism ? std::string(": two runs agree bit for bit")
                                : ": error ratio " + ratio_text(v.ratio) + " (" + shape_class_name(shape) + ")");
  } else {
    // Determinism reruns fewer cases: a kernel that depends on a counter or an address shows it at once.
    const int cases = std::max(1, determinism ? options.cases / 4 : options.cases);
    const std::int64_t max_size = options.max_kernel_size;
    std::vector<Drawn> drawn;
    double worst = 0;
    for (int i = 0; i < cases; ++i) {
      Drawn d = draw_case(check, options.seed, i, max_size);
      if (mutant_conform_kernel_whole_tiles(options.mutant))
        for (Field f : size_fields(check.fields)) {
          std::int64_t& v = *int_field(d.c, f);
          v = (v + 7) / 8 * 8;
        }
      drawn.push_back(d);
      const Verdict v = judge(check, determinism, k, d.c, bo);
      note_ratio(d.shape, v.ratio);
      if (v.failed) {
        fail(shrink(check, determinism, k, {d.c, v}, bo));
        row.detail += " (case " + std::to_string(i + 1) + " of " + std::to_string(cases) + ", " +
                      shape_class_name(d.shape) + ", shrunk)";
        break;
      }
      worst = std::max(worst, v.ratio);
    }
    if (row.verdict == ConformVerdict::pass) {
      row.detail = coverage(check, drawn, max_size);
      if (determinism) {
        row.detail += ", each run twice: bitwise identical";
      } else {
        const std::string where = worst_class(row.ratio_by_shape_class);
        row.detail += "; largest error ratio " + ratio_text(worst) + (where.empty() ? "" : " (" + where + ")");
      }
    }
  }
  row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return row;
}

}  // namespace

}  // namespace conform_kernels_detail

std::vector<std::string> conform_kernel_checks() {
  using conform_kernels_detail::check_name;
  using conform_kernels_detail::op_checks;
  using conform_kernels_detail::OpCheck;
  std::vector<std::string> names;
  for (bool determinism : {false, true})
    for (const OpCheck& check : op_checks()) names.push_back(check_name(check, determinism));
  return names;
}

std::vector<ConformRow> conform_kernels(const Target& target, const ConformOptions& options) {
  using conform_kernels_detail::check_name;
  using conform_kernels_detail::check_row;
  using conform_kernels_detail::kMaxSizeLimit;
  using conform_kernels_detail::op_checks;
  using conform_kernels_detail::OpCheck;
  if (target.kernels.empty()) throw UsageError("conform_kernels needs a kernel plugin (--kernels PATH)");
  const KernelPlugin& plugin = load_kernel_plugin(target.kernels);
  require_kernels_for_engine(plugin, *target.engine);
  if (options.cases < 1) throw UsageError("--cases must be at least 1");
  if (options.max_kernel_size < 1 || options.max_kernel_size > kMaxSizeLimit)
    throw UsageError("--max-size must be in [1, " + std::to_string(kMaxSizeLimit) +
                     "] (the kernel checks' largest size; got " + std::to_string(options.max_kernel_size) + ")");
  const std::vector<OpCheck> checks = op_checks();

  // --check: one of these rows, or one of verify's properties.
  const OpCheck* only = nullptr;
  bool only_determinism = false;
  if (!options.check.empty()) {
    for (const OpCheck& c : checks)
      for (bool d : {false, true})
        if (check_name(c, d) == options.check) {
          only = &c;
          only_determinism = d;
        }
    if (!only) {
      const bool is_property =
          options.properties && std::find(options.properties->checks.begin(), options.properties->checks.end(),
                                          options.check) != options.properties->checks.end();
      if (!is_property) {
        std::string names;
        for (const OpCheck& c : checks)
          names += (names.empty() ? "" : ", ") + check_name(c, false) + ", " + check_name(c, true);
        throw UsageError("--check '" + options.check + "' is no check of conform --kernels (its kernel checks: " +
                         names + "; or 'property <name>' for a property of verify)");
      }
      return options.properties->run(target, options);
    }
    if (!plugin.provides(only->op))
      throw UsageError("--check '" + options.check + "': plugin '" + std::string(plugin.name()) + "' provides no " +
                       std::string(kernel_op_name(only->op)));
  } else if (!options.case_text.empty()) {
    throw UsageError("--case needs --check: the check whose case it is");
  }

  std::vector<ConformRow> rows;
  const auto add = [&](ConformRow row) {
    if (options.on_row) options.on_row(row);
    rows.push_back(std::move(row));
  };
  if (plugin.memory() == DPCHECK_CUDA) {
    // The per-op checks fill and read host buffers; a device plugin's ops meet dpcheck's checks through
    // the cuda engine, in verify's properties.
    for (const OpCheck& check : checks) {
      if (only && only != &check) continue;
      ConformRow row;
      row.section = "kernels";
      row.check = check_name(check, only_determinism);
      row.verdict = ConformVerdict::skip;
      row.detail =
          "a device plugin: its ops are checked in the cuda engine by verify's properties below, not one "
          "by one (the per-op checks stage host buffers only)";
      add(std::move(row));
    }
    if (options.properties && !only)
      for (ConformRow& row : options.properties->run(target, options)) rows.push_back(std::move(row));
    return rows;
  }
  const Kernels kernels(plugin, -1, options.timeout);
  const reference::BoundOptions bo = bound_options(target);
  if (only) {
    add(check_row(*only, only_determinism, kernels, options, bo));
    return rows;
  }
  for (bool determinism : {false, true})
    for (const OpCheck& check : checks) {
      if (!plugin.provides(check.op)) {
        if (determinism) continue;
        ConformRow row;
        row.section = "kernels";
        row.check = check_name(check, false);
        row.verdict = ConformVerdict::skip;
        row.detail = "not provided (NULL): dpcheck's own kernel runs";
        add(std::move(row));
        continue;
      }
      add(check_row(check, determinism, kernels, options, bo));
    }
  if (options.properties)
    for (ConformRow& row : options.properties->run(target, options)) rows.push_back(std::move(row));
  return rows;
}

}  // namespace dpcheck
