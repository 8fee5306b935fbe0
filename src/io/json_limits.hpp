// Limits on JSON that dpcheck reads from files and lines it did not write in this run (manifests,
// checkpoints, bundles, traces, reports): nlohmann::json parses nesting of any depth, and the values it
// builds are walked, compared and destroyed recursively, so a line of 100,000 '[' ends the process with
// a stack overflow. Every reader calls check_json_depth on the text before parsing it.
#pragma once

#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

#include "src/error.hpp"

namespace dpcheck {

// Deeper than anything dpcheck writes (a manifest or a trace line nests at most 6 levels), far short of
// what a thread's stack holds.
inline constexpr int max_json_depth = 64;

// The longest line of a trace (or other line-per-record file) dpcheck reads: a trace line of 64 ranks
// and a hundred tensors holds a few MiB; parsing takes about 16 times its length in memory.
inline constexpr std::size_t max_json_line_bytes = std::size_t{32} << 20;

// Whether the brackets of `text` (outside strings) nest deeper than max_json_depth. Malformed text is
// left to the parser to refuse.
inline bool json_too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_json_depth) return true;
    } else if (c == ']' || c == '}') --depth;
  }
  return false;
}

inline std::string json_depth_reason() {
  return "JSON nested deeper than " + std::to_string(max_json_depth) + " levels (dpcheck writes at most a few)";
}

// Throws UsageError "<source>: JSON nested deeper than 64 levels ..." when json_too_deep(text).
inline void check_json_depth(std::string_view text, std::string_view source) {
  if (json_too_deep(text)) throw UsageError(std::string(source) + ": " + json_depth_reason());
}

// Reads the next line (without its '\n') into `line`, stopping at `max` bytes: the whole of a longer
// line would have to be held in memory to be refused. Returns false at the end of the input, and sets
// `too_long` when the line is longer than `max` (what was read is then left in `line`).
inline bool read_bounded_line(std::istream& in, std::string& line, bool& too_long,
                              std::size_t max = max_json_line_bytes) {
  line.clear();
  too_long = false;
  std::streambuf* buf = in.rdbuf();
  for (;;) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return !line.empty();
    }
    if (c == '\n') return true;
    if (line.size() == max) {
      too_long = true;
      return true;
    }
    line.push_back(static_cast<char>(c));
  }
}

inline std::string line_length_reason() {
  return "a line longer than " + std::to_string(max_json_line_bytes >> 20) + " MiB (dpcheck writes far shorter ones)";
}

}  // namespace dpcheck
