#include "verdict/bounds.hpp"

#include <cstdint>

#include "mutants/mutants.hpp"
#include "src/target/backends.hpp"

namespace dpcheck {

reference::BoundOptions bound_options(const Target& target) {
  reference::BoundOptions o;
  mutant_bound_options(target.mutant, o);
  if (target.tf32) {
    o.unit_roundoff = 0x1p-11;  // TF32 keeps 10 explicit mantissa bits
    o.product_input_roundings = 4;
  }
  o.input_format = target.precision;
  // Tensor cores may accumulate with truncation rather than rounding to nearest (Fasi, Higham, Mikaitis
  // and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 7, 2021), which doubles
  // float32's unit roundoff in the accumulation: the bound allows it on the cuda engine's products.
  if (target.precision != Precision::fp32 && target.engine->products_may_truncate) o.unit_roundoff = 0x1p-23;
  o.allreduce_format = target.allreduce_dtype == DType::bf16 ? Precision::bf16 : Precision::fp32;
  if (target.backend->rank_order) o.allreduce_schedule = reference::AllreduceSchedule::rank_order;
  return o;
}

std::int64_t allreduce_roundings(const reference::BoundOptions& options, int world_size) {
  reference::ScheduleOptions s;
  s.schedule = options.allreduce_schedule.value_or(reference::AllreduceSchedule::ring);
  s.format = options.allreduce_format;
  s.average = true;
  const reference::ScheduleDepth d = reference::schedule_depth(s, world_size);
  const auto per_rounding =
      static_cast<std::int64_t>(precision_unit_roundoff(options.allreduce_format) / options.unit_roundoff);
  return (1 + d.format) * per_rounding + d.float32;
}

reference::BoundOptions sharded_bound_options(reference::BoundOptions options, int world_size) {
  if (options.input_format != Precision::fp32) options.delta_scale *= world_size;
  if (options.allreduce_format != Precision::fp32)
    options.allreduce_roundings = allreduce_roundings(options, world_size);
  return options;
}

reference::BoundOptions bound_options(const Target& target, const TrainConfig& config) {
  reference::BoundOptions o = bound_options(target);
  o.allreduce_format = config.allreduce_dtype == DType::bf16 ? Precision::bf16 : Precision::fp32;
  return o;
}

reference::GradientBound sharded_gradient_bound(const reference::GradientBound& whole, const ModelConfig& model,
                                                std::span<const float> params, const Batch& batch, int world_size) {
  const reference::BoundOptions options = sharded_bound_options(whole.options, world_size);
  if (options.delta_scale != whole.options.delta_scale) return reference::gradient_bound(model, params, batch, options);
  reference::GradientBound out = whole;
  out.options.allreduce_roundings = options.allreduce_roundings;
  return out;
}

}  // namespace dpcheck
