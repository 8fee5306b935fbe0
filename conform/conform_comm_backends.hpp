// The promises of a communicator that dpcheck's own backends make and a plugin does not (src/comm.hpp):
// a float sum that is the serial fixed-order sum bit for bit, a 16-bit sum rounded once at the end, an
// avg that is exactly the sum divided by N, every dtype dpcheck itself passes (int32, uint64, uint8),
// the calls dpcheck builds on the collectives (all, allgather_value), and the errors its backends
// raise for a call they refuse or ranks that disagree. They are checks of conform_comm like any other
// (conform_comm_suite, run_conform_comm_check), which `dpcheck conform` does not run against a plugin:
// a plugin never sees those dtypes, is free to sum in another order, and dpcheck, not the plugin,
// compares the ranks' calls.
#pragma once

#include <string>
#include <vector>

#include "src/comm.hpp"

namespace dpcheck {

struct BackendCommCheck {
  const char* name;     // as conform names its checks: "signed integer sum wraps"
  const char* promise;  // what a failure broke
  // Runs on every rank (collectively: no rank returns early between collectives, even after a
  // failure) and returns "" or what this rank saw go wrong.
  std::string (*run)(Communicator&);
};

// In the order they run.
const std::vector<BackendCommCheck>& backend_comm_checks();

}  // namespace dpcheck
