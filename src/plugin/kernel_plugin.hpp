// A user's kernels (include/dpcheck/plugin.h, dpcheck_kernel_plugin_t) as dpcheck calls them: the
// plugin loaded and checked once per process (KernelPlugin), and one initialised handle per engine
// (Kernels) whose methods call the plugin's entries, each under a PluginCall guard, and turn a non-zero
// return into an Error that names the plugin, the call, the rank and the plugin's own message. An op
// the plugin leaves NULL is dpcheck's own: callers ask provides() first.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <dpcheck/plugin.h>
#include "src/model_kinds.hpp"

namespace dpcheck {

enum class KernelOp {
  linear_forward,
  linear_backward,
  activation_forward,
  activation_backward,
  loss_forward_backward,
  sgd_step,
  momentum_step,
  adam_step,
};
inline constexpr KernelOp kernel_ops[] = {KernelOp::linear_forward,        KernelOp::linear_backward,
                                          KernelOp::activation_forward,    KernelOp::activation_backward,
                                          KernelOp::loss_forward_backward, KernelOp::sgd_step,
                                          KernelOp::momentum_step,         KernelOp::adam_step};
std::string_view kernel_op_name(KernelOp op);  // the entry's name in the table: "linear_forward"

class KernelPlugin {
 public:
  const std::string& path() const { return path_; }
  std::string_view name() const { return table_->name; }
  // The table's version string (plugin ABI 3 and later); "" when it has none.
  std::string_view version() const {
    return table_->abi >= 3 && table_->version ? std::string_view(table_->version) : std::string_view();
  }
  dpcheck_memory_t memory() const { return table_->memory; }
  const dpcheck_kernel_plugin_t& table() const { return *table_; }
  bool provides(KernelOp op) const;
  // "--kernels <path>", as every message about the plugin begins.
  std::string what() const { return "--kernels " + path_; }

 private:
  friend const KernelPlugin& load_kernel_plugin(const std::string& path);
  friend const KernelPlugin& in_process_kernel_plugin(const std::string& label, const dpcheck_kernel_plugin_t* table);

  KernelPlugin(std::string path, const dpcheck_kernel_plugin_t* table) : path_(std::move(path)), table_(table) {}
  std::string path_;
  const dpcheck_kernel_plugin_t* table_;
};

// The plugin at `path`, opened and checked the first time a path is asked for and the same object after
// that (the process keeps it for its whole life). UsageError, naming --kernels and the path: no such
// file, not a shared object, no dpcheck_kernel_plugin symbol, no table, an unknown abi, no name, a
// memory that is neither DPCHECK_HOST nor DPCHECK_CUDA.
const KernelPlugin& load_kernel_plugin(const std::string& path);

// A table that lives in this process rather than in a shared object, checked as a loaded one is and
// kept under `label`, so that load_kernel_plugin(label) returns it for the rest of the process: how a
// property hands conform a kernel of its own (conform_rows_catch_broken_communicators' broken kernels).
// The same label twice must be the same table.
const KernelPlugin& in_process_kernel_plugin(const std::string& label, const dpcheck_kernel_plugin_t* table);

// One handle of a plugin: init on construction, finalize on destruction. Calls are made from the thread
// that owns the handle (a rank's). Each guarded by a watchdog of `timeout` (zero: none).
class Kernels {
 public:
  Kernels(const KernelPlugin& plugin, int rank, std::chrono::milliseconds timeout);
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  const KernelPlugin& plugin() const { return plugin_; }
  bool provides(KernelOp op) const { return plugin_.provides(op); }

  // The table's entries, with its argument order; `stream` is the engine's (nullptr on the host).
  void linear_forward(const float* x, const float* w, const float* b, float* y, std::int64_t rows, std::int64_t in,
                      std::int64_t out, void* stream = nullptr) const;
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                       std::int64_t rows, std::int64_t in, std::int64_t out, bool accumulate,
                       void* stream = nullptr) const;
  void activation_forward(Activation act, const float* x, float* y, std::int64_t n, void* stream = nullptr) const;
  void activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx, std::int64_t n,
                           void* stream = nullptr) const;
  // target: float32 rows x cols (mse) or int64 labels (cross-entropy). Returns the mean loss.
  double loss_forward_backward(Loss loss, const float* out, const void* target, float* dout, std::int64_t rows,
                               std::int64_t cols, float scale, void* stream = nullptr) const;
  void sgd_step(float* p, const float* g, std::int64_t n, double lr, void* stream = nullptr) const;
  void momentum_step(float* p, const float* g, float* buf, std::int64_t n, double lr, double momentum,
                     std::int64_t step, void* stream = nullptr) const;
  void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, double lr, double beta1, double beta2,
                 double eps, std::int64_t step, void* stream = nullptr) const;

 private:
  template <class F> void call(std::string_view entry, F&& f) const;

  const KernelPlugin& plugin_;
  int rank_;
  std::chrono::milliseconds timeout_;
  void* handle_ = nullptr;
};

// The kernels of --kernels `path` for one rank's engine or optimizer: nullptr when path is empty
// (dpcheck's own kernels throughout).
std::shared_ptr<const Kernels> make_kernels(const std::string& path, int rank, std::chrono::milliseconds timeout);

}  // namespace dpcheck
