// conform-host, the program behind dpcheck.conform (python/dpcheck/conform.py): a Python interpreter
// (Py_BytesMain: the same command line as python3) with one more built-in module, _dpcheck_conform, that
// runs `dpcheck conform`'s communicator checks (conform/conform_comm.cpp) on a torch.distributed process
// group, so that PyTorch's own collectives are judged by the same code, cases and verdicts as a plugin or
// MPI's own all-reduce, not by a copy of them in Python. It is a program and not a part of the
// dpcheck._core extension because conform links RapidCheck, whose Debian library is built without
// -fPIC and so cannot go into a shared object; `python3 -m dpcheck.conform` runs itself again here.
//
// Each rank is a process of a launcher (python3 -m dpcheck.launch); its Communicator is ProcessGroupComm
// below, whose collectives call back into Python, where torch.distributed runs them on tensors that
// view dpcheck's own buffers (no copy): the bits conform reads are the ones the process group wrote. The
// suite runs on the process world as mpi-native's does (a backend row whose ranks are the launcher's
// processes), one check at a time, so that a check of what the group refuses can be reported
// "unsupported" instead of run: before the suite, every rank calls each collective of each dtype and op
// once on one element, and what raises there (ProcessGroupGloo has no ReduceOp.AVG and no bfloat16) is
// what the group does not take.
#include <pybind11/embed.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "conform/conform.hpp"
#include "conform/conform_run.hpp"
#include "reference/allreduce_schedule.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/hash.hpp"
#include "src/target/backends.hpp"

namespace py = pybind11;

namespace dpcheck::torchjob {

namespace {

// PyTorch's name of the dtype a buffer of `t` travels as. uint64 travels as int64, the same bits: moved
// or summed (modulo 2^64) alike, but not compared (min and max are refused).
const char* torch_dtype(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u64: return "int64";
    case DType::u8: return "uint8";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}

// A NumPy array of `bytes` bytes over dpcheck's memory at `p`, not a copy (the capsule is the array's
// base, which makes pybind11 wrap the memory rather than copy it).
py::array bytes_over(const void* p, std::size_t bytes) {
  static unsigned char nothing[8];
  void* at = p ? const_cast<void*>(p) : nothing;
  return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(bytes)}, {py::ssize_t{1}}, at,
                   py::capsule(at, [](void*) {}));
}

std::string first_line(std::string text) {
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

// The process group as dpcheck's Communicator: each call takes the interpreter's lock and calls the
// Python object's all_reduce(buf, dtype, op), broadcast(buf, dtype, root), all_gather(send, recv, dtype)
// or barrier(), each buffer a NumPy array of bytes over dpcheck's memory and the dtype PyTorch's name; a
// Python exception becomes dpcheck's Error with its first line ("RuntimeError: ..."). Its control
// messages (conform's verdicts, hashes) go over the same group: host() is itself, as a plugin's is.
class ProcessGroupComm final : public Communicator {
 public:
  ProcessGroupComm(py::object group, int rank, int size, std::string backend)
      : group_(std::move(group)), rank_(rank), size_(size), backend_(std::move(backend)) {}
  ~ProcessGroupComm() override {
    py::gil_scoped_acquire gil;
    group_ = py::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return backend_; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::u64 && (op == ReduceOp::min || op == ReduceOp::max))
      throw Error("allreduce: PyTorch has no uint64 to take its min or max in");
    call("all_reduce", [&] {
      return group_.attr("all_reduce")(bytes_over(buf, count * dtype_size(dtype)), torch_dtype(dtype),
                                       std::string(reduce_op_name(op)));
    });
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    call("broadcast", [&] {
      return group_.attr("broadcast")(bytes_over(buf, count * dtype_size(dtype)), torch_dtype(dtype), root);
    });
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const std::size_t all = bytes * static_cast<std::size_t>(size_);
    call("all_gather",
         [&] { return group_.attr("all_gather")(bytes_over(send, bytes), bytes_over(recv, all), torch_dtype(dtype)); });
  }
  void barrier() override {
    call("barrier", [&] { return group_.attr("barrier")(); });
  }

 private:
  template <class F> void call(const char* what, const F& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      throw Error(std::string(what) + ": " + first_line(e.what()));
    }
  }

  py::object group_;
  int rank_, size_;
  std::string backend_;
};

// The backend row whose ranks are the launcher's processes and whose communicator is the world itself,
// as mpi-native's is MPI's: conform's checks reach the process group through run_world.
const Backend& process_group_backend(const std::string& name) {
  if (const Backend* row = find_registered_backend(name)) return *row;
  Backend row;
  row.name = name;
  row.engine = std::string(default_engine());
  row.memory = MemorySpace::host;
  row.help = "a torch.distributed process group, one process per rank (python3 -m dpcheck.conform)";
  row.run_processes = [](Communicator& world, const RankFunction& fn) { fn(world); };
  row.launcher = "python3 -m dpcheck.launch -n";
  return register_backend(std::move(row));
}

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};

// What the group refuses, by collective: "allreduce float32 avg", "broadcast bfloat16" -> its error.
using Refusals = std::map<std::string, std::string>;

// Each collective of each dtype (and op) once on one element, on every rank: what raises is refused.
// A refusal is the group's answer before it communicates (an unknown dtype or op), the same on every
// rank; ranks that disagree make the run an error, since a check would then wait on a rank that
// refused.
Refusals probe_refusals(Communicator& comm) {
  Refusals refused;
  const auto attempt = [&](const std::string& key, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      refused[key] = e.what();
    }
  };
  alignas(8) unsigned char one[8] = {};
  std::vector<unsigned char> all(8 * static_cast<std::size_t>(comm.size()));
  for (DType t : kDtypes) {
    const std::string name(dtype_name(t));
    for (ReduceOp op : kOps)
      attempt("allreduce " + name + " " + std::string(reduce_op_name(op)), [&] { comm.allreduce(one, 1, t, op); });
    attempt("broadcast " + name, [&] { comm.broadcast(one, 1, t, 0); });
    attempt("allgather " + name, [&] { comm.allgather(one, all.data(), 1, t); });
  }
  std::string keys;
  for (const auto& [key, why] : refused) keys += key + ";";
  const std::uint64_t mine = hash_bytes(keys.data(), keys.size());
  const std::vector<std::uint64_t> every = comm.allgather_value(mine);
  for (std::size_t r = 0; r < every.size(); ++r)
    if (every[r] != mine)
      throw Error("rank " + std::to_string(r) + " and rank " + std::to_string(comm.rank()) +
                  " disagree on which collectives the process group takes (" + keys + " here)");
  return refused;
}

// The collective a check of conform_comm_checks() asks for, as probe_refusals keys it ("" for none:
// the barrier, the absent rank), and whether the group must take it: "allreduce buffer reused", "calls
// in a row" and the fingerprint ask for a float32 sum.
std::string needed_collective(const std::string& check) {
  for (const char* prefix : {"same bits on every rank ", "run-to-run ", "schedule "})
    if (check.starts_with(prefix)) return "allreduce " + check.substr(std::string(prefix).size());
  if (check.starts_with("allreduce ") && check != "allreduce buffer reused") return check;
  if (check.starts_with("broadcast ") || check.starts_with("allgather ")) return check;
  if (check == "allreduce buffer reused" || check == "calls in a row" || check == "summation order and width")
    return "allreduce float32 sum";
  return "";
}

std::string section_of(const std::string& check) {
  if (check.starts_with("same bits") || check.starts_with("run-to-run")) return "determinism";
  if (check.starts_with("schedule ")) return "schedule";
  if (check == "summation order and width") return "fingerprint";
  if (check == "a rank that never arrives") return "robustness";
  return "collectives";
}

// The request's refusals before the world starts: an unknown check or case, a schedule that is not
// one, a schedule check without --schedule, a --case too large for this machine.
void check_request(const std::string& check, const std::string& case_text, const std::string& schedule, int world) {
  if (check.starts_with("property "))
    throw UsageError("--check '" + check +
                     "': verify's properties do not run on a process group; its checks are "
                     "conform's communicator checks (see --list-checks)");
  check_conform_comm_selection(check, case_text, nullptr);
  if (!schedule.empty()) (void)reference::parse_schedule(schedule);
  if (check.starts_with("schedule ") && schedule.empty())
    throw UsageError("--check '" + check + "' needs --schedule NAME, the schedule the process group claims");
  if (const std::size_t count = conform_case_count(check, case_text)) {
    // Each rank holds its input, its output (an all-gather's is N times the count), the expected values and
    // a copy, in elements of up to 8 bytes.
    const double need = static_cast<double>(count) * 8.0 * (std::max(world, 1) + 3.0);
    const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (need > have)
      throw UsageError("--case '" + case_text + "' (count " + std::to_string(count) + ") needs " +
                       std::to_string(static_cast<long long>(need / (1 << 20))) + " MiB a rank, more than this " +
                       "machine's " + std::to_string(static_cast<long long>(have / (1 << 20))) + " MiB");
  }
}

// What the run was asked, from dpcheck.conform's command line.
struct GroupRequest {
  std::string backend = "gloo";  // torch.distributed's name of the group's backend
  std::string library;           // the group as reports name it: "PyTorch 1.13.0 ProcessGroupGloo"
  std::string version;           // torch.__version__
  std::uint64_t seed = 1;
  bool thorough = false;
  double max_mib = -1;  // < 0: the default (16 MiB, 64 with thorough)
  std::string check, case_text, schedule;
  double timeout_s = 60;
  std::string replay_prefix;  // "python3 -m dpcheck.launch -n 3 -m dpcheck.conform --seed 2"
};

GroupRequest request_of(const py::dict& d) {
  GroupRequest r;
  r.backend = py::cast<std::string>(d["backend"]);
  r.library = py::cast<std::string>(d["library"]);
  r.version = py::cast<std::string>(d["version"]);
  r.seed = py::cast<std::uint64_t>(d["seed"]);
  r.thorough = py::cast<bool>(d["thorough"]);
  r.max_mib = py::cast<double>(d["max_mib"]);
  r.check = py::cast<std::string>(d["check"]);
  r.case_text = py::cast<std::string>(d["case"]);
  r.schedule = py::cast<std::string>(d["schedule"]);
  r.timeout_s = py::cast<double>(d["timeout"]);
  r.replay_prefix = py::cast<std::string>(d["replay_prefix"]);
  return r;
}

ConformRow refused_row(const std::string& check, const std::string& library, const std::string& why) {
  ConformRow row;
  row.section = section_of(check);
  row.check = check;
  row.verdict = ConformVerdict::unsupported;
  row.detail = library + " refuses it on every rank: " + why;
  return row;
}

// conform's communicator checks (conform_comm_checks(), in order) on the process group `group` of which
// this process is rank `rank` of `size`; `say` prints on rank 0 (the header, each row as it is decided,
// the summary). Returns {"passed", "report"}: the JSON report dpcheck conform --report writes.
py::dict conform_process_group(py::object group, int rank, int size, const py::dict& request, py::object say) {
  const GroupRequest r = request_of(request);
  check_request(r.check, r.case_text, r.schedule, size);
  const auto print = [&](const std::string& text) {
    if (rank != 0) return;
    py::gil_scoped_acquire gil;
    say(text);
  };
  ProcessGroupComm comm(std::move(group), rank, size, "torch-" + r.backend);
  Target target;
  target.backend = &process_group_backend("torch-" + r.backend);
  target.process_world = &comm;
  target.world_size = size;
  target.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(r.timeout_s * 1000));

  ConformOptions o;
  o.seed = r.seed;
  o.timeout = target.timeout;
  o.case_text = r.case_text;
  o.properties = nullptr;
  o.thorough = r.thorough;
  o.schedule = r.schedule;
  o.max_bytes = static_cast<std::size_t>((r.max_mib >= 0 ? r.max_mib : r.thorough ? 64.0 : 16.0) * 1024 * 1024);
  o.absent_rank_skip = "runs only with dpcheck conform's ranks as threads; a process group's ranks are processes";
  o.replay_prefix = r.replay_prefix;

  std::vector<ConformRow> rows;
  std::set<std::string> dtypes, ops;
  std::string refusal_text;
  {
    py::gil_scoped_release release;
    Refusals refused;
    bool headed = false;
    const auto emit = [&](const ConformRow& row) {
      if (!headed) {
        print("dpcheck conform: process group " + r.library + " (torch.distributed, backend " + r.backend +
              "), world size " + std::to_string(size) + " (processes), seed " + std::to_string(r.seed) +
              (r.thorough ? ", thorough" : "") + "\n" + refusal_text + "\n" + conform_table_head());
        headed = true;
      }
      print(conform_table_line(row));
    };
    refused = probe_refusals(comm);
    for (DType t : kDtypes)
      for (ReduceOp op : kOps)
        if (!refused.contains("allreduce " + std::string(dtype_name(t)) + " " + std::string(reduce_op_name(op)))) {
          dtypes.insert(std::string(dtype_name(t)));
          ops.insert(std::string(reduce_op_name(op)));
        }
    std::map<std::string, std::string> by_reason;  // the group's words -> what it refused with them
    for (const auto& [key, why] : refused) by_reason[why] += (by_reason[why].empty() ? "" : ", ") + key;
    for (const auto& [why, keys] : by_reason) refusal_text += "refuses (" + why + "): " + keys + "\n";
    if (refused.empty()) refusal_text = "takes every collective, dtype and op conform checks\n";
    // Once the group is broken (a check's failure left a rank behind), the later checks would fail for that
    // same reason: they are not run, and say which row to read.
    std::string stopped;
    for (const std::string& name : conform_comm_checks()) {
      if (!r.check.empty() && name != r.check) continue;
      if (name.starts_with("schedule ") && r.schedule.empty()) continue;
      const std::string needed = needed_collective(name);
      std::vector<ConformRow> got;
      if (const auto it = refused.find(needed); it != refused.end()) {
        got.push_back(refused_row(name, r.library, it->second));
      } else if (!stopped.empty()) {
        ConformRow row;
        row.section = section_of(name);
        row.check = name;
        row.verdict = ConformVerdict::skip;
        row.detail = "not run: " + stopped;
        got.push_back(row);
      } else {
        ConformOptions one = o;
        one.check = name;
        got = conform_comm(target, size, one);
      }
      for (ConformRow& row : got) {
        emit(row);
        if (row.verdict == ConformVerdict::fail && stopped.empty()) {
          try {
            comm.barrier();
          } catch (const std::exception&) {
            stopped = "the process group broke at '" + name + "' (its failure says why)";
          }
        }
        rows.push_back(std::move(row));
      }
    }
  }
  if (rows.empty()) throw UsageError("--check '" + r.check + "' matched no check (see --list-checks)");
  const ConformSummary summary = conform_summary(rows);
  print(summary.text);
  nlohmann::json plugin{{"kind", "comm"},
                        {"path", "torch.distributed " + r.backend},
                        {"engine", std::string(default_engine())},
                        {"name", r.library},
                        {"version", r.version},
                        {"abi", nullptr},
                        {"dtypes", std::vector<std::string>(dtypes.begin(), dtypes.end())},
                        {"ops", std::vector<std::string>(ops.begin(), ops.end())}};
  const nlohmann::json report{{"passed", summary.passed}, {"seed", r.seed},     {"thorough", r.thorough},
                              {"plugin", plugin},         {"world_size", size}, {"checks", conform_rows_json(rows)}};
  py::dict out;
  out["passed"] = summary.passed;
  out["report"] = report.dump(2) + "\n";
  return out;
}

}  // namespace

}  // namespace dpcheck::torchjob

PYBIND11_EMBEDDED_MODULE(_dpcheck_conform, m) {
  using namespace dpcheck::torchjob;
  m.doc() = "dpcheck conform's communicator checks on a torch.distributed process group (dpcheck.conform)";
  py::register_exception<dpcheck::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<dpcheck::UsageError>(m, "UsageError", PyExc_ValueError);
  m.def("conform_checks", &dpcheck::conform_comm_checks,
        "The names of dpcheck conform's communicator checks, in order");
  m.def("check_conform_request", &check_request, py::arg("check"), py::arg("case"), py::arg("schedule"),
        py::arg("world_size"), "UsageError unless the check, case and schedule can run (before the world starts)");
  m.def(
      "check_output_path",
      [](const std::string& path, const std::string& option) { dpcheck::check_output_path(path, option); },
      py::arg("path"), py::arg("option"), "UsageError unless the path can take an output file");
  m.def(
      "write_file", [](const std::string& path, const std::string& text) { dpcheck::write_file_atomic(path, text); },
      py::arg("path"), py::arg("text"), "Replace the file with the text, atomically");
  m.def("conform_process_group", &conform_process_group, py::arg("group"), py::arg("rank"), py::arg("size"),
        py::arg("request"), py::arg("say"),
        "dpcheck conform's communicator checks on a process group (every rank calls it): {passed, report}");
}

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
