// Opening plugins and checking their tables (src/plugin/plugin_loader.hpp).
#include "src/plugin/plugin_loader.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>

#include <dpcheck/plugin.h>
#include "src/error.hpp"
#include "src/plugin/plugin_call.hpp"

namespace dpcheck {

bool looks_like_plugin_path(std::string_view value) {
  return value.find('/') != std::string_view::npos || value.ends_with(".so");
}

void* plugin_symbol(const std::string& path, const char* symbol, std::string_view option) {
  const std::string what = std::string(option) + " " + path;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) throw UsageError(what + ": no such file");
  if (!std::filesystem::is_regular_file(status)) throw UsageError(what + ": not a regular file");
  // dlopen looks a name without '/' up on the library path; the user named a file.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  // dlopen runs the library's initializers (C++ constructors of its globals), which may crash before
  // the plugin has a name: the crash handler is installed first, and the call it names is this load,
  // by the option and path. The process still ends (exit 3) -- code that crashed inside this process
  // cannot be unloaded safely, and loading it in a child first would run its initializers twice.
  install_plugin_crash_handlers();
  void* handle = nullptr;
  {
    const PluginCall loading(path, "loading (" + std::string(option) + ", its initializers run by dlopen)", -1,
                             std::chrono::milliseconds(0));
    handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!handle) {
    const char* why = dlerror();
    throw UsageError(what + ": not a shared object this machine can load: " + (why ? why : "dlopen failed"));
  }
  dlerror();
  void* address = dlsym(handle, symbol);
  if (!address) {
    std::string hint;
    for (const char* other : {"dpcheck_comm_plugin", "dpcheck_kernel_plugin"})
      if (std::string_view(other) != symbol && dlsym(handle, other))
        hint = std::string(" (it exports ") + other + ": pass it with " +
               (std::string_view(other) == "dpcheck_comm_plugin" ? "--comm" : "--kernels") + ")";
    dlclose(handle);
    throw UsageError(what + ": exports no " + symbol + hint);
  }
  install_plugin_crash_handlers();
  return address;
}

std::string known_plugin_abis() {
  constexpr unsigned newest = DPCHECK_PLUGIN_ABI;
  if (newest == kOldestPluginAbi) return "ABI " + std::to_string(newest);
  return "ABI " + std::to_string(kOldestPluginAbi) + (newest == kOldestPluginAbi + 1 ? " and " : " to ") +
         std::to_string(newest);
}

void check_plugin_table(const void* table, unsigned abi, const char* name, const std::string& what) {
  if (!table) throw UsageError(what + ": its plugin function returned no table (NULL)");
  if (abi < kOldestPluginAbi || abi > DPCHECK_PLUGIN_ABI)
    throw UsageError(what + ": plugin ABI " + std::to_string(abi) + ", but this dpcheck knows " + known_plugin_abis() +
                     " (rebuild the plugin against this dpcheck's plugin.h)");
  if (!name || !*name) throw UsageError(what + ": its table has no name");
}

void require_entry(const void* entry, std::string_view name, const std::string& what, std::string_view kind) {
  if (!entry)
    throw UsageError(what + ": its table has no " + std::string(name) + " (NULL), which a " + std::string(kind) +
                     " plugin must provide");
}

}  // namespace dpcheck
