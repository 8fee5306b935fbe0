// Loading a user's plugin (include/dpcheck/plugin.h): a shared object opened with dlopen, its one
// exported function called, and the table it returns checked before dpcheck calls anything in it.
// Every refusal is a UsageError (exit 2) of one line that names the option and the file.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dpcheck {

// Whether an --comm or --kernels value names a file rather than a built-in backend: it holds a '/' or
// ends in ".so".
bool looks_like_plugin_path(std::string_view value);

// Opens `path` and returns the address of `symbol` in it. The object stays loaded for the life of the
// process (a plugin's threads or atexit handlers may outlive any one run). UsageError: "--comm x.so:
// no such file", "... is not a shared object this machine can load: <dlerror>", "... exports no
// dpcheck_comm_plugin (it exports dpcheck_kernel_plugin: pass it with --kernels)".
void* plugin_symbol(const std::string& path, const char* symbol, std::string_view option);

// The variables the plugin at `path` says choose its algorithm: what its optional dpcheck_plugin_env
// lists (include/dpcheck/plugin.h, "Environment"), in its order, or none when it exports no such
// function. The plugin must have been opened (plugin_symbol). UsageError naming `option` and the path
// when the list is not one of names: "--comm x.so: dpcheck_plugin_env lists \"A=B\", which is not a
// variable's name (letters, digits and '_', not starting with a digit)".
std::vector<std::string> plugin_env_names(const std::string& path, std::string_view option);

// The plugin ABIs this dpcheck loads (include/dpcheck/plugin.h): from the first to the header's. 2
// added the 16-bit floating dtypes, which a communicator of ABI 1 is never passed; 3 appended the
// version and a communicator's capability masks, which dpcheck reads only from a table of ABI 3 or
// later (src/target/plugin_comm.hpp).
inline constexpr unsigned kOldestPluginAbi = 1;

// "ABI 1 to 3": the ABIs this dpcheck knows, as its messages say them.
std::string known_plugin_abis();

// The checks every table shares: a table at all, an abi dpcheck knows (the message names the table's
// and the ones known), a name. `what` is "--comm <path>".
void check_plugin_table(const void* table, unsigned abi, const char* name, const std::string& what);

// UsageError "<what>: its table has no <entry> (NULL), which a <kind> plugin must provide" when `entry`
// is null.
void require_entry(const void* entry, std::string_view name, const std::string& what, std::string_view kind);

}  // namespace dpcheck
