// Communicator plugins (src/target/plugin_comm.hpp): loading, the bootstrap dpcheck hands them, the
// guarded calls, and their rows in the backend table.
#include "src/target/plugin_comm.hpp"

#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>

#include "src/comm/local_comm.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/plugin/plugin_call.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/target/cuda_plugin.hpp"

namespace dpcheck {

namespace {

const char* abi_dtype_macro(DType t) {
  switch (t) {
    case DType::f32: return "DPCHECK_FLOAT32";
    case DType::f64: return "DPCHECK_FLOAT64";
    case DType::i64: return "DPCHECK_INT64";
    case DType::bf16: return "DPCHECK_BFLOAT16";
    case DType::f16: return "DPCHECK_FLOAT16";
    default: return "?";
  }
}

const char* abi_op_macro(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "DPCHECK_SUM";
    case ReduceOp::avg: return "DPCHECK_AVG";
    case ReduceOp::min: return "DPCHECK_MIN";
    case ReduceOp::max: return "DPCHECK_MAX";
  }
  return "?";
}

dpcheck_op_t abi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return DPCHECK_SUM;
    case ReduceOp::avg: return DPCHECK_AVG;
    case ReduceOp::min: return DPCHECK_MIN;
    case ReduceOp::max: return DPCHECK_MAX;
  }
  return DPCHECK_SUM;
}

// The dtypes of the ABI; the others (uint8, int32, uint64) are dpcheck's own control messages.
bool abi_dtype(DType t, dpcheck_dtype_t* out) {
  switch (t) {
    case DType::f32: *out = DPCHECK_FLOAT32; return true;
    case DType::f64: *out = DPCHECK_FLOAT64; return true;
    case DType::i64: *out = DPCHECK_INT64; return true;
    case DType::bf16: *out = DPCHECK_BFLOAT16; return true;
    case DType::f16: *out = DPCHECK_FLOAT16; return true;
    case DType::i32:
    case DType::u64:
    case DType::u8: return false;
  }
  return false;
}

// The dtypes and ops a table declares (include/dpcheck/plugin.h, "Capabilities"): abi 1 has its own
// dtypes and ops; abi 2 every dtype and op of abi 2; abi 3 and later its masks, 0 meaning abi 1's.
std::uint32_t declared_dtypes(const dpcheck_comm_plugin_t& plugin) {
  if (plugin.abi == 1) return DPCHECK_ABI1_DTYPES;
  if (plugin.abi == 2)
    return DPCHECK_ABI1_DTYPES | DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16);
  return plugin.dtypes ? plugin.dtypes : DPCHECK_ABI1_DTYPES;
}

std::uint32_t declared_ops(const dpcheck_comm_plugin_t& plugin) {
  if (plugin.abi < 3 || plugin.ops == 0) return DPCHECK_ABI1_OPS;
  return plugin.ops;
}

// The rules in force: a mutant's where it breaks one (PluginRules), else plugin.h's.
std::uint32_t dtypes_under(const dpcheck_comm_plugin_t& plugin, const PluginRules& rules) {
  return rules.dtypes ? rules.dtypes(plugin) : declared_dtypes(plugin);
}
std::uint32_t ops_under(const dpcheck_comm_plugin_t& plugin, const PluginRules& rules) {
  return rules.ops ? rules.ops(plugin) : declared_ops(plugin);
}
bool has_dtype_under(const dpcheck_comm_plugin_t& plugin, DType dtype, const PluginRules& rules) {
  dpcheck_dtype_t t;
  return abi_dtype(dtype, &t) && (dtypes_under(plugin, rules) & DPCHECK_DTYPE_BIT(t)) != 0;
}
bool supports_under(const dpcheck_comm_plugin_t& plugin, DType dtype, ReduceOp op, const PluginRules& rules) {
  return has_dtype_under(plugin, dtype, rules) && (ops_under(plugin, rules) & DPCHECK_OP_BIT(abi_op(op))) != 0;
}

constexpr std::uint32_t kAllDtypes =
    DPCHECK_ABI1_DTYPES | DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16);

constexpr DType kAbiDtypes[] = {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16};
constexpr ReduceOp kAbiOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};

class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(const dpcheck_comm_plugin_t& plugin, std::string backend, Communicator& base,
                     std::unique_ptr<Communicator> bootstrap_transport, const PluginRules& rules = {})
      : plugin_(plugin),
        backend_(std::move(backend)),
        base_(base),
        transport_(std::move(bootstrap_transport)),
        rules_(rules) {
    Communicator::set_timeout(base.timeout());
    boot_.rank = base.rank();
    boot_.size = base.size();
    boot_.same_process = base.shares_address_space() ? 1 : 0;
    boot_.ctx = this;
    boot_.allgather = &PluginCommunicator::boot_allgather;
    boot_.barrier = &PluginCommunicator::boot_barrier;
    guarded("init", [&] { return plugin_.init(&boot_, &comm_); });
  }

  // After a failure: finalize without waiting for the other ranks (plugin.h, "Finalize").
  ~PluginCommunicator() override { finalize(); }

  // The normal end of a run: once every rank's last call into the plugin has returned (a barrier on
  // dpcheck's own transport, which the plugin cannot break), every rank's finalize, the bootstrap still
  // valid. A barrier that fails (another rank failed) leaves the finalize to the destructor.
  void close() {
    if (!rules_.finalize_before_barrier) base_.host().barrier();
    finalize();
    if (rules_.finalize_before_barrier) base_.host().barrier();
  }

  int rank() const override { return base_.rank(); }
  int size() const override { return base_.size(); }
  std::string_view backend() const override { return backend_; }
  MemorySpace memory_space() const override {
    return plugin_.memory == DPCHECK_CUDA ? MemorySpace::device : MemorySpace::host;
  }
  Communicator& host() override { return base_.host(); }
  bool shares_address_space() const override { return base_.shares_address_space(); }
  void set_stream(void* stream) override {
    stream_ = stream;
    base_.set_stream(stream);
  }
  void to_host(const void* src, void* dst, std::size_t bytes) override { base_.to_host(src, dst, bytes); }
  void from_host(const void* src, void* dst, std::size_t bytes) override { base_.from_host(src, dst, bytes); }
  void set_timeout(std::chrono::milliseconds t) override {
    Communicator::set_timeout(t);
    base_.set_timeout(t);
  }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    dpcheck_dtype_t t;
    if (!plugin_dtype(dtype, &t)) return base_.host().allreduce(buf, count, dtype, op);
    if (!supports_under(plugin_, dtype, op, rules_)) throw UsageError(comm_plugin_lacks(plugin_, backend_, dtype, op));
    guarded("allreduce", [&] { return plugin_.allreduce(comm_, buf, count, t, abi_op(op), stream_); });
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    dpcheck_dtype_t t;
    if (!plugin_dtype(dtype, &t)) return base_.host().broadcast(buf, count, dtype, root);
    guarded("broadcast", [&] { return plugin_.broadcast(comm_, buf, count, t, root, stream_); });
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    dpcheck_dtype_t t;
    if (!plugin_dtype(dtype, &t)) return base_.host().allgather(send, recv, count, dtype);
    guarded("allgather", [&] { return plugin_.allgather(comm_, send, recv, count, t, stream_); });
  }

  void barrier() override {
    guarded("barrier", [&] { return plugin_.barrier(comm_); });
  }

 private:
  // The plugin's dtype for a collective of `dtype`; false for dpcheck's own control messages, which go
  // over host(). A dtype the plugin does not declare is refused on every rank alike, before any rank
  // calls the plugin (which would read it as a dtype it does not know).
  bool plugin_dtype(DType dtype, dpcheck_dtype_t* out) const {
    if (!abi_dtype(dtype, out)) return false;
    if (!has_dtype_under(plugin_, dtype, rules_)) throw UsageError(comm_plugin_lacks(plugin_, backend_, dtype));
    return true;
  }

  void finalize() {
    if (finalized_) return;
    finalized_ = true;
    PluginCall call(plugin_.name, "finalize", rank(), timeout());
    plugin_.finalize(comm_);
  }

  // The bootstrap's transport: a communicator of its own under a launcher (a timeout there must not
  // break the world dpcheck's checks talk over), the rank's host communicator among threads.
  Communicator& transport() { return transport_ ? *transport_ : base_.host(); }

  // The bootstrap's calls give up after three quarters of the timeout, so that a plugin that passes
  // the failure on is heard before the watchdog ends the run.
  template <class Body> int bootstrap_call(const char* what, const Body& body) {
    Communicator& c = transport();
    const std::chrono::milliseconds before = c.timeout();
    c.set_timeout(std::max(std::chrono::milliseconds(1), timeout() * 3 / 4));
    int rc = 0;
    try {
      body(c);
    } catch (const std::exception& e) {
      bootstrap_error_ = std::string("bootstrap ") + what + ": " + e.what();
      rc = 1;
    }
    c.set_timeout(before);
    return rc;
  }

  static int boot_allgather(void* ctx, const void* send, void* recv, std::size_t bytes) {
    auto* self = static_cast<PluginCommunicator*>(ctx);
    return self->bootstrap_call("allgather", [&](Communicator& c) { c.allgather(send, recv, bytes, DType::u8); });
  }

  static int boot_barrier(void* ctx) {
    auto* self = static_cast<PluginCommunicator*>(ctx);
    return self->bootstrap_call("barrier", [](Communicator& c) { c.barrier(); });
  }

  // One call into the plugin under the watchdog, its non-zero return an Error (check).
  template <class Call> void guarded(const char* call, const Call& f) {
    int rc;
    {
      PluginCall guard(plugin_.name, call, rank(), timeout());
      rc = f();
    }
    check(rc, call);
  }

  void check(int rc, const char* call) {
    if (rc == 0) {
      bootstrap_error_.clear();
      return;
    }
    std::string why;
    {
      PluginCall guard(plugin_.name, "last_error", rank(), timeout());
      const char* text = plugin_.last_error(comm_);
      why = text && *text ? text : "(last_error says nothing)";
    }
    if (!bootstrap_error_.empty()) why += " [dpcheck's " + bootstrap_error_ + "]";
    bootstrap_error_.clear();
    throw PluginFault("plugin '" + std::string(plugin_.name) + "' " + call + " on rank " + std::to_string(rank()) +
                      " returned " + std::to_string(rc) + ": " + why);
  }

  const dpcheck_comm_plugin_t& plugin_;
  std::string backend_;
  Communicator& base_;
  std::unique_ptr<Communicator> transport_;
  dpcheck_bootstrap_t boot_{};
  void* comm_ = nullptr;
  void* stream_ = nullptr;
  std::string bootstrap_error_;
  PluginRules rules_;
  bool finalized_ = false;
};

// A plugin with a transport of its own learns the timeout from the environment. Set while one thread
// runs, before the ranks start.
void export_timeout(std::chrono::milliseconds timeout) {
  ::setenv("DPCHECK_PLUGIN_TIMEOUT_MS", std::to_string(timeout.count()).c_str(), 1);
}

}  // namespace

const dpcheck_comm_plugin_t& load_comm_plugin(const std::string& path, std::string_view option) {
  static std::mutex mutex;
  static std::map<std::string, const dpcheck_comm_plugin_t*> loaded;
  std::lock_guard lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  const std::string what = std::string(option) + " " + path;
  using Entry = const dpcheck_comm_plugin_t* (*)();
  const auto entry = reinterpret_cast<Entry>(plugin_symbol(path, "dpcheck_comm_plugin", option));
  const dpcheck_comm_plugin_t* table = entry();
  check_plugin_table(table, table ? table->abi : 0, table ? table->name : nullptr, what);
  if (table->memory != DPCHECK_HOST && table->memory != DPCHECK_CUDA)
    throw UsageError(what + ": memory " + std::to_string(static_cast<int>(table->memory)) +
                     " is neither DPCHECK_HOST (0) nor DPCHECK_CUDA (1)");
  const std::string kind = "communicator";
  require_entry(reinterpret_cast<const void*>(table->init), "init", what, kind);
  require_entry(reinterpret_cast<const void*>(table->allreduce), "allreduce", what, kind);
  require_entry(reinterpret_cast<const void*>(table->broadcast), "broadcast", what, kind);
  require_entry(reinterpret_cast<const void*>(table->allgather), "allgather", what, kind);
  require_entry(reinterpret_cast<const void*>(table->barrier), "barrier", what, kind);
  require_entry(reinterpret_cast<const void*>(table->last_error), "last_error", what, kind);
  require_entry(reinterpret_cast<const void*>(table->finalize), "finalize", what, kind);
  if (table->abi >= 3) {
    if (const std::uint32_t unknown = table->dtypes & ~kAllDtypes)
      throw UsageError(what + ": its table's dtypes hold bit " + std::to_string(std::countr_zero(unknown)) +
                       ", which is no dtype of plugin ABI " + std::to_string(DPCHECK_PLUGIN_ABI) +
                       " (use DPCHECK_DTYPE_BIT of a dpcheck_dtype_t)");
    if (const std::uint32_t unknown = table->ops & ~static_cast<std::uint32_t>(DPCHECK_ABI1_OPS))
      throw UsageError(what + ": its table's ops hold bit " + std::to_string(std::countr_zero(unknown)) +
                       ", which is no op of plugin ABI " + std::to_string(DPCHECK_PLUGIN_ABI) +
                       " (use DPCHECK_OP_BIT of a dpcheck_op_t)");
  }
  plugin_env_names(path, option);  // a list it cannot read is refused now, not when a bundle is written
  loaded.emplace(path, table);
  return *table;
}

bool comm_plugin_has_dtype(const dpcheck_comm_plugin_t& plugin, DType dtype) {
  return has_dtype_under(plugin, dtype, {});
}

bool comm_plugin_supports(const dpcheck_comm_plugin_t& plugin, DType dtype, ReduceOp op) {
  return supports_under(plugin, dtype, op, {});
}

std::string comm_plugin_capabilities(const dpcheck_comm_plugin_t& plugin) {
  std::string dtypes, ops;
  for (DType t : kAbiDtypes)
    if (comm_plugin_has_dtype(plugin, t)) dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(t));
  for (ReduceOp op : kAbiOps)
    if (declared_ops(plugin) & DPCHECK_OP_BIT(abi_op(op)))
      ops += (ops.empty() ? "" : ", ") + std::string(reduce_op_name(op));
  return "dtypes " + (dtypes.empty() ? std::string("none") : dtypes) + "; all-reduce ops " +
         (ops.empty() ? std::string("none") : ops);
}

std::string comm_plugin_label(const dpcheck_comm_plugin_t& plugin) {
  std::string label = "'" + std::string(plugin.name) + "'";
  if (plugin.abi >= 3 && plugin.version && *plugin.version) label += " " + std::string(plugin.version);
  return label;
}

std::string comm_plugin_lacks(const dpcheck_comm_plugin_t& plugin, const std::string& path, DType dtype,
                              std::optional<ReduceOp> op) {
  const std::string name(dtype_name(dtype));
  const std::string who = "plugin '" + std::string(plugin.name) + "' (" + path + ")";
  if (!comm_plugin_has_dtype(plugin, dtype)) {
    if (plugin.abi < 3 && is_16bit_float(dtype))
      return who + " is of plugin ABI " + std::to_string(plugin.abi) + ", which has no " + name +
             ": rebuild it against this dpcheck's plugin.h (ABI " + std::to_string(DPCHECK_PLUGIN_ABI) + "), handle " +
             name + " and declare it in its table's dtypes";
    return who + " does not support " + name + " collectives (it declares " + comm_plugin_capabilities(plugin) +
           "): use a dtype it declares" + (op ? " (--allreduce-dtype f32)" : "") + ", or add DPCHECK_DTYPE_BIT(" +
           abi_dtype_macro(dtype) + ") to its table's dtypes once it handles them";
  }
  const std::string op_name(reduce_op_name(*op));
  return who + " does not support " + op_name + " all-reduces (it declares " + comm_plugin_capabilities(plugin) +
         "): dpcheck's gradient all-reduce is an avg; add DPCHECK_OP_BIT(" + abi_op_macro(*op) +
         ") to its table's ops once it handles them";
}

void run_on_plugin(const dpcheck_comm_plugin_t& plugin, const std::string& backend, Communicator& base,
                   const std::function<void(Communicator&)>& fn, const PluginRules& rules) {
  PluginCommunicator comm(plugin, backend, base, nullptr, rules);
  fn(comm);
  comm.close();
}

std::unique_ptr<Communicator> make_plugin_communicator(const dpcheck_comm_plugin_t& plugin, std::string backend,
                                                       Communicator& base) {
  return std::make_unique<PluginCommunicator>(plugin, std::move(backend), base, nullptr);
}

const Backend& register_comm_plugin(const std::string& path) {
  if (const Backend* row = find_registered_backend(path)) return *row;
  const dpcheck_comm_plugin_t& plugin = load_comm_plugin(path);
  Backend row;
  row.name = path;
  row.help = "the plugin '" + std::string(plugin.name) + "'";
  const std::string name = path;
  if (plugin.memory == DPCHECK_HOST) {
    row.memory = MemorySpace::host;
    row.engine = engine_for_memory(row.memory).name;
    row.run_threads = [&plugin, name](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
      export_timeout(timeout);
      run_local(
          n, [&](Communicator& base) { run_on_plugin(plugin, name, base, fn); }, timeout);
    };
    row.run_processes = [&plugin, name](Communicator& world, const RankFunction& fn) {
      export_timeout(world.timeout());
      // The bootstrap gets an MPI communicator of its own (collective: every rank is here).
      std::unique_ptr<Communicator> transport = make_mpi_communicator();
      transport->set_timeout(world.timeout());
      PluginCommunicator comm(plugin, name, world, std::move(transport));
      fn(comm);
      comm.close();
    };
    row.launcher = "mpirun -np";
  } else {
    // Device buffers: the ranks are the cuda engine's replicas on this machine's GPU, a thread each, and
    // the plugin's communicator stands in for cuda-local's collectives (whose copies and host transport
    // it keeps).
    row.memory = MemorySpace::device;
    row.engine = engine_for_memory(row.memory).name;
    row.run_threads = [&plugin, name](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
      export_timeout(timeout);
      require_cuda().run_cuda_local(
          n, [&](Communicator& base) { run_on_plugin(plugin, name, base, fn); }, timeout);
    };
  }
  return register_backend(std::move(row));
}

namespace {
// --comm PATH: the plugin's row (add_backend_finder), registered with the table by this file at start-up.
const Backend* plugin_row(std::string_view name) {
  return looks_like_plugin_path(name) ? &register_comm_plugin(std::string(name)) : nullptr;
}
[[maybe_unused]] const bool plugin_rows_found = (add_backend_finder(plugin_row), true);
}  // namespace

}  // namespace dpcheck
