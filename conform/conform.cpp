// What conform shares between its communicator and kernel halves: the verdicts' names
// (conform/conform.hpp).
#include "conform/conform.hpp"

#include <algorithm>

#include "src/error.hpp"

namespace dpcheck {

std::string_view conform_verdict_name(ConformVerdict v) {
  switch (v) {
    case ConformVerdict::pass: return "pass";
    case ConformVerdict::fail: return "FAIL";
    case ConformVerdict::info: return "info";
    case ConformVerdict::skip: return "skip";
    case ConformVerdict::unsupported: return "unsupported";
    case ConformVerdict::switches: return "switches";
  }
  return "?";
}

void require_property_check(const std::string& check, const PropertyRows* properties) {
  if (!properties) throw UsageError("--check '" + check + "': this run leaves out verify's properties");
  if (std::find(properties->checks.begin(), properties->checks.end(), check) != properties->checks.end()) return;
  const std::string prefix = "property ";
  std::string names;
  for (const std::string& c : properties->checks) names += (names.empty() ? "" : ", ") + c.substr(prefix.size());
  throw UsageError("unknown property '" + check.substr(prefix.size()) + "' (known: " + names + ")");
}

}  // namespace dpcheck
