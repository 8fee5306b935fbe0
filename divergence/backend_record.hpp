// What a repro bundle records of the backend its run ran on, beyond the target's names: each plugin's
// file and what its table says of itself, and the environment variables that choose the algorithm --
// those a plugin lists (include/dpcheck/plugin.h, "Environment") and, on the MPI backends, the MPI
// library's collective variables that are set. A plugin chosen by a variable (comm_gloo's
// DPCHECK_GLOO_ALGORITHM) replays another algorithm when the variable differs, under the same --comm:
// `dpcheck replay` sets nothing itself, but compares the record with the backend it is about to run
// and warns, one line for each difference, and the bundle's replay line puts the variables in front.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "src/target/target.hpp"

namespace dpcheck {

// An environment variable's value; nullopt: unset.
using EnvValues = std::map<std::string, std::optional<std::string>>;

// What the target says of the plugin (src/target/target.hpp), and what the bundle adds.
struct PluginRecord : PluginIdentity {
  std::string resolved;  // the file it named, every link followed
  std::string xxh3;      // of the file's bytes, 16 hex digits
  EnvValues env;         // the variables it lists, with their values
};

// The prefixes of the MPI library's variables that choose its collectives' algorithms (Open MPI's
// coll MCA parameters; MPICH's control variables of the collectives, under both their spellings), recorded
// when set on an MPI backend (mpi, mpi-native). Not the rest of MPICH's: its launcher sets some in every
// rank (MPIR_CVAR_CH3_INTERFACE_HOSTNAME), which choose no algorithm.
inline const std::vector<std::string>& mpi_env_prefixes() {
  static const std::vector<std::string> prefixes = [] {
    std::vector<std::string> out = {"OMPI_MCA_coll"};
    for (const char* spelling : {"MPIR_CVAR_", "MPICH_"})
      for (const char* what : {"ALLREDUCE", "IALLREDUCE", "BCAST", "IBCAST", "ALLGATHER", "IALLGATHER", "BARRIER",
                               "IBARRIER", "REDUCE", "IREDUCE", "DEVICE_COLLECTIVES", "COLLECTIVE_FALLBACK"})
        out.push_back(std::string(spelling) + what);
    return out;
  }();
  return prefixes;
}

struct BackendRecord {
  std::vector<PluginRecord> plugins;      // --comm's, then --kernels', where they are plugins
  std::vector<std::string> env_prefixes;  // an MPI backend's mpi_env_prefixes(); empty otherwise
  EnvValues library_env;                  // the variables set with those prefixes (all set)

  // {"plugins": [{"option", "path", "resolved", "xxh3", "name", "version" (null: none), "abi",
  //   "dtypes", "ops" (a communicator's), "env": {"NAME": "value" or null}}],
  //  "mpi_env": {"prefixes": [...], "set": {"NAME": "value"}} (MPI backends)}
  nlohmann::json to_json() const;
  // UsageError naming the field: "\"backend.plugins[0].abi\" is \"3\", not a plugin ABI (an integer in [0, 1048576])".
  static BackendRecord from_json(const nlohmann::json& j);
};

// The target's backend as this process sees it: its plugins (loaded if need be) and the environment.
// UsageError when a plugin cannot be loaded.
BackendRecord record_backend(const Target& target);

// What differs between the backend a bundle recorded and `now` (record_backend of the replay target)
// and the environment of this process, one line each: "the bundle ran with DPCHECK_GLOO_ALGORITHM=ring;
// it is now allreduce_ring", "the bundle ran with --comm plugin 'gloo ring'; it is now 'gloo
// allreduce_ring'". A plugin is compared where the replay passes the same option the same path; one that
// the replay re-targets away is not (the replay says it is re-targeted), nor the MPI variables when
// either backend is not an MPI one.
std::vector<std::string> backend_differences(const BackendRecord& recorded, const BackendRecord& now);

// What puts the recorded variables in front of a command, so that it runs as the bundle's run did:
// "DPCHECK_GLOO_ALGORITHM=ring ", or "env -u DPCHECK_GLOO_ALGORITHM " for one that was unset (values
// shell-quoted); "" when there are none.
std::string recorded_env_prefix(const BackendRecord& recorded);

}  // namespace dpcheck
