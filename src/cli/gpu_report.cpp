#include "src/cli/gpu_report.hpp"

#include <cstdio>
#include <ostream>
#include <string>

namespace dpcheck::cuda {

void print_step_table(std::ostream& out, const std::vector<StepBenchRow>& rows) {
  char buf[512];
  out << "# dpcheck bench step: forward, MSE loss, backward and SGD step of a ReLU MLP, float32 (TF32 off);\n"
         "# medians of CUDA-event timings after warm-up; PyTorch runs the same step on the same GPU in this run\n";
  std::snprintf(buf, sizeof buf, "%-22s %6s %10s %10s %10s %8s %8s %6s %9s\n", "model", "batch", "eager(ms)",
                "graph(ms)", "torch(ms)", "ratio", "goal", "TFLOP/s", "samebits");
  out << buf;
  for (const StepBenchRow& r : rows) {
    std::string dims;
    for (int d : r.model.dims) dims += (dims.empty() ? "" : "-") + std::to_string(d);
    std::snprintf(buf, sizeof buf, "%-22s %6d %10.3f %10.3f %10.3f %8.3f %8s %6.1f %9s\n", dims.c_str(), r.model.batch,
                  r.eager_ms, r.graph_ms, r.torch_ms, r.ratio(),
                  r.model.goal > 0 ? ("<=" + std::to_string(r.model.goal).substr(0, 4)).c_str() : "-", r.tflops,
                  r.same_bits ? "yes" : "NO");
    out << buf;
    if (!r.torch_note.empty()) out << "#   " << r.torch_note << "\n";
  }
}

void print_hash_table(std::ostream& out, const HashBenchRow& r) {
  char buf[512];
  out << "# dpcheck bench hash: the replica hash's read bandwidth against a device-to-device copy's\n";
  std::snprintf(buf, sizeof buf, "%14s %10s %12s %10s %12s %8s\n", "bytes", "hash(ms)", "read(GB/s)", "copy(ms)",
                "copy(GB/s)", "ratio");
  out << buf;
  std::snprintf(buf, sizeof buf, "%14zu %10.3f %12.1f %10.3f %12.1f %8.3f\n", r.bytes, r.hash_ms, r.hash_gbs, r.copy_ms,
                r.copy_gbs, r.ratio());
  out << buf;
}

nlohmann::json step_json(const std::vector<StepBenchRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const StepBenchRow& r : rows)
    a.push_back({{"dims", r.model.dims},
                 {"batch", r.model.batch},
                 {"eager_ms", r.eager_ms},
                 {"graph_ms", r.graph_ms},
                 {"torch_ms", r.torch_ms},
                 {"ratio", r.ratio()},
                 {"goal", r.model.goal},
                 {"tflops", r.tflops},
                 {"same_bits", r.same_bits},
                 {"torch_note", r.torch_note}});
  return a;
}

nlohmann::json hash_json(const HashBenchRow& r) {
  return {{"bytes", r.bytes},     {"hash_ms", r.hash_ms},   {"hash_gbs", r.hash_gbs},
          {"copy_ms", r.copy_ms}, {"copy_gbs", r.copy_gbs}, {"ratio", r.ratio()}};
}

}  // namespace dpcheck::cuda
