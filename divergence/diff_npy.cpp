// dpcheck diff's .npy directories (divergence/diff.hpp): the tensors of two directories paired by file
// name and compared element by element, in units in the last place and in relative difference, against a
// tolerance, then reported as a table or as JSON. A file of its own: it shares only number_text with the
// traces.
#include "divergence/diff.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <ostream>
#include <system_error>
#include <type_traits>
#include <utility>

#include "divergence/diff_internal.hpp"
#include "src/error.hpp"
#include "src/io/npy.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- .npy directories -----------------------------------------------------------------------------

std::string Tolerance::describe() const {
  switch (kind) {
    case Kind::bitwise: return "bitwise";
    case Kind::ulp: return "--ulp " + std::to_string(ulp);
    case Kind::rtol: return "--rtol " + diff_detail::number_text(rtol);
  }
  return "?";
}

std::string TensorDiff::status_text() const {
  switch (status) {
    case Status::compared: return "";
    case Status::only_in_a: return "only in A";
    case Status::only_in_b: return "only in B";
    case Status::dtype_differs:
      return "dtype " + std::string(dtype_name(dtype_a)) + " vs " + std::string(dtype_name(dtype_b));
    case Status::shape_differs: return "shape " + shape_text(shape_a) + " vs " + shape_text(shape_b);
  }
  return "?";
}

bool all_passed(const std::vector<TensorDiff>& diffs) {
  return std::all_of(diffs.begin(), diffs.end(), [](const TensorDiff& t) { return t.passed; });
}

namespace {

// Names in the order a person reads them: runs of digits compare as numbers (layers.2 before layers.10).
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && digit(a[ei])) ++ei;
      while (ej < b.size() && digit(b[ej])) ++ej;
      std::string_view na(a.data() + i, ei - i), nb(b.data() + j, ej - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

struct NaturalLess {
  bool operator()(const std::string& a, const std::string& b) const { return natural_less(a, b); }
};

using NpyFiles = std::map<std::string, fs::path, NaturalLess>;

NpyFiles list_npy(const fs::path& dir, std::string_view label) {
  const std::string who = std::string(label) + " " + dir.string();
  NpyFiles files;
  std::vector<std::string> checkpoints;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw UsageError(who + ": cannot list: " + ec.message());
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.ends_with(".npy")) files.emplace(name.substr(0, name.size() - 4), e.path());
    else if (name.starts_with("step-") && e.is_directory(ec)) checkpoints.push_back(name);
  }
  if (files.empty()) {
    std::string hint;
    if (!checkpoints.empty()) {
      std::sort(checkpoints.begin(), checkpoints.end());
      hint = " (it holds checkpoints " + checkpoints.front() +
             (checkpoints.size() > 1 ? " ... " + checkpoints.back() : "") + ": give one of them)";
    }
    throw UsageError(who + " holds no .npy files" + hint);
  }
  return files;
}

template <class T> std::string value_text(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return float_bits_text(v);
  } else if constexpr (std::is_same_v<T, double>) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g (0x%016llx)", v,
                  static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(v)));
    return buf;
  } else {
    return std::to_string(v);
  }
}

// |a - b| / max(|a|, |b|): 0 for equal values (+0 and -0 included), infinite where an infinity meets
// anything else, and without overflow where a - b itself would overflow.
double relative_difference(double a, double b) {
  if (a == b) return 0;
  if (std::isinf(a) || std::isinf(b)) return std::numeric_limits<double>::infinity();
  const double m = std::max(std::abs(a), std::abs(b));
  const double diff = std::abs(a - b);
  if (std::isinf(diff)) return std::abs(a / 2 - b / 2) / (m / 2);
  return diff / m;
}

template <class T> void compare_elements(const NpyArray& a, const NpyArray& b, TensorDiff& d) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const auto n = static_cast<std::size_t>(a.count());
  d.count = static_cast<std::int64_t>(n);
  for (std::size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a.data.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b.data.data() + i * sizeof(T), sizeof(T));
    if (std::bit_cast<Bits>(x) == std::bit_cast<Bits>(y)) continue;
    ++d.differing;
    if (d.first < 0) {
      d.first = static_cast<std::int64_t>(i);
      d.first_index = index_text(a.shape, i);
      d.first_a = value_text(x);
      d.first_b = value_text(y);
    }
    if constexpr (std::is_floating_point_v<T>) {
      // NaNs of the same bits were equal above; a NaN against anything else is as far as can be.
      const bool nan = std::isnan(x) || std::isnan(y);
      d.max_ulp = std::max(d.max_ulp, nan ? infinite_ulp : ulp_distance(x, y));
      d.max_rel = std::max(d.max_rel, nan ? std::numeric_limits<double>::infinity()
                                          : relative_difference(static_cast<double>(x), static_cast<double>(y)));
    }
  }
}

TensorDiff compare_files(const std::string& name, const fs::path& pa, const fs::path& pb, const Tolerance& tol) {
  TensorDiff d;
  d.name = name;
  const NpyArray a = read_npy(pa), b = read_npy(pb);
  d.dtype_a = a.dtype;
  d.dtype_b = b.dtype;
  d.shape_a = a.shape;
  d.shape_b = b.shape;
  if (a.dtype != b.dtype) {
    d.status = TensorDiff::Status::dtype_differs;
    return d;
  }
  if (a.shape != b.shape) {
    d.status = TensorDiff::Status::shape_differs;
    return d;
  }
  switch (a.dtype) {
    case DType::f32: compare_elements<float>(a, b, d); break;
    case DType::f64: compare_elements<double>(a, b, d); break;
    case DType::i64: compare_elements<std::int64_t>(a, b, d); break;
    default: throw Error(pa.string() + ": dtype " + std::string(dtype_name(a.dtype)) + " has no comparison");
  }
  if (d.differing == 0 || a.dtype == DType::i64) {
    d.passed = d.differing == 0;
  } else {
    switch (tol.kind) {
      case Tolerance::Kind::bitwise: d.passed = false; break;
      case Tolerance::Kind::ulp: d.passed = d.max_ulp != infinite_ulp && d.max_ulp <= tol.ulp; break;
      case Tolerance::Kind::rtol: d.passed = d.max_rel <= tol.rtol; break;
    }
  }
  return d;
}

}  // namespace

std::vector<TensorDiff> diff_tensor_dirs(const fs::path& a, const fs::path& b, const Tolerance& tolerance) {
  const NpyFiles fa = list_npy(a, "A"), fb = list_npy(b, "B");
  NpyFiles names = fa;
  names.insert(fb.begin(), fb.end());
  std::vector<TensorDiff> out;
  for (const auto& [name, unused] : names) {
    const auto ia = fa.find(name), ib = fb.find(name);
    if (ia != fa.end() && ib != fb.end()) {
      out.push_back(compare_files(name, ia->second, ib->second, tolerance));
      continue;
    }
    TensorDiff d;
    d.name = name;
    d.status = ia != fa.end() ? TensorDiff::Status::only_in_a : TensorDiff::Status::only_in_b;
    const NpyArray one = read_npy(ia != fa.end() ? ia->second : ib->second);  // refused here if it is no .npy file
    (ia != fa.end() ? d.dtype_a : d.dtype_b) = one.dtype;
    (ia != fa.end() ? d.shape_a : d.shape_b) = one.shape;
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

std::string ulp_text(std::uint64_t u) { return u == infinite_ulp ? "inf" : std::to_string(u); }

// Three digits say how far apart; the values themselves are printed in full.
std::string rel_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", r);
  return buf;
}

bool is_float(const TensorDiff& t) { return t.dtype_a == DType::f32 || t.dtype_a == DType::f64; }

}  // namespace

void print_tensor_diffs(std::ostream& out, const fs::path& a, const fs::path& b, const std::vector<TensorDiff>& diffs,
                        const Tolerance& tolerance) {
  out << "A: " << a.string() << "\nB: " << b.string() << "\ntolerance: " << tolerance.describe() << "\n";
  std::vector<std::vector<std::string>> rows{
      {"tensor", "shape", "dtype", "max_ulp", "max_rel", "differing", "result", "first difference"}};
  for (const TensorDiff& t : diffs) {
    const bool compared = t.status == TensorDiff::Status::compared;
    const bool floats = compared && is_float(t);
    rows.push_back({t.name,
                    t.status == TensorDiff::Status::shape_differs
                        ? "-"
                        : shape_text(t.status == TensorDiff::Status::only_in_b ? t.shape_b : t.shape_a),
                    t.status == TensorDiff::Status::dtype_differs
                        ? "-"
                        : std::string(dtype_name(t.status == TensorDiff::Status::only_in_b ? t.dtype_b : t.dtype_a)),
                    floats ? ulp_text(t.max_ulp) : "-", floats ? rel_text(t.max_rel) : "-",
                    compared ? std::to_string(t.differing) + " of " + std::to_string(t.count) : "-",
                    t.passed ? "ok" : "FAIL",
                    !compared     ? t.status_text()
                    : t.first < 0 ? "-"
                                  : t.first_index + ": " + t.first_a + " vs " + t.first_b});
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
  std::vector<const TensorDiff*> failed;
  for (const TensorDiff& t : diffs)
    if (!t.passed) failed.push_back(&t);
  if (failed.empty()) {
    out << "ok: " << diffs.size() << (diffs.size() == 1 ? " tensor" : " tensors")
        << (tolerance.kind == Tolerance::Kind::bitwise ? " equal bitwise" : " within " + tolerance.describe()) << "\n";
    return;
  }
  out << "FAILED: " << failed.size() << " of " << diffs.size() << " tensors differ (tolerance: " << tolerance.describe()
      << "):";
  for (std::size_t i = 0; i < failed.size(); ++i) {
    out << (i ? ", " : " ") << failed[i]->name;
    if (failed[i]->status != TensorDiff::Status::compared) out << " (" << failed[i]->status_text() << ")";
  }
  out << "\n";
}

json to_json(const fs::path& a, const fs::path& b, const std::vector<TensorDiff>& diffs, const Tolerance& tolerance) {
  static constexpr const char* kStatus[] = {"compared", "only_in_a", "only_in_b", "dtype_differs", "shape_differs"};
  json tensors = json::array();
  for (const TensorDiff& t : diffs) {
    const bool has_a = t.status != TensorDiff::Status::only_in_b, has_b = t.status != TensorDiff::Status::only_in_a;
    json j{{"name", t.name},
           {"status", kStatus[static_cast<int>(t.status)]},
           {"passed", t.passed},
           {"dtype_a", has_a ? json(dtype_name(t.dtype_a)) : json(nullptr)},
           {"dtype_b", has_b ? json(dtype_name(t.dtype_b)) : json(nullptr)},
           {"shape_a", has_a ? json(t.shape_a) : json(nullptr)},
           {"shape_b", has_b ? json(t.shape_b) : json(nullptr)}};
    if (t.status == TensorDiff::Status::compared) {
      j["count"] = t.count;
      j["differing"] = t.differing;
      if (is_float(t)) {
        // JSON has no infinity: a NaN against a number shows as null.
        j["max_ulp"] = t.max_ulp == infinite_ulp ? json(nullptr) : json(t.max_ulp);
        j["max_rel"] = std::isinf(t.max_rel) ? json(nullptr) : json(t.max_rel);
      }
      j["first_difference"] =
          t.first < 0 ? json(nullptr)
                      : json{{"flat", t.first}, {"index", t.first_index}, {"a", t.first_a}, {"b", t.first_b}};
    }
    tensors.push_back(std::move(j));
  }
  json tol{{"kind", tolerance.kind == Tolerance::Kind::bitwise ? "bitwise"
                    : tolerance.kind == Tolerance::Kind::ulp   ? "ulp"
                                                               : "rtol"}};
  if (tolerance.kind == Tolerance::Kind::ulp) tol["ulp"] = tolerance.ulp;
  if (tolerance.kind == Tolerance::Kind::rtol) tol["rtol"] = tolerance.rtol;
  return {{"kind", "npy"},     {"a", a.string()}, {"b", b.string()}, {"tolerance", tol}, {"passed", all_passed(diffs)},
          {"tensors", tensors}};
}

}  // namespace dpcheck
