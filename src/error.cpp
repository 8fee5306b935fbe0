#include "src/error.hpp"

#include <cstdio>

namespace dpcheck {

std::string escape_control(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", u);
        out += buf;
      }
    }
  }
  return out;
}

void throw_call_error(std::string_view call, long code, std::string_view what, const char* file, int line) {
  std::string msg;
  msg.append(call).append(" failed: ").append(what);
  if (code != 0) msg.append(" (code ").append(std::to_string(code)).append(")");
  msg.append(" at ").append(file).append(":").append(std::to_string(line));
  throw Error(msg);
}

}  // namespace dpcheck
