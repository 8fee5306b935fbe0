// What the tests of the GPU target through the CUDA plugin share: why the target cannot run here.
#pragma once

#include <string>

#include "src/error.hpp"
#include "src/target/target.hpp"

namespace dpcheck {

// validate_target's UsageError ("no CUDA device: ...", or why the CUDA plugin did not load), or ""
// when the target can run: what such a test skips with.
inline std::string target_unavailable(const Target& t) {
  try {
    validate_target(t);
    return "";
  } catch (const UsageError& e) {
    return e.what();
  }
}

}  // namespace dpcheck
