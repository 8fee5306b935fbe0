// Loading a kernel plugin and calling its entries (src/plugin/kernel_plugin.hpp).
#include "src/plugin/kernel_plugin.hpp"

#include <map>
#include <mutex>

#include "src/error.hpp"
#include "src/plugin/plugin_call.hpp"
#include "src/plugin/plugin_loader.hpp"

namespace dpcheck {

std::string_view kernel_op_name(KernelOp op) {
  switch (op) {
    case KernelOp::linear_forward: return "linear_forward";
    case KernelOp::linear_backward: return "linear_backward";
    case KernelOp::activation_forward: return "activation_forward";
    case KernelOp::activation_backward: return "activation_backward";
    case KernelOp::loss_forward_backward: return "loss_forward_backward";
    case KernelOp::sgd_step: return "sgd_step";
    case KernelOp::momentum_step: return "momentum_step";
    case KernelOp::adam_step: return "adam_step";
  }
  return "?";
}

bool KernelPlugin::provides(KernelOp op) const {
  const dpcheck_kernel_plugin_t& t = *table_;
  switch (op) {
    case KernelOp::linear_forward: return t.linear_forward != nullptr;
    case KernelOp::linear_backward: return t.linear_backward != nullptr;
    case KernelOp::activation_forward: return t.activation_forward != nullptr;
    case KernelOp::activation_backward: return t.activation_backward != nullptr;
    case KernelOp::loss_forward_backward: return t.loss_forward_backward != nullptr;
    case KernelOp::sgd_step: return t.sgd_step != nullptr;
    case KernelOp::momentum_step: return t.momentum_step != nullptr;
    case KernelOp::adam_step: return t.adam_step != nullptr;
  }
  return false;
}

namespace {

// The plugins of this process by path (or in-process label): a table is read once, the process keeps
// the object loaded, and every engine of every rank shares the one table.
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<KernelPlugin>> loaded;
};

Registry& registry() {
  static Registry r;
  return r;
}

void check_kernel_table(const dpcheck_kernel_plugin_t* table, const std::string& what) {
  check_plugin_table(table, table ? table->abi : 0, table ? table->name : nullptr, what);
  if (table->memory != DPCHECK_HOST && table->memory != DPCHECK_CUDA)
    throw UsageError(what + ": its table's memory is " + std::to_string(static_cast<int>(table->memory)) +
                     ", neither DPCHECK_HOST (0) nor DPCHECK_CUDA (1)");
}

}  // namespace

const KernelPlugin& load_kernel_plugin(const std::string& path) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (auto it = r.loaded.find(path); it != r.loaded.end()) return *it->second;
  const std::string what = "--kernels " + path;
  using Entry = const dpcheck_kernel_plugin_t* (*)();
  const auto entry = reinterpret_cast<Entry>(plugin_symbol(path, "dpcheck_kernel_plugin", "--kernels"));
  const dpcheck_kernel_plugin_t* table = entry();
  check_kernel_table(table, what);
  plugin_env_names(path, "--kernels");  // a list it cannot read is refused now, not when a bundle is written
  auto plugin = std::unique_ptr<KernelPlugin>(new KernelPlugin(path, table));
  return *r.loaded.emplace(path, std::move(plugin)).first->second;
}

const KernelPlugin& in_process_kernel_plugin(const std::string& label, const dpcheck_kernel_plugin_t* table) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (auto it = r.loaded.find(label); it != r.loaded.end()) {
    DPCHECK_ASSERT(&it->second->table() == table);
    return *it->second;
  }
  check_kernel_table(table, "--kernels " + label);
  auto plugin = std::unique_ptr<KernelPlugin>(new KernelPlugin(label, table));
  return *r.loaded.emplace(label, std::move(plugin)).first->second;
}

Kernels::Kernels(const KernelPlugin& plugin, int rank, std::chrono::milliseconds timeout)
    : plugin_(plugin), rank_(rank), timeout_(timeout) {
  if (plugin_.table().init) call("init", [&] { return plugin_.table().init(&handle_); });
}

Kernels::~Kernels() {
  if (!plugin_.table().finalize) return;
  const PluginCall guard(plugin_.name(), "finalize", rank_, timeout_);
  plugin_.table().finalize(handle_);
}

template <class F> void Kernels::call(std::string_view entry, F&& f) const {
  const PluginCall guard(plugin_.name(), entry, rank_, timeout_);
  const int rc = f();
  if (rc == 0) return;
  const char* message = plugin_.table().last_error ? plugin_.table().last_error(handle_) : nullptr;
  throw PluginFault(guard.what() + " failed (returned " + std::to_string(rc) +
                    "): " + (message && *message ? std::string(message) : std::string("the plugin gave no message")));
}

void Kernels::linear_forward(const float* x, const float* w, const float* b, float* y, std::int64_t rows,
                             std::int64_t in, std::int64_t out, void* stream) const {
  call("linear_forward", [&] { return plugin_.table().linear_forward(handle_, x, w, b, y, rows, in, out, stream); });
}

void Kernels::linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                              std::int64_t rows, std::int64_t in, std::int64_t out, bool accumulate,
                              void* stream) const {
  call("linear_backward", [&] {
    return plugin_.table().linear_backward(handle_, x, w, dy, dx, dw, db, rows, in, out, accumulate ? 1 : 0, stream);
  });
}

namespace {

dpcheck_activation_t to_abi(Activation act) {
  DPCHECK_ASSERT(act != Activation::identity);  // identity has no entry: dpcheck's own
  return act == Activation::relu ? DPCHECK_RELU : DPCHECK_TANH;
}

}  // namespace

void Kernels::activation_forward(Activation act, const float* x, float* y, std::int64_t n, void* stream) const {
  call("activation_forward", [&] { return plugin_.table().activation_forward(handle_, to_abi(act), x, y, n, stream); });
}

void Kernels::activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx,
                                  std::int64_t n, void* stream) const {
  call("activation_backward",
       [&] { return plugin_.table().activation_backward(handle_, to_abi(act), x, y, dy, dx, n, stream); });
}

double Kernels::loss_forward_backward(Loss loss, const float* out, const void* target, float* dout, std::int64_t rows,
                                      std::int64_t cols, float scale, void* stream) const {
  double value = 0;
  const dpcheck_loss_t l = loss == Loss::mse ? DPCHECK_MSE : DPCHECK_CROSS_ENTROPY;
  call("loss_forward_backward", [&] {
    return plugin_.table().loss_forward_backward(handle_, l, out, target, dout, &value, rows, cols, scale, stream);
  });
  return value;
}

void Kernels::sgd_step(float* p, const float* g, std::int64_t n, double lr, void* stream) const {
  call("sgd_step", [&] { return plugin_.table().sgd_step(handle_, p, g, n, lr, stream); });
}

void Kernels::momentum_step(float* p, const float* g, float* buf, std::int64_t n, double lr, double momentum,
                            std::int64_t step, void* stream) const {
  call("momentum_step",
       [&] { return plugin_.table().momentum_step(handle_, p, g, buf, n, lr, momentum, step, stream); });
}

void Kernels::adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, double lr, double beta1,
                        double beta2, double eps, std::int64_t step, void* stream) const {
  call("adam_step",
       [&] { return plugin_.table().adam_step(handle_, p, g, m, v, n, lr, beta1, beta2, eps, step, stream); });
}

std::shared_ptr<const Kernels> make_kernels(const std::string& path, int rank, std::chrono::milliseconds timeout) {
  if (path.empty()) return nullptr;
  return std::make_shared<const Kernels>(load_kernel_plugin(path), rank, timeout);
}

}  // namespace dpcheck
