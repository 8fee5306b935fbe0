// Opening plugins and checking their tables (src/plugin/plugin_loader.hpp).
#include "src/plugin/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>

#include <dpcheck/plugin.h>
#include "src/error.hpp"
#include "src/plugin/plugin_call.hpp"

namespace dpcheck {

bool looks_like_plugin_path(std::string_view value) {
  return value.find('/') != std::string_view::npos || value.ends_with(".so");
}

namespace {

// The objects plugin_symbol opened, by the path as given: for the optional symbols looked up later.
std::mutex handles_mutex;
std::map<std::string, void*>& opened_handles() {
  static std::map<std::string, void*> handles;
  return handles;
}

constexpr std::size_t kMaxEnvNames = 64;
constexpr std::size_t kMaxEnvName = 256;

bool is_variable_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxEnvName || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

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
  const std::lock_guard lock(handles_mutex);
  opened_handles().emplace(path, handle);
  return address;
}

std::vector<std::string> plugin_env_names(const std::string& path, std::string_view option) {
  void* handle = nullptr;
  {
    const std::lock_guard lock(handles_mutex);
    if (auto it = opened_handles().find(path); it != opened_handles().end()) handle = it->second;
  }
  if (!handle) return {};
  using Entry = const char* const* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, "dpcheck_plugin_env"));
  if (!entry) return {};
  const std::string what = std::string(option) + " " + path + ": dpcheck_plugin_env ";
  const char* const* list = nullptr;
  {
    const PluginCall calling(path, "dpcheck_plugin_env", -1, std::chrono::milliseconds(0));
    list = entry();
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; list && list[i]; ++i) {
    if (i == kMaxEnvNames)
      throw UsageError(what + "lists more than " + std::to_string(kMaxEnvNames) +
                       " names (is its list ended by NULL?)");
    const std::string_view name(list[i], strnlen(list[i], kMaxEnvName + 1));
    if (!is_variable_name(name)) {
      std::string shown(name.substr(0, 64));
      for (char& c : shown)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';  // the message stays one line
      throw UsageError(what + "lists \"" + shown + (name.size() > 64 ? "..." : "") +
                       "\", which is not a variable's name (letters, digits and '_', not starting with a digit)");
    }
    if (std::find(names.begin(), names.end(), name) != names.end())
      throw UsageError(what + "lists " + std::string(name) + " twice");
    names.emplace_back(name);
  }
  return names;
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
