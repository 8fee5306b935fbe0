// The backend table (src/target/backends.hpp), walked row by row: every row validates with its engine and is
// refused with any other in one line naming both, the defaults are rows of their engines, each row's
// memory space is its engine's, how its ranks run (threads, a launcher's processes, or either) decides
// what happens with and without a launcher, the help texts list every row, and the rows that can run
// here run ranks whose communicators say they are that backend. Last, a row registered at run time (what
// a user's plugin will be) is validated, listed, replayed and run like the built-in ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <set>
#include <string>

#include "mutants/mutants.hpp"
#include "properties/properties.hpp"
#include "properties/runner.hpp"
#include "src/comm/collective.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/target/backends.hpp"
#include "src/target/target.hpp"

namespace dpcheck {
namespace {

// The message of the UsageError that fn throws, or "" (and a test failure) when it throws none.
template <class Fn> std::string usage_error(Fn fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Why this machine cannot run the engine, or "" when it can.
std::string why_not_here(const EngineRow& engine) {
  if (!engine.require) return {};
  try {
    engine.require();
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

// A target of this row, with a launcher's world where the row needs one.
Target target_of(const Backend& b, LocalWorld& launcher) {
  Target t;
  t.engine = &find_engine(b.engine);
  t.backend = &b;
  if (b.needs_launcher()) t.process_world = &launcher.comm(0);
  return t;
}

TEST(Backends, EveryRowValidatesWithItsEngineAndIsRefusedWithAnyOther) {
  LocalWorld launcher(2);
  ASSERT_GE(backends().size(), 4u);
  for (const Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    EXPECT_EQ(&backend_for(b.engine, b.name), &b);
    const std::string why = why_not_here(find_engine(b.engine));
    if (why.empty()) EXPECT_NO_THROW(validate_target(target_of(b, launcher)));
    else  // the engine's own reason (no device), never a complaint about the pair
      EXPECT_EQ(usage_error([&] { validate_target(target_of(b, launcher)); }), why);
    for (const EngineRow& other : engines()) {
      if (other.name == b.engine) continue;
      Target t = target_of(b, launcher);
      t.engine = &other;
      const std::string message = usage_error([&] { validate_target(t); });
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_TRUE(contains(message, "engine " + std::string(other.name))) << message;
      EXPECT_TRUE(contains(message, "'" + b.name + "'")) << message;
      EXPECT_TRUE(contains(message, "--engine " + b.engine)) << message;
      for (const Backend& mate : backends())
        if (mate.engine == other.name) {
          EXPECT_TRUE(contains(message, mate.name)) << message;
        }
    }
  }
}

TEST(Backends, UnknownNamesAreRefusedListingTheRows) {
  const std::string engine = usage_error([] { backend_for("quantum", "local"); });
  EXPECT_EQ(engine, "unknown engine 'quantum' (choose cpu or cuda)");
  const std::string comm = usage_error([] { backend_for("cpu", "carrier-pigeon"); });
  EXPECT_TRUE(contains(comm, "unknown --comm 'carrier-pigeon'")) << comm;
  for (const Backend& b : backends()) EXPECT_TRUE(contains(comm, b.name)) << comm;
  for (const EngineRow& e : engines()) EXPECT_TRUE(contains(comm, "the " + std::string(e.name) + " engine")) << comm;
  EXPECT_EQ(find_backend("carrier-pigeon"), nullptr);
}

TEST(Backends, EveryEngineHasOneDefaultRowAndTheTargetStartsThere) {
  for (const EngineRow& e : engines()) {
    const auto defaults = std::count_if(backends().begin(), backends().end(),
                                        [&](const Backend& b) { return b.engine == e.name && b.engine_default; });
    EXPECT_EQ(defaults, 1) << e.name;
    const Backend& b = default_backend(e);
    EXPECT_EQ(b.engine, e.name);
    EXPECT_TRUE(b.engine_default);
  }
  EXPECT_EQ(default_engine(), engines()[0].name);
  const Target t;
  EXPECT_EQ(t.engine->name, "cpu");
  EXPECT_EQ(t.backend->name, "local");
  EXPECT_EQ(&default_backend(find_engine("cuda")), find_backend("cuda-local"));
}

// A target by name resolves to the rows once, and back to the same names; an empty --comm is the
// engine's default; a name that no row has, or two that do not go together, is refused as the options'
// validation refuses it.
TEST(Backends, ARecordResolvesToItsRowsAndBack) {
  const Target plain = resolve_target({});
  EXPECT_EQ(plain.engine, &default_engine_row());
  EXPECT_EQ(plain.backend, &default_backend(default_engine_row()));
  EXPECT_EQ(resolve_target({.engine = "cuda"}).backend, find_backend("cuda-local"));
  const TargetRecord simulated{.engine = "cpu",
                               .comm = "simulated",
                               .kernels = "",
                               .mutant = "allreduce-rank-order",
                               .tf32 = false,
                               .precision = Precision::bf16,
                               .timeout = std::chrono::milliseconds(1234)};
  const Target t = resolve_target(simulated);
  EXPECT_EQ(t.backend, find_backend("simulated"));
  EXPECT_EQ(target_record(t), simulated);
  EXPECT_EQ(target_from_json(target_to_json(t)).comm, "simulated");
  EXPECT_EQ(usage_error([] { resolve_target({.engine = "quantum"}); }),
            "unknown engine 'quantum' (choose cpu or cuda)");
  EXPECT_TRUE(contains(usage_error([] { resolve_target({.comm = "carrier-pigeon"}); }), "unknown --comm"));
  EXPECT_TRUE(contains(usage_error([] { resolve_target({.engine = "cuda", .comm = "local"}); }), "--engine cpu"));
}

// Every engine row builds its engine and optimizer, says what it can do consistently, and is what the
// messages and the mutant table name: no engine is named outside the table.
TEST(Backends, EngineRowsBuildTheirPartsAndAreWhatEveryoneElseNames) {
  for (const EngineRow& e : engines()) {
    SCOPED_TRACE(e.name);
    EXPECT_NE(e.make_engine, nullptr);
    EXPECT_NE(e.make_optimizer, nullptr);
    EXPECT_TRUE(!e.low_precision_with_kernels || e.low_precision);
    EXPECT_TRUE(!e.products_may_truncate || e.low_precision);
  }
  EXPECT_EQ(engine_for_memory(MemorySpace::host).name, "cpu");
  EXPECT_EQ(engine_for_memory(MemorySpace::device).name, "cuda");
  EXPECT_EQ(engines_with(&EngineRow::low_precision), "the cpu and cuda engines");
  EXPECT_EQ(engines_with(&EngineRow::tf32), "the cuda engine");
  EXPECT_EQ(process_backend(find_engine("cpu")), find_backend("mpi"));
  EXPECT_EQ(process_backend(find_engine("cuda")), find_backend("nccl"));
  EXPECT_EQ(simulated_backend(find_engine("cpu")), find_backend("simulated"));
  EXPECT_EQ(simulated_backend(find_engine("cuda")), nullptr);
  for (const MutantInfo& m : mutants()) {
    if (!m.engine.empty()) {
      EXPECT_NO_THROW((void)find_engine(m.engine)) << m.name;
    }
  }
  // The default engine runs on any machine: its row builds a working engine and optimizer here.
  const Target t;
  const ModelConfig model{{4, 3, 2}, Activation::relu, Loss::mse};
  const std::unique_ptr<Engine> engine = make_engine(t, model);
  EXPECT_EQ(engine->name(), t.engine->name);
  EXPECT_EQ(engine->param_count(), ParamLayout(model).size());
  OptimizerConfig sgd;
  EXPECT_NE(make_optimizer(t, sgd, engine->param_count(), 0, 1), nullptr);
}

TEST(Backends, EveryRowCarriesItsEnginesMemoryAndCanRun) {
  std::set<std::string> names;
  for (const Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    EXPECT_TRUE(names.insert(b.name).second) << "two rows named " << b.name;
    EXPECT_EQ(b.memory, find_engine(b.engine).memory);
    EXPECT_FALSE(b.help.empty());
    EXPECT_TRUE(b.ranks_as_threads() || b.may_run_under_launcher());
    if (b.may_run_under_launcher()) {
      EXPECT_EQ(b.launch_prefix(3), b.launcher + " 3 ");
      EXPECT_FALSE(b.launcher.empty());
    } else {
      EXPECT_EQ(b.launch_prefix(3), "");
    }
  }
  // How the built-in rows run their ranks, as the README describes them.
  EXPECT_TRUE(find_backend("local")->ranks_as_threads() && !find_backend("local")->may_run_under_launcher());
  EXPECT_TRUE(find_backend("mpi")->needs_launcher() && find_backend("mpi")->may_run_under_launcher());
  EXPECT_TRUE(find_backend("cuda-local")->ranks_as_threads() && !find_backend("cuda-local")->may_run_under_launcher());
  EXPECT_TRUE(find_backend("nccl")->ranks_as_threads() && find_backend("nccl")->may_run_under_launcher());
  EXPECT_EQ(find_backend("mpi")->launch_prefix(4), "mpirun -np 4 ");
}

// A launcher's world is taken by the rows that may run under one, required by those that need one, and
// refused (when it has several processes) by those whose ranks are threads, naming the rows to use.
TEST(Backends, TheLauncherDecidesThreadsOrProcessesByTheRow) {
  LocalWorld one(1), two(2);
  for (const Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    if (b.needs_launcher()) {
      const std::string m = usage_error([&] { world_of_processes(b, nullptr); });
      EXPECT_EQ(m, "--comm " + b.name + " runs one process per rank: start it with a launcher, e.g. " +
                       b.launch_prefix(4) + "dpcheck ...");
    } else {
      EXPECT_EQ(world_of_processes(b, nullptr), nullptr);
    }
    if (b.may_run_under_launcher()) {
      EXPECT_EQ(world_of_processes(b, &one.comm(0)), &one.comm(0));
      EXPECT_EQ(world_of_processes(b, &two.comm(0)), &two.comm(0));
    } else {
      EXPECT_EQ(world_of_processes(b, &one.comm(0)), nullptr);
      const std::string m = usage_error([&] { world_of_processes(b, &two.comm(0)); });
      EXPECT_TRUE(contains(m, "started by a launcher with 2 processes but --comm is " + b.name)) << m;
      EXPECT_TRUE(contains(m, ": add --comm ")) << m;
      for (const Backend& instead : backends())
        if (instead.engine == b.engine && instead.may_run_under_launcher()) {
          EXPECT_TRUE(contains(m, " " + instead.name)) << m;
        }
    }
  }
}

TEST(Backends, HelpTextsListEveryRow) {
  const std::string engine = engine_option_help();
  for (const EngineRow& e : engines())
    EXPECT_TRUE(contains(engine, std::string(e.name) + " (" + std::string(e.help))) << engine;
  EXPECT_TRUE(contains(engine, "cpu (Eigen, float32; default)")) << engine;
  const std::string comm = comm_option_help();
  for (const Backend& b : backends()) {
    EXPECT_TRUE(contains(comm, b.name + " (" + b.help + (b.engine_default ? "; default)" : ")"))) << comm;
  }
  EXPECT_EQ(comm.find('\n'), std::string::npos);
}

TEST(Backends, ThresholdsComeFromTheRow) {
  Target local;
  EXPECT_EQ(comm_thresholds(local, 4), host_reduction_thresholds(4, DType::f32));
  EXPECT_FALSE(comm_thresholds(local, 4).empty());
  LocalWorld launcher(3);
  Target mpi;
  mpi.backend = find_backend("mpi");
  mpi.process_world = &launcher.comm(0);
  EXPECT_EQ(comm_thresholds(mpi, 3), launcher.comm(0).algorithm_thresholds(DType::f32));
}

// Every row that can run its ranks as threads here does: each rank's communicator names the row, lives
// in its memory space, and reduces across the world. (A GPU row without a device is skipped by name.)
TEST(Backends, EveryRowThatRunsHereRunsItsRanksAsThreads) {
  std::string skipped;
  for (const Backend& b : backends()) {
    if (!b.ranks_as_threads()) continue;
    if (const std::string why = why_not_here(find_engine(b.engine)); !why.empty()) {
      skipped += " " + b.name + " (" + why + ")";
      continue;
    }
    SCOPED_TRACE(b.name);
    // NCCL refuses two ranks on one GPU; one rank still shows the row's communicator.
    const int n = b.memory == MemorySpace::host ? 3 : 1;
    // A simulated world is one replica on one thread, speaking for every rank as rank 0: its sum is N
    // copies of rank 0's value.
    const int threads = b.simulated ? 1 : n;
    const std::int64_t sum = b.simulated ? n : n * (n + 1) / 2;
    std::atomic<int> ranks{0}, right{0};
    b.run_threads(
        n,
        [&](Communicator& c) {
          ++ranks;
          std::int64_t v = c.rank() + 1;
          c.host().allreduce(&v, 1, DType::i64, ReduceOp::sum);
          if (c.backend() == b.name && c.memory_space() == b.memory && c.size() == n && v == sum) ++right;
        },
        Communicator::default_timeout);
    EXPECT_EQ(ranks, threads);
    EXPECT_EQ(right, threads);
  }
  if (!skipped.empty()) std::cout << "not run here:" << skipped << "\n";
}

// The launcher's own world is the mpi row's communicator: its rank runs on it unchanged.
TEST(Backends, TheMpiRowRunsOnTheLaunchersWorld) {
  LocalWorld launcher(1);
  const Communicator* seen = nullptr;
  find_backend("mpi")->run_processes(launcher.comm(0), [&](Communicator& c) { seen = &c; });
  EXPECT_EQ(seen, &launcher.comm(0));
}

// What a user's communicator plugin will be: one more row. Registered here at run time, it validates,
// shows in the help, replays with its --comm, and carries the properties through run_world.
class Relay final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  std::string_view backend() const override { return "test-relay"; }
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    ++calls;
    inner_.allreduce(buf, count, dtype, op);
  }
  static inline std::atomic<int> calls{0};
};

Backend relay_row() {
  Backend row;
  row.name = "test-relay";
  row.engine = "cpu";
  row.memory = MemorySpace::host;
  row.help = "the local backend relayed, as a plugin's row";
  row.run_threads = [](int n, const RankFunction& fn, std::chrono::milliseconds timeout) {
    run_local(
        n,
        [&](Communicator& inner) {
          Relay relay(inner);
          fn(relay);
        },
        timeout);
  };
  return row;
}

TEST(BackendsRegistered, ARowAddedAtRunTimeIsUsedEverywhere) {
  const std::size_t before = backends().size();
  const Backend* local = find_backend("local");
  const Backend& row = register_backend(relay_row());
  EXPECT_EQ(backends().size(), before + 1);
  EXPECT_EQ(&backends().back(), &row);
  EXPECT_EQ(find_backend("local"), local);  // earlier rows stay where they are
  EXPECT_EQ(&default_backend(find_engine("cpu")), local);

  Target t;
  t.backend = find_backend("test-relay");
  t.world_size = 3;
  EXPECT_NO_THROW(validate_target(t));
  EXPECT_TRUE(contains(comm_option_help(), "test-relay (the local backend relayed, as a plugin's row)"));
  EXPECT_EQ(reproduce_command(t, {}, "p:c:0"),
            "dpcheck verify --comm test-relay --precision fp32 --allreduce-dtype fp32 --world-size 3 "
            "--reproduce 'p:c:0'");
  EXPECT_TRUE(contains(usage_error([] { backend_for("cuda", "test-relay"); }), "--engine cpu"));

  Relay::calls = 0;
  RunOptions options;
  options.cases = 5;
  options.seed = 3;
  const PropertyResult r = run_property(find_property("replicas_bitwise_synchronized"), t, options);
  EXPECT_TRUE(r.passed) << r.failure;
  EXPECT_GT(Relay::calls, 0);
  // A mutant wraps the row's communicator as it wraps a built-in one's.
  t.mutant = "allreduce-rank-order";
  EXPECT_FALSE(run_property(find_property("replicas_bitwise_synchronized"), t, options).passed);
}

TEST(BackendsRegistered, ABadRowIsRefusedInOneLine) {
  const auto refused = [](Backend row, const std::string& word) {
    const std::string m = usage_error([&] { register_backend(std::move(row)); });
    EXPECT_TRUE(contains(m, word)) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  const std::size_t before = backends().size();
  Backend taken = relay_row();
  taken.name = "local";
  refused(taken, "exists already");
  Backend engine = relay_row();
  engine.name = "test-quantum";
  engine.engine = "quantum";
  refused(engine, "unknown engine 'quantum'");
  Backend memory = relay_row();
  memory.name = "test-device";
  memory.memory = MemorySpace::device;
  refused(memory, "host memory");
  Backend idle = relay_row();
  idle.name = "test-idle";
  idle.run_threads = nullptr;
  refused(idle, "no way to run");
  Backend unlaunched = relay_row();
  unlaunched.name = "test-unlaunched";
  unlaunched.run_processes = [](Communicator& world, const RankFunction& fn) { fn(world); };
  refused(unlaunched, "names none");
  Backend second_default = relay_row();
  second_default.name = "test-default";
  second_default.engine_default = true;
  refused(second_default, "default communicator already, local");
  EXPECT_EQ(backends().size(), before);
}

}  // namespace
}  // namespace dpcheck
