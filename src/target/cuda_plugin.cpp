#include "src/target/cuda_plugin.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "src/error.hpp"
#include "src/io/process.hpp"

namespace dpcheck {

namespace {

struct Loaded {
  const cuda::Plugin* plugin = nullptr;
  std::string why;
};

Loaded load() {
  Loaded out;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DPCHECK_CUDA_PLUGIN"); env && *env) candidates.emplace_back(env);
  std::error_code ec;
  const std::filesystem::path self = self_executable(ec);
  if (!ec) candidates.push_back((self.parent_path() / "libdpcheck_cuda.so").string());
#ifdef DPCHECK_CUDA_PLUGIN_BUILD_PATH
  candidates.emplace_back(DPCHECK_CUDA_PLUGIN_BUILD_PATH);
#endif
  if (candidates.empty()) {
    out.why = "this build has no CUDA engine (configure with -DDPCHECK_CUDA=ON)";
    return out;
  }
  std::string tried;
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path, ec)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      out.why = std::string("cannot load the CUDA plugin: ") + ::dlerror();
      return out;
    }
    using Entry = const cuda::Plugin* (*)();
    const auto entry = reinterpret_cast<Entry>(::dlsym(handle, "dpcheck_cuda_plugin"));
    const cuda::Plugin* p = entry ? entry() : nullptr;
    if (!p || p->abi != cuda::kPluginAbi || p->size != sizeof(cuda::Plugin)) {
      out.why = path + " is a CUDA plugin from another dpcheck build";
      return out;
    }
    out.plugin = p;
    return out;
  }
#ifdef DPCHECK_CUDA_PLUGIN_BUILD_PATH
  out.why = "the CUDA plugin libdpcheck_cuda.so is missing (looked at " + tried + ")";
#else
  out.why = "this build has no CUDA engine (configure with -DDPCHECK_CUDA=ON)";
#endif
  return out;
}

}  // namespace

const cuda::Plugin* cuda_plugin(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.plugin && why) *why = loaded.why;
  return loaded.plugin;
}

const cuda::Plugin& require_cuda() {
  std::string why;
  const cuda::Plugin* p = cuda_plugin(&why);
  if (!p) throw UsageError(why);
  if (!p->device_available(&why)) throw UsageError("no CUDA device: " + why);
  return *p;
}

}  // namespace dpcheck
