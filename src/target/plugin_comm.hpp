// A user's communicator plugin (include/dpcheck/plugin.h, `--comm ./libmine.so`) as one more row of
// the backend table (src/target/backends.hpp), named by the path as given, so that every command that takes
// --comm takes a plugin: its ranks run as threads of this process (one init per rank thread, the
// bootstrap over dpcheck's local transport) or as a launcher's processes (the bootstrap over MPI).
//
// Only the collectives go through the plugin. The control messages of dpcheck's checks (replica
// hashes, verdicts, counts) go through host(), dpcheck's own transport, so that a broken plugin cannot
// corrupt the evidence against it. Every call into the plugin is guarded (src/plugin/plugin_call.hpp):
// a non-zero return is an Error naming the plugin, the call, the rank and the plugin's last_error; a
// call that outlives the timeout ends the run. A collective of a dtype or op the plugin does not
// declare is a UsageError before the plugin is called. A run that ends normally finalizes every rank
// after a barrier of dpcheck's own, so that no rank closes while a peer is still inside a collective.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <dpcheck/plugin.h>

#include "src/comm.hpp"
#include "src/target/backends.hpp"

namespace dpcheck {

// The table of the plugin at `path`, loaded once per process and checked: the symbol, the abi, a name,
// and every entry point (all are required). UsageError naming `option` and the path otherwise.
const dpcheck_comm_plugin_t& load_comm_plugin(const std::string& path, std::string_view option = "--comm");

// The row for the plugin at `path`, registered on first use: engine cpu for a DPCHECK_HOST plugin,
// cuda for a DPCHECK_CUDA one (ranks as threads on the GPU, a thread each). UsageError for a plugin
// that cannot be loaded.
const Backend& register_comm_plugin(const std::string& path);

// Whether the plugin takes collectives of `dtype` (and all-reduces of `op`): what its table declares
// (include/dpcheck/plugin.h, "Capabilities"): abi 1 float32, float64 and int64 with every op; abi 2
// those and the 16-bit floats; abi 3 its masks, a mask of 0 meaning abi 1's. dpcheck's own control
// messages (uint8, int32, uint64) never go to a plugin.
bool comm_plugin_has_dtype(const dpcheck_comm_plugin_t& plugin, DType dtype);
bool comm_plugin_supports(const dpcheck_comm_plugin_t& plugin, DType dtype, ReduceOp op);

// "dtypes float32, float64, int64; all-reduce ops sum, avg, min, max": what the plugin declares.
std::string comm_plugin_capabilities(const dpcheck_comm_plugin_t& plugin);

// "'gloo ring' Gloo 0.5.0": the plugin's name, quoted, and its version where its table has one.
std::string comm_plugin_label(const dpcheck_comm_plugin_t& plugin);

// Why the plugin takes no collective of `dtype` (with `op`: no all-reduce of op on dtype), naming the
// plugin (`path` as given), what it declares and the remedy: the text of the UsageError that refuses
// one, and of conform's "unsupported" rows.
std::string comm_plugin_lacks(const dpcheck_comm_plugin_t& plugin, const std::string& path, DType dtype,
                              std::optional<ReduceOp> op = std::nullopt);

// A communicator of the plugin over the ranks of `base` (bootstrap, control messages and copies to
// and from the host go through base). Calls init; finalize on destruction. `backend` is the row name.
std::unique_ptr<Communicator> make_plugin_communicator(const dpcheck_comm_plugin_t& plugin, std::string backend,
                                                       Communicator& base);

// How a plugin's communicator applies plugin.h's rules: the dtypes and ops a table declares, and the
// end of a run (a barrier of dpcheck's own, then every rank's finalize). The defaults are the rules; the
// property that holds them (properties/plugin_abi.cpp) hands in a mutant's broken one.
struct PluginRules {
  std::uint32_t (*dtypes)(const dpcheck_comm_plugin_t& plugin) = nullptr;  // nullptr: plugin.h's
  std::uint32_t (*ops)(const dpcheck_comm_plugin_t& plugin) = nullptr;     // nullptr: plugin.h's
  bool finalize_before_barrier = false;
};

// One rank's part of a run on the plugin, as its backend row runs it: init over the ranks of `base`,
// `fn`, then the run's normal end (the barrier, then finalize; after a throw, finalize alone).
void run_on_plugin(const dpcheck_comm_plugin_t& plugin, const std::string& backend, Communicator& base,
                   const std::function<void(Communicator&)>& fn, const PluginRules& rules = {});

}  // namespace dpcheck
