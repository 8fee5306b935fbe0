// The watchdog and crash naming of plugin calls (src/plugin/plugin_call.hpp).
#include "src/plugin/plugin_call.hpp"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "src/error.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DPCHECK_UNDER_SANITIZER 1
#else
#define DPCHECK_UNDER_SANITIZER 0
#endif

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;

void write_stderr(const char* text) {
  std::size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<std::size_t>(n);
  }
}

// The calls in flight, by deadline. One thread watches them all; it and this object live until the
// process ends (a plugin's thread may be blocked in a call when main returns).
class Watchdog {
 public:
  std::uint64_t arm(Clock::time_point deadline, std::string message) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      std::thread([this] { watch(); }).detach();
      started_ = true;
    }
    const std::uint64_t id = next_++;
    calls_.emplace(id, Watch{deadline, std::move(message)});
    // The watching thread is woken only when this deadline comes before the one it waits for: calls
    // armed with the same timeout one after the other would otherwise wake it once each, for nothing.
    if (deadline < waiting_until_) changed_.notify_one();
    return id;
  }

  void disarm(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    calls_.erase(id);
  }

 private:
  struct Watch {
    Clock::time_point deadline;
    std::string message;
  };

  [[noreturn]] static void expire(const std::string& message) {
    std::fflush(stdout);
    write_stderr(message.c_str());
    ::_exit(3);
  }

  void watch() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (calls_.empty()) {
        waiting_until_ = Clock::time_point::max();
        changed_.wait(lock);
        continue;
      }
      auto first = calls_.begin();
      for (auto it = calls_.begin(); it != calls_.end(); ++it)
        if (it->second.deadline < first->second.deadline) first = it;
      if (Clock::now() >= first->second.deadline) expire(first->second.message);
      // A copy: the wait lets go of the lock, and the call may end (and its entry go) meanwhile.
      const Clock::time_point deadline = first->second.deadline;
      waiting_until_ = deadline;
      changed_.wait_until(lock, deadline);
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Watch> calls_;
  std::uint64_t next_ = 1;
  bool started_ = false;
  // The deadline the watching thread sleeps until (max: until a call is armed); before it starts, the
  // first arm must wake it, and nothing waits yet, so max serves there too.
  Clock::time_point waiting_until_ = Clock::time_point::max();
};

Watchdog& watchdog() {
  static Watchdog* const w = new Watchdog;  // never destroyed: its thread outlives main
  return *w;
}

thread_local const PluginCall* current_call = nullptr;

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

const char* signal_text(int sig) {
  switch (sig) {
    case SIGSEGV: return " crashed (SIGSEGV, a bad memory access)\n";
    case SIGBUS: return " crashed (SIGBUS, a bad memory access)\n";
    case SIGFPE: return " crashed (SIGFPE, an arithmetic fault)\n";
    case SIGILL: return " crashed (SIGILL, an illegal instruction)\n";
    case SIGABRT: return " aborted (SIGABRT)\n";
    default: return " crashed\n";
  }
}

std::atomic<int> crashed{0};

// Only async-signal-safe calls: write, pause and _exit. The call's text was built before the call
// began. When ranks crash together, the first says so and ends the process; the others wait for it.
extern "C" void on_crash(int sig) {
  if (crashed.exchange(1) != 0)
    for (;;) ::pause();
  const PluginCall* call = current_call;
  write_stderr("dpcheck: error: ");
  write_stderr(call ? call->what().c_str() : "dpcheck, outside any plugin call,");
  write_stderr(signal_text(sig));
  ::_exit(3);
}

}  // namespace

PluginCall::PluginCall(std::string_view plugin, std::string_view call, int rank, std::chrono::milliseconds timeout)
    : what_("plugin '" + escape_control(plugin) + "' " + std::string(call) +
            (rank >= 0 ? " on rank " + std::to_string(rank) : std::string())),
      outer_(current_call) {
  if (timeout.count() > 0)
    id_ = watchdog().arm(Clock::now() + timeout, "dpcheck: error: " + what_ + " has not returned within " +
                                                     seconds_text(timeout) + " s (--timeout): ending the run\n");
  current_call = this;
}

PluginCall::~PluginCall() {
  current_call = outer_;
  if (id_ != 0) watchdog().disarm(id_);
}

void install_plugin_crash_handlers() {
  if (DPCHECK_UNDER_SANITIZER) return;
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_crash;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &action, nullptr);
  });
}

}  // namespace dpcheck
