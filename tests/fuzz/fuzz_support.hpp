// What the libFuzzer targets in this directory share: a private scratch directory for parsers that read
// files, writing one input into it, and the check that stops the run when a parser breaks an invariant.
// A parser's documented refusal (a UsageError) is caught by each target; anything else escapes, so that
// libFuzzer reports it with the input that caused it.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace dpcheck::fuzz {

// An invariant the parser promises: on failure, say which and abort, which libFuzzer reports as a crash
// (with the input saved) like any other.
#define DPCHECK_FUZZ_CHECK(cond)                                                        \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A fresh directory <tmp>/dpcheck_fuzz_XXXXXX for this process, removed with its contents at exit (a
// crashing run leaves it behind, with the input that crashed in it). One per target: make it a
// function-local static.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dpcheck_fuzz_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Replaces the file at path with exactly these bytes. A failure here is the machine's, not the parser's.
inline void write_input(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace dpcheck::fuzz
