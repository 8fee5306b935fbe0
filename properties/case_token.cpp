#include "properties/case_token.hpp"

#include <array>
#include <cstdio>
#include <iterator>
#include <vector>

#include "src/error.hpp"
#include "src/io/hash.hpp"

namespace dpcheck {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string base64_encode(const std::vector<std::uint8_t>& bytes) {
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::uint8_t b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(acc >> bits) & 63u];
    }
  }
  if (bits > 0) out += kAlphabet[(acc << (6 - bits)) & 63u];
  return out;
}

// false on a character outside the alphabet or stray bits at the end.
bool base64_decode(std::string_view text, std::vector<std::uint8_t>& out) {
  std::array<int, 256> value{};
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kAlphabet[i])] = i;
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value[static_cast<unsigned char>(c)];
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>((acc >> bits) & 0xffu));
    }
  }
  return (acc & ((1u << bits) - 1u)) == 0;
}

}  // namespace

std::string case_token_check_digits(std::string_view signed_part) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x",
                static_cast<unsigned>(hash_bytes(signed_part.data(), signed_part.size(), 0x5eed) & 0xffffffffu));
  return buf;
}

namespace {

// RapidCheck's reader trusts its input: it reads the random state's bit position without looking for the
// end of the bytes (and from there runs past them), shifts a varint of more than ten bytes past 64 bits,
// and takes any bit position, which a replay then shifts by. So the layout is walked here first: a
// 32-byte key, two varints (bits, counter), the bit position (0 to 64), a 4-byte size, then a varint
// count of varint shrink steps. Returns what is wrong, or an empty string.
std::string layout_problem(const std::vector<std::uint8_t>& b) {
  std::size_t at = 0;
  const auto skip = [&](std::size_t n) {
    if (b.size() - at < n) return false;
    at += n;
    return true;
  };
  const auto varint = [&](std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at == b.size()) return false;
      const std::uint8_t x = b[at++];
      v |= static_cast<std::uint64_t>(x & 0x7fu) << shift;
      if ((x & 0x80u) == 0) return true;
    }
    return false;  // an eleventh byte would hold bits past 64
  };
  std::uint64_t v = 0;
  if (!skip(32) || !varint(v) || !varint(v) || at == b.size()) return "its random state is cut short or malformed";
  if (b[at++] > 64) return "its random state is out of range";
  if (!skip(4)) return "it ends before its size";
  std::uint64_t steps = 0;
  if (!varint(steps)) return "its shrink path is cut short or malformed";
  for (std::uint64_t i = 0; i < steps; ++i)
    if (!varint(v)) return "its shrink path is cut short or malformed";
  if (at != b.size()) return "the case has trailing bytes";
  return {};
}

}  // namespace

std::string encode_case_token(const CaseToken& token) {
  std::vector<std::uint8_t> bytes;
  rc::detail::serialize(token.reproduce, std::back_inserter(bytes));
  const std::string signed_part = token.property + ":" + base64_encode(bytes);
  return signed_part + ":" + case_token_check_digits(signed_part);
}

CaseToken decode_case_token(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return UsageError("bad --reproduce string: " + why + " (copy the whole string printed after --reproduce)");
  };
  if (text.empty()) throw bad("it is empty");
  const std::size_t first = text.find(':'), last = text.rfind(':');
  if (first == std::string_view::npos || first == last) throw bad("expected <property>:<case>:<check>");
  const std::string_view signed_part = text.substr(0, last), check = text.substr(last + 1);
  if (check != case_token_check_digits(signed_part))
    throw bad("its check digits do not match, so it was damaged or edited");
  CaseToken token;
  token.property = std::string(text.substr(0, first));
  std::vector<std::uint8_t> bytes;
  if (!base64_decode(text.substr(first + 1, last - first - 1), bytes)) throw bad("the case is not valid base64");
  if (const std::string problem = layout_problem(bytes); !problem.empty()) throw bad(problem);
  try {
    const auto end = rc::detail::deserialize(bytes.begin(), bytes.end(), token.reproduce);
    if (end != bytes.end()) throw bad("the case has trailing bytes");
  } catch (const rc::detail::SerializationException& e) {
    throw bad("the case cannot be read: " + e.message());
  }
  if (token.reproduce.size < 0) throw bad("the case has a negative size");
  return token;
}

}  // namespace dpcheck
