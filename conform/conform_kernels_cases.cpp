// The cases of conform --kernels as text: each field's name, a case written as --case takes it, and
// --case read back and held to the limits every case keeps. Split from conform_kernels.cpp so that
// everything about a case's text reads in one place.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "conform/conform_kernels_internal.hpp"
#include "src/error.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck {
namespace conform_kernels_detail {

namespace {

double* real_field(Case& c, Field f) {
  switch (f) {
    case Field::scale: return &c.scale;
    case Field::lr: return &c.lr;
    case Field::momentum: return &c.momentum;
    case Field::beta1: return &c.beta1;
    case Field::beta2: return &c.beta2;
    case Field::eps: return &c.eps;
    default: return nullptr;
  }
}

// The limits a case must keep: sizes at least 1 (rows at least 0 where `empty_batch`) and small enough to
// allocate, flags 0 or 1.
void check_case(const Case& c, const std::string& what, bool empty_batch) {
  const auto size = [&](std::int64_t v, std::string_view name, std::int64_t least = 1) {
    if (v < least || v > (1 << 20))
      throw UsageError(what + ": " + std::string(name) + " must be in [" + std::to_string(least) + ", 1048576]");
  };
  size(c.rows, "rows", empty_batch ? 0 : 1);
  size(c.in, "in");
  size(c.out, "out");
  size(c.n, "n");
  size(c.step, "step");
  if (c.rows * c.in > (1 << 24) || c.rows * c.out > (1 << 24) || c.out * c.in > (1 << 24))
    throw UsageError(what + ": the matrices are too big (at most 2^24 elements)");
  if (c.accumulate != 0 && c.accumulate != 1) throw UsageError(what + ": accumulate must be 0 or 1");
  if (c.dx != 0 && c.dx != 1) throw UsageError(what + ": dx must be 0 or 1");
  if (c.offset < 0 || c.offset > 64) throw UsageError(what + ": offset must be in [0, 64]");
  OptimizerConfig o;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.validate();
  if (!std::isfinite(c.scale) || std::abs(c.scale) > 1e30) throw UsageError(what + ": scale must be finite");
}

}  // namespace

std::string_view field_name(Field f) {
  switch (f) {
    case Field::rows: return "rows";
    case Field::in: return "in";
    case Field::out: return "out";
    case Field::n: return "n";
    case Field::accumulate: return "accumulate";
    case Field::dx: return "dx";
    case Field::step: return "step";
    case Field::offset: return "offset";
    case Field::act: return "act";
    case Field::loss: return "loss";
    case Field::scale: return "scale";
    case Field::lr: return "lr";
    case Field::momentum: return "momentum";
    case Field::beta1: return "beta1";
    case Field::beta2: return "beta2";
    case Field::eps: return "eps";
    case Field::seed: return "seed";
  }
  return "?";
}

std::int64_t* int_field(Case& c, Field f) {
  switch (f) {
    case Field::rows: return &c.rows;
    case Field::in: return &c.in;
    case Field::out: return &c.out;
    case Field::n: return &c.n;
    case Field::accumulate: return &c.accumulate;
    case Field::dx: return &c.dx;
    case Field::step: return &c.step;
    case Field::offset: return &c.offset;
    default: return nullptr;
  }
}

const std::int64_t* int_field(const Case& c, Field f) { return int_field(const_cast<Case&>(c), f); }

// The shortest decimal that reads back as the same double.
std::string real_text(double v) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string case_text(Case c, std::span<const Field> fields) {
  std::string out;
  for (Field f : fields) {
    std::string value;
    if (const std::int64_t* i = int_field(c, f)) value = std::to_string(*i);
    else if (const double* r = real_field(c, f)) value = real_text(*r);
    else if (f == Field::act) value = c.act == Activation::relu ? "relu" : "tanh";
    else if (f == Field::loss) value = c.loss == Loss::mse ? "mse" : "cross_entropy";
    else value = std::to_string(c.seed);
    out += (out.empty() ? "" : " ") + std::string(field_name(f)) + "=" + value;
  }
  return out;
}

// Whether a check's rows may be 0 (an empty batch): a linear op's may, a loss over no rows has no mean.
bool allows_empty_batch(std::span<const Field> fields) {
  return std::find(fields.begin(), fields.end(), Field::in) != fields.end();
}

Case parse_case(const std::string& text, std::span<const Field> fields, const std::string& check) {
  const std::string what = "--case '" + text + "' (of " + check + ")";
  std::string names;
  for (Field f : fields) names += (names.empty() ? "" : " ") + std::string(field_name(f));
  Case c;
  std::istringstream words(text);
  std::string word;
  bool any = false;
  while (words >> word) {
    any = true;
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
    const auto f = std::find_if(fields.begin(), fields.end(), [&](Field x) { return field_name(x) == key; });
    if (eq == std::string::npos || value.empty() || f == fields.end())
      throw UsageError(what + ": '" + word + "' is not NAME=VALUE with NAME one of: " + names);
    const auto bad = [&] { return UsageError(what + ": '" + word + "' has a value " + key + " cannot take"); };
    if (std::int64_t* i = int_field(c, *f)) {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *i);
      if (ec != std::errc() || end != value.data() + value.size()) throw bad();
    } else if (double* r = real_field(c, *f)) {
      char* end = nullptr;
      *r = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !std::isfinite(*r)) throw bad();
    } else if (*f == Field::act) {
      if (value != "relu" && value != "tanh") throw bad();
      c.act = value == "relu" ? Activation::relu : Activation::tanh;
    } else if (*f == Field::loss) {
      if (value != "mse" && value != "cross_entropy") throw bad();
      c.loss = value == "mse" ? Loss::mse : Loss::cross_entropy;
    } else {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), c.seed);
      if (ec != std::errc() || end != value.data() + value.size()) throw bad();
    }
  }
  if (!any) throw UsageError(what + ": empty (give NAME=VALUE pairs: " + names + ")");
  check_case(c, what, allows_empty_batch(fields));
  return c;
}

}  // namespace conform_kernels_detail
}  // namespace dpcheck
