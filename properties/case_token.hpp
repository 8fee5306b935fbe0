// Case tokens: the string printed with a failing case (and with each property's closest call) that
// `dpcheck verify --reproduce` turns back into exactly that case. A token reads
//   <property>:<payload>:<check>
// where payload is RapidCheck's serialized Reproduce (the case's random state, its size and the shrink
// path from the first failing case to the minimal one) in URL-safe base64, and check is 8 hex digits
// of a hash of everything before it, so that a damaged or edited token is refused with a reason instead
// of silently replaying some other case.
#pragma once

#include <string>
#include <string_view>

#include <rapidcheck.h>

namespace dpcheck {

struct CaseToken {
  std::string property;
  rc::detail::Reproduce reproduce;
};

std::string encode_case_token(const CaseToken& token);
// The check digits of a token's signed part, "<property>:<payload>".
std::string case_token_check_digits(std::string_view signed_part);
// UsageError saying what is wrong: empty, malformed, damaged (checksum), or an unreadable payload.
// The property name is returned as written; the caller checks that it names a property.
CaseToken decode_case_token(std::string_view text);

}  // namespace dpcheck
