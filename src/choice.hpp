// Parsing a name into one of an enum's values, with one wording for every option of the command:
// "unknown loss 'x' (choose mse or cross-entropy)".
#pragma once

#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "src/error.hpp"

namespace dpcheck {

// "a", "a or b", "a, b or c" (last = " or "): a list of a message.
template <class Range> std::string joined_list(const Range& items, std::string_view last) {
  std::string out;
  const std::size_t n = std::size(items);
  std::size_t i = 0;
  for (const auto& item : items) {
    out += (i == 0 ? std::string() : i + 1 == n ? std::string(last) : std::string(", ")) + std::string(item);
    ++i;
  }
  return out;
}
// The choices of a message: "a, b or c".
template <class Range> std::string or_list(const Range& items) { return joined_list(items, " or "); }
// What holds together: "a, b and c".
template <class Range> std::string and_list(const Range& items) { return joined_list(items, " and "); }

template <class E> E parse_choice(std::string_view text, std::initializer_list<E> all, std::string_view (*name)(E),
                                  std::string_view what) {
  for (E e : all)
    if (text == name(e)) return e;
  std::vector<std::string_view> names;
  for (E e : all) names.push_back(name(e));
  throw UsageError("unknown " + std::string(what) + " '" + std::string(text) + "' (choose " + or_list(names) + ")");
}

}  // namespace dpcheck
