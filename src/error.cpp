#include "src/error.hpp"

namespace dpcheck {

void throw_call_error(std::string_view call, long code, std::string_view what, const char* file,
                      int line) {
  std::string msg;
  msg.append(call).append(" failed: ").append(what);
  if (code != 0) msg.append(" (code ").append(std::to_string(code)).append(")");
  msg.append(" at ").append(file).append(":").append(std::to_string(line));
  throw Error(msg);
}

}  // namespace dpcheck
