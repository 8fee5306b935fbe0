// What every check shares (verdict/verdict.hpp).
#include "verdict/verdict.hpp"

#include <cmath>
#include <cstdio>

#include "src/train/replica_check.hpp"

namespace dpcheck {

bool agree(const Target& target, bool verdict) {
  return target.process_world ? target.process_world->all(verdict) : verdict;
}

bool records(const Target& target, const Communicator& comm) { return target.process_world || comm.rank() == 0; }

void worst_against_formula(std::span<const float> got, const std::vector<double>& want,
                           const std::vector<double>& bound, const std::string& what,
                           const std::function<std::string(std::size_t)>& element, WorstElement& worst) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double ratio = !std::isfinite(got[i]) ? INFINITY : err == 0 ? 0.0 : bound[i] > 0 ? err / bound[i] : INFINITY;
    if (ratio <= worst.ratio && !(worst.where.empty() && i == 0)) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, " is %s, the formula gives %.17g (error %.3g, bound %.3g, error ratio %.4g)",
                  float_bits_text(got[i]).c_str(), want[i], err, bound[i], ratio);
    worst = {ratio, what + " " + element(i) + buf, i};
  }
}

}  // namespace dpcheck
