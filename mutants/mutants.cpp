#include "mutants/mutants.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/io/json_limits.hpp"
#include "src/low_precision.hpp"
#include "src/rng.hpp"
#include "src/target/plugin_comm.hpp"

namespace dpcheck {

namespace {

class SumNoAverage final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op == ReduceOp::avg ? ReduceOp::sum : op);
  }
};

// Sums count elements of `all` (rank k's block at k * count) in `order`, into out, in T. bfloat16 and
// float16 are rounded to the format after every addition, as a ring that starts where it likes does
// (src/comm.hpp): summed in float32 and rounded once, another order would almost never change the
// result, and the mutant would break nothing.
template <class T> void sum_in_order(const T* all, std::size_t count, const std::vector<std::size_t>& order,
                                     ReduceOp op, DType dtype, T* out) {
  const auto n = order.size();
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, std::uint16_t>) {
      const auto widen = [&](std::uint16_t h) {
        return dtype == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
      };
      const auto narrow = [&](float f) { return dtype == DType::bf16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f); };
      std::uint16_t acc = all[order[0] * count + i];
      for (std::size_t k = 1; k < n; ++k) acc = narrow(widen(acc) + widen(all[order[k] * count + i]));
      out[i] = op == ReduceOp::avg ? narrow(widen(acc) / static_cast<float>(n)) : acc;
    } else {
      T acc = all[order[0] * count + i];
      for (std::size_t k = 1; k < n; ++k) acc += all[order[k] * count + i];
      out[i] = op == ReduceOp::avg ? acc / static_cast<T>(n) : acc;
    }
  }
}

class RankOrderSum final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::f32 && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<float*>(buf), count, op, dtype);
    else if (dtype == DType::f64 && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<double*>(buf), count, op, dtype);
    else if (is_16bit_float(dtype) && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<std::uint16_t*>(buf), count, op, dtype);
    else inner_.allreduce(buf, count, dtype, op);
  }

 private:
  // Works on host copies (staged from and back to the device for GPU backends), gathered through the
  // host communicator.
  template <class T> void reduce_from_own_rank(T* buf, std::size_t count, ReduceOp op, DType dtype) {
    const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    std::vector<T> mine(count), all(count * n);
    inner_.to_host(buf, mine.data(), count * sizeof(T));
    inner_.host().allgather(mine.data(), all.data(), count, dtype);
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = (me + k) % n;
    sum_in_order(all.data(), count, order, op, dtype, mine.data());
    inner_.from_host(mine.data(), buf, count * sizeof(T));
  }
};

// The split's arithmetic in 32 bits (unsigned, so that it wraps rather than overflows, then read back
// as an int): every position past 2^31 - 1 turns negative.
class Index32Sampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;

 protected:
  std::int64_t position(int rank, std::int64_t k) const override {
    const auto n = static_cast<std::uint32_t>(config().world_size), r = static_cast<std::uint32_t>(rank);
    const auto i = static_cast<std::uint32_t>(k), total = static_cast<std::uint32_t>(total_size());
    const std::uint32_t p = config().split == Split::strided ? r + i * n : r * (total / n) + std::min(r, total % n) + i;
    return static_cast<std::int32_t>(p);
  }
};

class RankSeedSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    SamplerConfig own = config();
    own.seed += static_cast<std::uint64_t>(rank);
    return share_of(DistributedSampler(own).epoch_order(epoch), rank);
  }
};

class OffByOneSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    const std::vector<std::int64_t> order = epoch_order(epoch);
    std::vector<std::int64_t> mine = share_of(order, rank);
    if (rank == 0 || mine.empty()) return mine;
    const std::vector<std::int64_t> previous = share_of(order, rank - 1);
    if (previous.empty()) return mine;
    mine.pop_back();
    mine.insert(mine.begin(), previous.back());
    return mine;
  }
};

// The shuffle as a contributor might rewrite it: Sattolo's partner in [0, i), or the bits modulo i + 1.
enum class ShuffleSlip { sattolo, modulo };
template <ShuffleSlip slip> class SlippedShuffleSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    std::vector<std::int64_t> order(static_cast<std::size_t>(config().dataset_size));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    if (config().shuffle) {
      const std::uint64_t key = mix_key(config().seed, static_cast<std::uint64_t>(epoch));
      for (std::size_t i = order.size() > 0 ? order.size() - 1 : 0; i >= 1; --i) {
        const std::uint64_t j =
            slip == ShuffleSlip::sattolo ? random_below(key, 0, i, i) : random_u64(key, 0, i) % (i + 1);
        std::swap(order[i], order[static_cast<std::size_t>(j)]);
      }
    }
    return share_of(order, rank);
  }
};

class MeanOfMeansTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double share_weight(std::int64_t share, std::int64_t, int) const override { return share > 0 ? 1.0 : 0.0; }
};

class Slot32Trainer final : public Trainer {
 public:
  using Trainer::Trainer;
  // Each value in 32 bits, wrapping as two's complement does (without the undefined behaviour of an
  // overflowing int).
  Slot slot(int rank, std::int64_t step) const override {
    const auto i32 = [](std::int64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v)); };
    const std::int32_t share = i32(sampler().share_size(rank));
    const std::int32_t slice = i32((config().batch + world_size() - 1) / world_size());
    const std::int32_t begin = std::min(share, i32(std::int64_t{i32(step % steps_per_epoch())} * slice));
    Slot s;
    s.epoch = step / steps_per_epoch();
    s.begin = begin;
    s.end = std::min(share, i32(std::int64_t{begin} + slice));
    return s;
  }
};

class Float32CountTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double share_weight(std::int64_t share, std::int64_t global, int world) const override {
    return static_cast<double>(static_cast<float>(share * world)) / static_cast<double>(static_cast<float>(global));
  }
};

class DropOneSampleTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  Batch local_batch(std::int64_t step) const override {
    Batch b = Trainer::local_batch(step);
    if (rank() == world_size() - 1 && b.size > 0) b = b.slice(0, b.size - 1);
    return b;
  }
};

class SumOfMeansTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double micro_batch_weight(std::int64_t micro, std::int64_t) const override { return micro > 0 ? 1.0 : 0.0; }
};

class ResumeSkipsOptimizerTrainer final : public Trainer {
 public:
  using Trainer::Trainer;
  void restore(const Checkpoint& c) override {
    Checkpoint without_state = c;
    std::fill(without_state.optimizer_state.begin(), without_state.optimizer_state.end(), 0.0f);
    without_state.optimizer_steps = 0;
    Trainer::restore(without_state);
  }
};

class AllRanksWriter final : public RankZeroWriter {
 public:
  using RankZeroWriter::RankZeroWriter;

 protected:
  bool writes() const override { return true; }
};

class SideChannelLogWriter final : public RankZeroWriter {
 public:
  using RankZeroWriter::RankZeroWriter;
  void log(const nlohmann::json& record) override {
    RankZeroWriter::log(record);
    if (comm_.rank() == 0) return;
    // The bug: a rank keeps a log of its own with plain stdio, bypassing the writer.
    const std::string path = (log_path().empty() ? std::string("dpcheck-train.log") : log_path().string()) + ".rank" +
                             std::to_string(comm_.rank());
    if (std::FILE* f = std::fopen(path.c_str(), "a")) {
      std::fputs((record.dump() + "\n").c_str(), f);
      std::fclose(f);
    }
  }
};

// The trainer never moves the sampler on to the next epoch.
class EpochFrozenTrainer final : public Trainer {
 public:
  using Trainer::Trainer;
  Slot slot(int rank, std::int64_t step) const override {
    Slot s = Trainer::slot(rank, step);
    s.epoch = 0;
    return s;
  }
};

// Steps per epoch rounded down: a short last step is never taken.
class ShortLastStepDroppedTrainer final : public Trainer {
 public:
  using Trainer::Trainer;
  Slot slot(int rank, std::int64_t step) const override {
    const std::int64_t slice = (config().batch + world_size() - 1) / world_size();
    std::int64_t largest = 0;
    for (int r = 0; r < world_size(); ++r) largest = std::max(largest, sampler().share_size(r));
    const std::int64_t steps = std::max<std::int64_t>(1, largest / slice);
    const std::int64_t share = sampler().share_size(rank);
    Slot s;
    s.epoch = step / steps;
    s.begin = std::min(share, (step % steps) * slice);
    s.end = std::min(share, s.begin + slice);
    return s;
  }
};

// Resuming goes back to the first step of the checkpoint's epoch.
class ResumeRestartsEpochTrainer final : public Trainer {
 public:
  using Trainer::Trainer;
  void restore(const Checkpoint& c) override {
    Trainer::restore(c);
    set_next_step(c.step / steps_per_epoch() * steps_per_epoch());
  }
};

class LossMeanOfRankMeansTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double global_mean_loss(double local_loss_sum, std::int64_t local_examples, std::int64_t) override {
    double mean = local_examples > 0 ? local_loss_sum / static_cast<double>(local_examples) : 0.0;
    comm().host().allreduce(&mean, 1, DType::f64, ReduceOp::avg);
    return mean;
  }
};

// Wraps the correct optimizer and breaks its formula from the outside (host memory only).
class FormulaMutantOptimizer final : public Optimizer {
 public:
  FormulaMutantOptimizer(std::string_view mutant, std::unique_ptr<Optimizer> inner)
      : Optimizer(inner->config(), inner->size()), mutant_(mutant), inner_(std::move(inner)) {}
  MemorySpace memory_space() const override { return inner_->memory_space(); }
  void set_lr(double lr) override {
    Optimizer::set_lr(lr);
    inner_->set_lr(lr);
  }
  float* state() override { return inner_->state(); }
  void store_state(std::span<float> host) const override { inner_->store_state(host); }
  void load_state(std::span<const float> host, std::int64_t steps) override {
    inner_->load_state(host, steps);
    steps_ = steps;
  }
  void step(float* params, const float* grads) override {
    ++steps_;
    if (mutant_ == "momentum-dampened") {
      // buf = m buf + (1 - m) g is PyTorch's recurrence fed (1 - m) g.
      scaled_.assign(grads, grads + size_);
      for (float& v : scaled_) v *= static_cast<float>(1.0 - config_.momentum);
      inner_->step(params, scaled_.data());
      return;
    }
    // adam-step-count-stuck: the optimizer is told every step is its first.
    state_.resize(inner_->state_size());
    inner_->store_state(state_);
    inner_->load_state(state_, 0);
    inner_->step(params, grads);
  }

 private:
  std::string mutant_;
  std::unique_ptr<Optimizer> inner_;
  std::vector<float> scaled_, state_;
};

// Large calls leave their last element as this rank had it, as a bug in a backend's path for large
// messages would.
class LargeMessageTailCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const std::vector<std::size_t> t = inner_.algorithm_thresholds(dtype);
    if (t.empty() || count <= *std::max_element(t.begin(), t.end()) || count == 0)
      return inner_.allreduce(buf, count, dtype, op);
    const std::size_t esize = dtype_size(dtype);
    unsigned char* last = static_cast<unsigned char*>(buf) + (count - 1) * esize;
    std::vector<unsigned char> kept(esize);
    inner_.to_host(last, kept.data(), esize);
    inner_.allreduce(buf, count, dtype, op);
    inner_.from_host(kept.data(), last, esize);
  }
};

// Sums float32 and 16-bit all-reduces in the order the ranks arrive (after a little jitter, as real
// arrival times have): every rank receives the same bits, but two runs of the same training differ.
class ArrivalOrderCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if ((dtype != DType::f32 && !is_16bit_float(dtype)) || (op != ReduceOp::sum && op != ReduceOp::avg) || size() < 3)
      return inner_.allreduce(buf, count, dtype, op);
    static thread_local std::mt19937 jitter{std::random_device{}()};
    std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300));
    const auto stamp = static_cast<std::int64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const std::vector<std::int64_t> stamps = inner_.host().allgather_value(stamp);
    std::vector<std::size_t> order(stamps.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return stamps[a] != stamps[b] ? stamps[a] < stamps[b] : a < b; });
    if (dtype == DType::f32) reduce_in(order, static_cast<float*>(buf), count, op, dtype);
    else reduce_in(order, static_cast<std::uint16_t*>(buf), count, op, dtype);
  }

 private:
  template <class T>
  void reduce_in(const std::vector<std::size_t>& order, T* buf, std::size_t count, ReduceOp op, DType dtype) {
    const auto n = static_cast<std::size_t>(size());
    std::vector<T> mine(count), all(count * n);
    inner_.to_host(buf, mine.data(), count * sizeof(T));
    inner_.host().allgather(mine.data(), all.data(), count, dtype);
    sum_in_order(all.data(), count, order, op, dtype, mine.data());
    inner_.from_host(mine.data(), buf, count * sizeof(T));
  }
};

// Every rank finds the checkpoints that do not verify when it starts, and deletes them once training
// has begun (the bug: not rank 0 alone). The finding comes before the first step's all-reduce on every
// rank and the deleting after it, so no rank can delete a checkpoint before another has found it; and
// each deletion starts with a plain remove() of the manifest, a call the write audit sees even when
// another rank removed the file first. (Finding and deleting at once raced: a rank that listed the
// directory after rank 0 had cleaned it found nothing to delete, and the bug hid.)
class ResumeCleanupEveryRankWriter final : public RankZeroWriter {
 public:
  ResumeCleanupEveryRankWriter(Communicator& comm, const std::filesystem::path& checkpoint_dir,
                               const std::filesystem::path& log_path, int keep)
      : RankZeroWriter(comm, checkpoint_dir, log_path, keep) {
    std::error_code ec;
    if (checkpoint_dir.empty()) return;
    for (const auto& e : std::filesystem::directory_iterator(checkpoint_dir, ec))
      if (e.path().filename().string().rfind("step-", 0) == 0 && !verifies(e.path())) stale_.push_back(e.path());
  }

  void log(const nlohmann::json& record) override {
    std::error_code ec;
    for (const std::filesystem::path& dir : stale_) {
      std::filesystem::remove(dir / "manifest.json", ec);
      std::filesystem::remove_all(dir, ec);
    }
    stale_.clear();
    RankZeroWriter::log(record);
  }

 private:
  static bool verifies(const std::filesystem::path& dir) {
    try {
      std::ifstream f(dir / "manifest.json");
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      check_json_depth(text, (dir / "manifest.json").string());
      const nlohmann::json m = nlohmann::json::parse(text);
      const nlohmann::json& c = m.at("config");
      ModelConfig model;
      model.dims = parse_dims(c.at("model").get<std::string>());
      model.activation = parse_activation(c.at("activation").get<std::string>());
      model.loss = parse_loss(c.at("loss").get<std::string>());
      return read_checkpoint(dir, model).has_value();
    } catch (const std::exception&) {
      return false;
    }
  }

  std::vector<std::filesystem::path> stale_;
};

}  // namespace

MutantTraits mutant_traits(std::string_view name) {
  require_known_mutant(name);
  const MutantInfo* m = find_mutant(name);
  return m ? MutantTraits{m->engine, m->precision} : MutantTraits{};
}

void mutant_engine_spec(std::string_view mutant, EngineSpec& spec) {
  if (mutant == "bf16-accumulate") spec.accumulate_in_low_precision = true;
  // The GPU mutants swap in a broken bias-gradient kernel (kernels/bias_grad.cu).
  if (mutant == "bias-grad-atomic") spec.bias_grad = cuda::BiasGradKernel::atomic;
  if (mutant == "bias-grad-skip-tail") spec.bias_grad = cuda::BiasGradKernel::skip_tail;
}

bool mutant_trace_digest_prefix(std::string_view mutant) { return mutant == "trace-digest-prefix"; }

PluginRules mutant_plugin_rules(std::string_view mutant) {
  PluginRules rules;
  constexpr std::uint32_t all16 = DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16);
  if (mutant == "abi3-zero-op-mask-none")
    rules.ops = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t { return p.abi < 3 ? DPCHECK_ABI1_OPS : p.ops; };
  if (mutant == "abi1-handed-16bit")
    rules.dtypes = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
      return p.abi < 3 ? DPCHECK_ABI1_DTYPES | all16 : (p.dtypes ? p.dtypes : DPCHECK_ABI1_DTYPES);
    };
  if (mutant == "abi2-reads-past-table") {
    rules.dtypes = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
      if (p.abi == 1) return DPCHECK_ABI1_DTYPES;
      return p.dtypes ? p.dtypes : DPCHECK_ABI1_DTYPES;
    };
    rules.ops = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
      return p.abi < 2 || p.ops == 0 ? DPCHECK_ABI1_OPS : p.ops;
    };
  }
  if (mutant == "plugin-finalize-before-barrier") rules.finalize_before_barrier = true;
  return rules;
}

bool mutant_conform_same_inputs(std::string_view mutant) { return mutant == "conform-same-inputs-every-rank"; }

bool mutant_conform_avg_allowance_16bit(std::string_view mutant) { return mutant == "conform-avg-allowance-16bit"; }

bool mutant_conform_kernel_whole_tiles(std::string_view mutant) { return mutant == "conform-kernel-whole-tiles"; }

bool mutant_conform_replay_drops_world_size(std::string_view mutant) {
  return mutant == "conform-replay-drops-world-size";
}

void mutant_schedule_options(std::string_view mutant, reference::ScheduleOptions& options) {
  if (mutant == "schedule-halving-highest-bit-first") options.halving_from_lowest_bit = false;
}

void mutant_schedule_gamma(std::string_view mutant, const reference::ScheduleOptions& options, int world,
                           double& gamma) {
  if (mutant != "bound-ring-depth-as-tree" || options.schedule != reference::AllreduceSchedule::ring) return;
  reference::ScheduleOptions tree = options;
  tree.schedule = reference::AllreduceSchedule::tree;
  gamma = reference::schedule_gamma(tree, world);
}

void mutant_bound_options(std::string_view mutant, reference::BoundOptions& options) {
  if (mutant == "bound-without-kink-term") options.uncertain_kinks = false;
  if (mutant == "bound-three-times-loose") options.looseness = 3;
}

// The float32 all-reduce, then its result rounded to bf16.
class SilentBf16Communicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op);
    if (dtype != DType::f32) return;
    std::vector<float> host(count);
    to_host(buf, host.data(), count * sizeof(float));
    for (float& v : host) v = round_to_precision(v, Precision::bf16);
    from_host(host.data(), buf, count * sizeof(float));
  }
};

// A schedule that leaves out or misweighs some ranks' parts. What it computes comes to each rank's
// float32 buffer entering a correct sum or average times a factor of the rank and the element (0 for a
// part never added), so the wrapper scales its own buffer so and forwards the call: one rank at a time,
// as simulated ranks play them, at any N.
class MisweighingCommunicator : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    // Simulated ranks past their passes are one replica standing for all: no rank's part to change.
    const SimulatedComm* played = simulated();
    if (dtype != DType::f32 || (op != ReduceOp::sum && op != ReduceOp::avg) || (played && !played->passing()) ||
        !misweighs(count))
      return inner_.allreduce(buf, count, dtype, op);
    std::vector<float> host(count);
    to_host(buf, host.data(), count * sizeof(float));
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(host[i] * part(i, count));
    from_host(host.data(), buf, count * sizeof(float));
    inner_.allreduce(buf, count, dtype, op);
  }

 protected:
  static constexpr int kNode = 8;                       // ranks of a node, or of a group
  virtual bool misweighs(std::size_t count) const = 0;  // whether this rank's part changes in this call
  virtual double part(std::size_t i, std::size_t count) const = 0;
};

// Nodes of 8 ranks; the tree across nodes is built for the largest power of two not above their count,
// and the node it leaves over is never joined but through its first rank's link, which the tree lacks.
class TreeDropsRankCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t) const override {
    const int nodes = (size() + kNode - 1) / kNode;
    return nodes > 1 && !std::has_single_bit(static_cast<unsigned>(nodes)) && rank() == kNode * (nodes - 1);
  }
  double part(std::size_t, std::size_t) const override { return 0; }
};

// The mean of the group means: rank r's part weighs N / (groups * |its group|) of a true average's.
class GroupMeansCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t) const override { return size() % kNode != 0 && size() > kNode; }
  double part(std::size_t, std::size_t) const override {
    const int groups = (size() + kNode - 1) / kNode;
    const int mine = rank() / kNode == groups - 1 ? size() - kNode * (groups - 1) : kNode;
    return static_cast<double>(size()) / (static_cast<double>(groups) * mine);
  }
};

// Chunk c holds elements [c count / N, (c + 1) count / N); its reduction never adds rank c's part.
class RingChunkOffByOneCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t count) const override {
    return size() > 1 && chunk(rank() + 1, count) > chunk(rank(), count);
  }
  double part(std::size_t i, std::size_t count) const override {
    return i >= chunk(rank(), count) && i < chunk(rank() + 1, count) ? 0 : 1;
  }

 private:
  std::size_t chunk(int c, std::size_t count) const {
    const auto n = static_cast<unsigned long long>(size());
    return static_cast<std::size_t>(static_cast<unsigned long long>(c) * count / n);
  }
};

std::unique_ptr<Communicator> mutant_communicator(std::string_view mutant, Communicator& inner) {
  if (mutant == "allreduce-tree-drops-rank") return std::make_unique<TreeDropsRankCommunicator>(inner);
  if (mutant == "allreduce-hierarchical-group-means") return std::make_unique<GroupMeansCommunicator>(inner);
  if (mutant == "allreduce-ring-chunk-start-off-by-one") return std::make_unique<RingChunkOffByOneCommunicator>(inner);
  if (mutant == "allreduce-bf16-silently") return std::make_unique<SilentBf16Communicator>(inner);
  if (mutant == "allreduce-sum-no-average") return std::make_unique<SumNoAverage>(inner);
  if (mutant == "allreduce-rank-order") return std::make_unique<RankOrderSum>(inner);
  if (mutant == "allreduce-large-message-tail") return std::make_unique<LargeMessageTailCommunicator>(inner);
  if (mutant == "allreduce-arrival-order") return std::make_unique<ArrivalOrderCommunicator>(inner);
  if (mutant == "allreduce-corrupt-one") {
    Fault f;
    f.step = 1;
    f.rank = 0;
    f.element = std::numeric_limits<std::size_t>::max();  // the last: the output layer's last bias
    f.kind = FaultKind::keep_input;
    return fault_communicator(inner, f);
  }
  return nullptr;
}

std::unique_ptr<DistributedSampler> mutant_sampler(std::string_view mutant, const SamplerConfig& config) {
  if (mutant == "sampler-rank-seed") return std::make_unique<RankSeedSampler>(config);
  if (mutant == "sampler-off-by-one") return std::make_unique<OffByOneSampler>(config);
  if (mutant == "sampler-index-32bit") return std::make_unique<Index32Sampler>(config);
  if (mutant == "shuffle-sattolo") return std::make_unique<SlippedShuffleSampler<ShuffleSlip::sattolo>>(config);
  if (mutant == "shuffle-modulo") return std::make_unique<SlippedShuffleSampler<ShuffleSlip::modulo>>(config);
  return nullptr;
}

OptimizerConfig mutant_optimizer_config(std::string_view mutant, OptimizerConfig config, int rank, int world_size) {
  if (mutant == "optimizer-rank-perturb" && world_size > 1 && rank == world_size - 1)
    config.lr = std::nextafter(static_cast<float>(config.lr), INFINITY);  // one float32 ULP
  return config;
}

namespace {

template <class T> std::unique_ptr<Trainer> trainer_of(const TrainConfig& config, Communicator& comm, Engine& engine,
                                                       Optimizer& optimizer, const DistributedSampler& sampler,
                                                       const Dataset& data) {
  return std::make_unique<T>(config, comm, engine, optimizer, sampler, data);
}

// The mutants that break the trainer, and the trainer each makes.
// Loss-scaler mutants (the precision fp16, where the scaler is on by default).
class ScalerLocalSkipTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  bool agree_found_inf(bool local_inf, bool) override { return local_inf; }
};

class PerRankScaleTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  float applied_loss_scale() const override { return std::ldexp(scaler().scale(), rank()); }
};

// Bucketing mutants (properties/bucketing.cpp): they bite only with --bucket-mb.
class BucketOffByOneTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  std::vector<GradientBucket> gradient_buckets(std::size_t cap) const override {
    std::vector<GradientBucket> buckets = Trainer::gradient_buckets(cap);
    for (GradientBucket& b : buckets) b.hi = std::max(b.lo, b.hi - 1);
    return buckets;
  }
};

class BucketBeforeReadyTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  bool bucket_ready(const GradientBucket& b, int completed) const override { return completed <= b.ready_layer + 1; }
};

// GradScaler's update written with the count compared before it is incremented.
class ScalerGrowthLateTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  void update_loss_scaler(bool found_inf) override {
    if (found_inf || !scaler().enabled()) return Trainer::update_loss_scaler(found_inf);
    LossScalerState s = scaler().state();
    if (s.growth_tracker++ == config().loss_scaling.growth_interval) {
      s.scale = std::min(s.scale * static_cast<float>(config().loss_scaling.growth_factor), 0x1p64f);
      s.growth_tracker = 0;
    }
    scaler().restore(s);
  }
};

// A backoff that forgets to start the count of good steps again.
class ScalerBackoffKeepsCountTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  void update_loss_scaler(bool found_inf) override {
    if (!found_inf || !scaler().enabled()) return Trainer::update_loss_scaler(found_inf);
    LossScalerState s = scaler().state();
    s.scale = std::max(s.scale * static_cast<float>(config().loss_scaling.backoff_factor), 0x1p-24f);
    ++s.skipped;
    scaler().restore(s);
  }
};

class WarmupOneStepEarlyTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double warmup_lr(std::int64_t step) const override { return config().lr_at(step + 1, world_size()); }
};

class WarmupForgetsScalingTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  double warmup_lr(std::int64_t step) const override {
    return step >= config().warmup_steps ? config().optimizer.lr : config().lr_at(step, world_size());
  }
};

class NoScalingTrainer final : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  float applied_loss_scale() const override { return 1.0f; }
};

constexpr std::pair<std::string_view, decltype(&trainer_of<Trainer>)> kTrainerMutants[] = {
    {"scaler-local-skip", trainer_of<ScalerLocalSkipTrainer>},
    {"unscale-after-allreduce", trainer_of<PerRankScaleTrainer>},
    {"fp16-no-scaling", trainer_of<NoScalingTrainer>},
    {"bucket-boundary-off-by-one", trainer_of<BucketOffByOneTrainer>},
    {"bucket-reduced-before-ready", trainer_of<BucketBeforeReadyTrainer>},
    {"mean-of-means", trainer_of<MeanOfMeansTrainer>},
    {"share-weight-float32", trainer_of<Float32CountTrainer>},
    {"trainer-slot-32bit", trainer_of<Slot32Trainer>},
    {"drop-one-sample", trainer_of<DropOneSampleTrainer>},
    {"accumulate-sum-of-means", trainer_of<SumOfMeansTrainer>},
    {"resume-skips-optimizer-state", trainer_of<ResumeSkipsOptimizerTrainer>},
    {"sampler-epoch-frozen", trainer_of<EpochFrozenTrainer>},
    {"short-last-step-dropped", trainer_of<ShortLastStepDroppedTrainer>},
    {"resume-restarts-epoch", trainer_of<ResumeRestartsEpochTrainer>},
    {"loss-mean-of-rank-means", trainer_of<LossMeanOfRankMeansTrainer>},
    {"scaler-growth-late", trainer_of<ScalerGrowthLateTrainer>},
    {"scaler-backoff-keeps-count", trainer_of<ScalerBackoffKeepsCountTrainer>},
    {"warmup-one-step-early", trainer_of<WarmupOneStepEarlyTrainer>},
    {"warmup-forgets-scaling", trainer_of<WarmupForgetsScalingTrainer>},
};

}  // namespace

std::unique_ptr<Trainer> mutant_trainer(std::string_view mutant, const TrainConfig& config, Communicator& comm,
                                        Engine& engine, Optimizer& optimizer, const DistributedSampler& sampler,
                                        const Dataset& data) {
  if (mutant == "rank-nan-gradient") {
    Fault f;
    f.step = -1;  // every step from 1 on
    f.rank = comm.size() - 1;
    f.element = 0;
    f.kind = FaultKind::nan;
    return fault_trainer(f, config, comm, engine, optimizer, sampler, data);
  }
  for (const auto& [name, make] : kTrainerMutants)
    if (name == mutant) return make(config, comm, engine, optimizer, sampler, data);
  return nullptr;
}

std::unique_ptr<Optimizer> mutant_optimizer(std::string_view mutant, std::unique_ptr<Optimizer> optimizer) {
  const OptimizerKind kind = optimizer->config().kind;
  if ((mutant == "momentum-dampened" && kind == OptimizerKind::momentum) ||
      (mutant == "adam-step-count-stuck" && kind == OptimizerKind::adam))
    return std::make_unique<FormulaMutantOptimizer>(mutant, std::move(optimizer));
  return optimizer;
}

std::unique_ptr<RankZeroWriter> mutant_writer(std::string_view mutant, Communicator& comm,
                                              const std::filesystem::path& checkpoint_dir,
                                              const std::filesystem::path& log_path, int keep) {
  if (mutant == "writer-all-ranks") return std::make_unique<AllRanksWriter>(comm, checkpoint_dir, log_path, keep);
  if (mutant == "side-channel-log") return std::make_unique<SideChannelLogWriter>(comm, checkpoint_dir, log_path, keep);
  if (mutant == "resume-cleanup-every-rank")
    return std::make_unique<ResumeCleanupEveryRankWriter>(comm, checkpoint_dir, log_path, keep);
  return nullptr;
}

void register_mutants() {
  static const MutantTable table{.require = &mutant_traits,
                                 .engine_spec = &mutant_engine_spec,
                                 .communicator = &mutant_communicator,
                                 .optimizer_config = &mutant_optimizer_config,
                                 .optimizer = &mutant_optimizer,
                                 .sampler = &mutant_sampler,
                                 .trainer = &mutant_trainer,
                                 .writer = &mutant_writer,
                                 .trace_digest_prefix = &mutant_trace_digest_prefix};
  register_mutant_table(table);
}

}  // namespace dpcheck
