// Internal to divergence/diff*.cpp, the pieces of dpcheck diff (divergence/diff.hpp): what more than one
// piece uses. Only the number formatting is shared; every other helper lives in the one piece that
// uses it. Not part of dpcheck's interface: include it from divergence/diff*.cpp only.
#pragma once

#include <string>

namespace dpcheck::diff_detail {

// A number as the reports show it ("%.9g"): a trace tensor's summary, a loss, an --rtol tolerance.
std::string number_text(double v);

}  // namespace dpcheck::diff_detail
