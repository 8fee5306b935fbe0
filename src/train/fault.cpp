#include "src/train/fault.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace dpcheck {

std::string_view fault_phase_name(FaultPhase phase) {
  switch (phase) {
    case FaultPhase::data: return "data";
    case FaultPhase::local_gradient: return "local gradient";
    case FaultPhase::all_reduce: return "all-reduce";
    case FaultPhase::update: return "update";
    case FaultPhase::optimizer_state: return "optimizer state";
  }
  return "?";
}

std::string Fault::describe() const {
  const char* what = phase == FaultPhase::data         ? "a replaced example"
                     : kind == FaultKind::flip_low_bit ? "a flipped low bit"
                     : kind == FaultKind::nan          ? "a NaN"
                     : kind == FaultKind::bug          ? "a bug-sized change"
                                                       : "this rank's own input left";
  return std::string(what) + " in the " + std::string(fault_phase_name(phase)) + " of rank " + std::to_string(rank) +
         (phase == FaultPhase::all_reduce ? " at data all-reduce " : " at step ") + std::to_string(step) +
         (phase == FaultPhase::data ? ", position " : ", element ") + std::to_string(element);
}

namespace {

// What a fault of this kind makes of v (keep_input: the caller's).
float faulted(float v, FaultKind kind) {
  switch (kind) {
    case FaultKind::nan: return std::numeric_limits<float>::quiet_NaN();
    case FaultKind::bug: return v + 0.25f * std::max(std::fabs(v), 1.0f);
    default: return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) ^ 1u);
  }
}

}  // namespace

void inject_fault(const MemoryService& memory, float* buf, std::size_t n, const Fault& fault) {
  if (n == 0) return;
  float* at = buf + std::min(fault.element, n - 1);
  float v = 0;
  memory.copy_to_host(at, &v, 1);
  v = faulted(v, fault.kind);
  memory.copy_from_host(&v, at, 1);
}

namespace {

class FaultCommunicator final : public ForwardingCommunicator {
 public:
  FaultCommunicator(Communicator& inner, const Fault& fault) : ForwardingCommunicator(inner), fault_(fault) {}
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const bool now = dtype == DType::f32 && calls_ == fault_.step && rank() == fault_.rank && count > 0;
    if (dtype == DType::f32) ++calls_;
    auto* at = static_cast<float*>(buf) + (count > 0 ? std::min(fault_.element, count - 1) : 0);
    float input = 0;
    if (now) inner_.to_host(at, &input, sizeof input);
    inner_.allreduce(buf, count, dtype, op);
    if (!now) return;
    float v = input;
    if (fault_.kind != FaultKind::keep_input) {
      inner_.to_host(at, &v, sizeof v);
      v = faulted(v, fault_.kind);
    }
    inner_.from_host(&v, at, sizeof v);
  }

 private:
  Fault fault_;
  std::int64_t calls_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> fault_communicator(Communicator& inner, const Fault& fault) {
  return std::make_unique<FaultCommunicator>(inner, fault);
}

TrainerHooks fault_hooks(const Fault& fault) {
  if (fault.phase == FaultPhase::all_reduce) return {};
  // The fault's step on its rank, or (fault.step < 0) every step from -fault.step on.
  const auto now = [fault](const Trainer& t, std::int64_t step) {
    return t.rank() == fault.rank && (fault.step >= 0 ? step == fault.step : step >= -fault.step);
  };
  TrainerHooks hooks;
  switch (fault.phase) {
    case FaultPhase::data:
      hooks.local_indices = [fault, now](const Trainer& t, std::int64_t step, std::vector<std::int64_t> idx) {
        if (now(t, step) && !idx.empty()) {
          std::int64_t& at = idx[std::min(fault.element, idx.size() - 1)];
          at = (at + 1) % t.data().size();
        }
        return idx;
      };
      break;
    case FaultPhase::local_gradient:
      hooks.local_gradient_ready = [fault, now](Trainer& t, std::int64_t step) {
        if (now(t, step)) inject_fault(t.engine().memory(), t.engine().grads(), t.engine().param_count(), fault);
      };
      break;
    case FaultPhase::update:
      hooks.update_done = [fault, now](Trainer& t, std::int64_t step) {
        if (now(t, step)) inject_fault(t.engine().memory(), t.engine().params(), t.engine().param_count(), fault);
      };
      break;
    case FaultPhase::optimizer_state:
      hooks.update_done = [fault, now](Trainer& t, std::int64_t step) {
        if (now(t, step)) inject_fault(t.engine().memory(), t.optimizer().state(), t.optimizer().state_size(), fault);
      };
      break;
    case FaultPhase::all_reduce: break;
  }
  return hooks;
}

}  // namespace dpcheck
