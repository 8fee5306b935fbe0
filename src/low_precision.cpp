#include "src/low_precision.hpp"

#include "src/choice.hpp"

namespace dpcheck {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(std::string_view name) {
  return parse_choice(name, {Precision::fp32, Precision::bf16, Precision::fp16}, precision_name, "--precision");
}

}  // namespace dpcheck
