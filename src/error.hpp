// Errors in dpcheck are exceptions carrying what failed and where; library code never calls exit().
// UsageError marks bad input from the user (the command exits with status 2); everything else that
// escapes a command is an Error (status 1 for a failed check is decided by the command, not here).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace dpcheck {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input: an unknown name, a size out of range, a file of the wrong shape. Exit status 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A plugin's call that failed (returned an error code): the plugin, not the property it was checked
// against, is at fault. Exit status 3, as any runtime fault.
class PluginFault : public Error {
 public:
  using Error::Error;
};

// A collective that did not complete within its timeout (a dead or stuck rank).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// `text` with its control characters escaped (\n, \t, \x1b, ...): a message that quotes user input
// or a plugin's text stays one line, and a terminal shows it rather than obeys it.
std::string escape_control(std::string_view text);

// Throws Error("<call> failed: <what> (code <code>) at <file>:<line>"). Used by the DPCHECK_*_CHECK
// macros for CUDA, NCCL and MPI so that every failure names the call and its place.
[[noreturn]] void throw_call_error(std::string_view call, long code, std::string_view what, const char* file, int line);

}  // namespace dpcheck

// Checks an invariant of dpcheck itself; a failure is a bug in dpcheck, reported with its place.
#define DPCHECK_ASSERT(cond)                                                                  \
  do {                                                                                        \
    if (!(cond)) ::dpcheck::throw_call_error("DPCHECK_ASSERT", 0, #cond, __FILE__, __LINE__); \
  } while (0)
