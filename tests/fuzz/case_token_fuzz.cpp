// libFuzzer target for the `dpcheck verify --reproduce` string, decode_case_token (properties/case_token.hpp):
// <property>:<case>:<check>. Each input is decoded twice: as given, which tests the check digits (they
// refuse nearly every mutation), and with its check digits recomputed, which lets the fuzzer reach the
// case decoder behind them. A token it accepts must encode again to one that decodes to the same
// property and case, and carry the check digits that re_sign computes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "properties/case_token.hpp"
#include "src/error.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

// text with its check digits replaced (with two or more ':') or added (with fewer).
std::string re_sign(std::string_view text) {
  const std::size_t first = text.find(':'), last = text.rfind(':');
  const std::string_view signed_part = first != last ? text.substr(0, last) : text;
  return std::string(signed_part) + ":" + dpcheck::case_token_check_digits(signed_part);
}

void check_token(std::string_view text) {
  dpcheck::CaseToken token;
  try {
    token = dpcheck::decode_case_token(text);
  } catch (const dpcheck::UsageError&) {
    return;  // the documented refusal: empty, malformed, damaged or unreadable
  }
  DPCHECK_FUZZ_CHECK(token.reproduce.size >= 0);
  DPCHECK_FUZZ_CHECK(token.property.find(':') == std::string::npos);
  const std::string encoded = dpcheck::encode_case_token(token);
  DPCHECK_FUZZ_CHECK(re_sign(encoded) == encoded);
  const dpcheck::CaseToken again = dpcheck::decode_case_token(encoded);
  DPCHECK_FUZZ_CHECK(again.property == token.property);
  DPCHECK_FUZZ_CHECK(again.reproduce == token.reproduce);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = dpcheck::fuzz::as_text(data, size);
  check_token(text);
  check_token(re_sign(text));
  return 0;
}
