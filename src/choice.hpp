// Parsing a name into one of an enum's values, with one wording for every option of the command:
// "unknown loss 'x' (choose mse or cross-entropy)".
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "src/error.hpp"

namespace dpcheck {

template <class E>
E parse_choice(std::string_view text, std::initializer_list<E> all, std::string_view (*name)(E),
               std::string_view what) {
  for (E e : all)
    if (text == name(e)) return e;
  std::string choices;
  std::size_t i = 0;
  for (E e : all) {
    choices += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + std::string(name(e));
    ++i;
  }
  throw UsageError("unknown " + std::string(what) + " '" + std::string(text) + "' (choose " + choices + ")");
}

}  // namespace dpcheck
