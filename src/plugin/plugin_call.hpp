// A call into a user's plugin cannot be interrupted, and may never return or may crash the process.
// PluginCall guards one: while it is in flight a watchdog thread holds its deadline, and when the
// deadline passes the run ends (exit 3) with one line naming the plugin, the call and the rank -- a
// hung collective must not hang CI. If the process crashes inside the call, a signal handler says which
// call crashed before the process ends (exit 3). Reports are written whole or not at all
// (write_file_atomic), so neither ending leaves one half-written.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace dpcheck {

class PluginCall {
 public:
  // `plugin` is the plugin's name, `call` the entry point ("allreduce"), `rank` the caller's rank (-1:
  // none). A zero timeout arms no deadline (the crash is still named).
  PluginCall(std::string_view plugin, std::string_view call, int rank, std::chrono::milliseconds timeout);
  ~PluginCall();
  PluginCall(const PluginCall&) = delete;
  PluginCall& operator=(const PluginCall&) = delete;

  // "plugin 'ring' allreduce on rank 2"
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::uint64_t id_ = 0;
  const PluginCall* outer_ = nullptr;  // the call this one is nested in on this thread (a bootstrap's)
};

// Installs the handlers that name a crashing plugin call (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT).
// Called when a plugin is loaded; does nothing under a sanitizer, whose own report says more.
void install_plugin_crash_handlers();

}  // namespace dpcheck
