#include "properties/properties.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <mutex>
#include <unistd.h>
#include <sstream>

#include "reference/bound.hpp"
#include "src/audit.hpp"
#include "src/mpi_comm.hpp"
#include "src/error.hpp"

namespace dpcheck {

namespace {

// A property's verdict must be the same on every process of a process backend, so that all follow
// the same shrink path.
bool agree(const Target& target, bool verdict) {
  return target.process_world ? target.process_world->all(verdict) : verdict;
}

// Fails the current case with a message of our own (RC_FAIL would prefix it with its own location).
[[noreturn]] void fail_case(const std::string& message) {
  throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, message);
}

// Whether this rank records the results of a world: rank 0's thread, or every process.
bool records(const Target& target, const Communicator& comm) { return target.process_world || comm.rank() == 0; }

ScenarioSpace space_for(const Target& target) {
  ScenarioSpace s;
  s.world_size = target.world_size;
  return s;
}

void record_size(CaseStats& stats, const Scenario& s) {
  stats.last_failure.examples = s.train.batch;
  stats.last_failure.world_size = s.world_size;
  stats.last_failure.layers = s.train.model.layers();
  stats.last_failure.widest = *std::max_element(s.train.model.dims.begin(), s.train.model.dims.end());
}

std::string explain(std::string_view path, const reference::Comparison& c, const ParamLayout& layout,
                    std::int64_t roundings) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%.*s gradient exceeds the rounding bound at %s: float32 %.9g, float64 reference %.17g, "
                "error %.3g, bound %.3g (gamma_%lld), error ratio %.3g",
                static_cast<int>(path.size()), path.data(), layout.describe_element(c.worst).c_str(), c.worst_value,
                c.worst_reference, std::abs(c.worst_value - c.worst_reference), c.worst_bound,
                static_cast<long long>(roundings), c.max_ratio);
  return buf;
}

void gradient_body(const Target& target, CaseStats& stats, const ScenarioSpace& space) {
  const Scenario s = *gen_scenario(space);
  const GradientOutcome o = check_sharded_gradient(s, target);
  ++stats.cases;
  stats.has_error_ratio = true;
  stats.max_error_ratio = std::max({stats.max_error_ratio, o.sharded_ratio, o.whole_ratio});
  RC_CLASSIFY(o.share_ratio > 1.0, "one share alone lies outside the bound");
  RC_CLASSIFY(o.uncertain_units > 0, "a ReLU within rounding of its kink");
  if (!agree(target, o.passed)) {
    record_size(stats, s);
    fail_case(o.message.empty() ? "another rank found the gradient outside the bound" : o.message);
  }
}

void gradient_average_body(const Target& target, CaseStats& stats) {
  gradient_body(target, stats, space_for(target));
}

void accumulation_body(const Target& target, CaseStats& stats) {
  ScenarioSpace space = space_for(target);
  space.accumulate = true;
  gradient_body(target, stats, space);
}

void uneven_body(const Target& target, CaseStats& stats) {
  ScenarioSpace space = space_for(target);
  space.uneven_only = true;
  gradient_body(target, stats, space);
}

void replicas_body(const Target& target, CaseStats& stats) {
  const Scenario s = *gen_scenario(space_for(target));
  const ReplicaOutcome o = check_replica_sync(s, target);
  ++stats.cases;
  RC_CLASSIFY(!o.parameters_moved, "parameters never moved");
  if (!agree(target, o.passed)) {
    record_size(stats, s);
    fail_case(o.message.empty() ? "another rank found the replicas out of sync" : o.message);
  }
}

// A training scenario and the step after which it is checkpointed and resumed.
struct ResumeScenario {
  Scenario scenario;
  int stop_at = 1;
};

void showValue(const ResumeScenario& r, std::ostream& os) {
  os << r.scenario.describe() << " | resume after step " << r.stop_at;
}

void resume_body(const Target& target, CaseStats& stats) {
  ScenarioSpace space = space_for(target);
  space.min_steps = 2;
  const ResumeScenario rs = *rc::gen::exec([space] {
    ResumeScenario r;
    r.scenario = *gen_scenario(space);
    r.stop_at = *rc::gen::inRange(1, r.scenario.train.steps);
    return r;
  });
  const Scenario& s = rs.scenario;
  const int stop_at = rs.stop_at;
  const ResumeOutcome o = check_checkpoint_resume(s, stop_at, target);
  ++stats.cases;
  RC_CLASSIFY(s.train.optimizer.kind != OptimizerKind::sgd, "optimizer with state");
  if (!agree(target, o.passed)) {
    record_size(stats, s);
    fail_case(o.message.empty() ? "another rank's resumed state differs" : o.message);
  }
}

void rank0_writes_body(const Target& target, CaseStats& stats) {
  ScenarioSpace space = space_for(target);
  space.min_world_size = 2;  // processes: a few, each costs a start-up
  space.max_world_size = 4;
  space.max_batch = 64;
  const Scenario s = *gen_scenario(space);
  // One process launches and audits the training run; with processes of our own, rank 0 does it and
  // tells the others the verdict.
  WriteAuditOutcome o;
  if (!target.process_world || target.process_world->rank() == 0) o = check_rank0_writes(s, target);
  if (target.process_world) {
    std::int64_t verdict[2] = {o.passed ? 1 : 0, o.rank0_files};
    target.process_world->broadcast(verdict, 2, DType::i64, 0);
    o.passed = verdict[0] == 1;
    o.rank0_files = verdict[1];
  }
  ++stats.cases;
  RC_TAG(std::string("rank 0 wrote ") + (o.rank0_files >= 10 ? "10 or more" : std::to_string(o.rank0_files)) + " files");
  if (!o.passed) {
    record_size(stats, s);
    fail_case(o.message.empty() ? "rank 0 found a write by another rank" : o.message);
  }
}

std::string rank0_writes_unavailable(const Target&) {
  if (!mpi_available()) return "this build has no MPI backend, and the audit needs separate processes";
  if (find_mpi_launcher().empty()) return "no mpirun or mpiexec on PATH";
  return "";
}

void sampler_body(const Target& target, CaseStats& stats) {
  const SamplerScenario s = *gen_sampler_scenario(target.process_world ? target.process_world->size() : target.world_size);
  const SamplerOutcome o = check_sampler(s, target);
  ++stats.cases;
  RC_CLASSIFY(s.sampler.dataset_size < s.sampler.world_size, "fewer examples than ranks");
  if (!agree(target, o.passed)) {
    stats.last_failure = {s.sampler.dataset_size, s.sampler.world_size, 0, 0};
    fail_case(o.message.empty() ? "another rank found the shares wrong" : o.message);
  }
}

constexpr std::array<PropertyDef, 7> kProperties{{
    {"gradient_average_matches_whole_batch",
     "the all-reduced average of the shard gradients equals the whole-batch gradient within float32 rounding",
     gradient_average_body},
    {"replicas_bitwise_synchronized", "after every step every replica's parameters and optimizer state are bitwise identical",
     replicas_body},
    {"sampler_shards_disjoint", "the sampler's shares are disjoint, cover the data and agree on every rank", sampler_body},
    {"accumulation_matches_whole_batch",
     "gradient accumulation over micro-batches equals the whole-batch gradient within float32 rounding",
     accumulation_body},
    {"uneven_shares_match_whole_batch",
     "with shares of different sizes, the weighted average equals the whole-batch gradient within float32 rounding",
     uneven_body},
    {"only_rank0_writes",
     "in multi-process training with checkpoints and a log, no rank but 0 writes a file (checked by the write "
     "audit at the system-call level)",
     rank0_writes_body, 10, rank0_writes_unavailable},
    {"checkpoint_resume_bitwise",
     "training t steps, checkpointing, resuming from the files and continuing to T gives the same bits as T "
     "steps straight",
     resume_body},
}};

}  // namespace

std::span<const PropertyDef> properties() { return kProperties; }

const PropertyDef& find_property(std::string_view name) {
  for (const PropertyDef& p : kProperties)
    if (p.name == name) return p;
  std::string names;
  for (const PropertyDef& p : kProperties) names += (names.empty() ? "" : ", ") + std::string(p.name);
  throw UsageError("unknown property '" + std::string(name) + "' (known: " + names + ")");
}

GradientOutcome check_sharded_gradient(const Scenario& s, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::vector<float> averaged;
  std::vector<std::int64_t> whole_indices;
  std::int64_t largest_micro = 0, share0 = 0;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    rt.trainer->compute_gradient(0);
    if (!records(target, comm)) return;
    averaged.resize(rt.engine->param_count());
    rt.engine->store_grads(averaged);
    whole_indices = rt.trainer->global_indices(0);
    largest_micro = rt.trainer->largest_micro_batch(0);
    const Trainer::Slot slot0 = rt.trainer->slot(0, 0);
    share0 = slot0.end - slot0.begin;
  });

  const Batch whole = data.gather(whole_indices);
  const std::vector<float> params = init_params(c.model, c.seed);
  const reference::BoundOptions options = bound_options(target);
  const reference::GradientBound bound = reference::gradient_bound(c.model, params, whole, options);
  const ParamLayout layout(c.model);
  GradientOutcome o;
  o.uncertain_units = bound.uncertain_units;

  const std::int64_t m_sharded = reference::sharded_roundings(largest_micro, c.accumulate, s.world_size, options);
  const reference::Comparison sharded = reference::compare(averaged, bound, m_sharded);
  o.sharded_ratio = sharded.max_ratio;

  // The same engine on the whole batch at once, and on rank 0's share alone: the share is a different
  // batch, so it lands outside the bound unless the check is too loose to tell batches apart.
  std::unique_ptr<Engine> engine = make_engine(target, c.model);
  engine->load_params(params);
  std::vector<float> g(engine->param_count());
  engine->forward_backward(whole, 1.0f, false);
  engine->store_grads(g);
  const std::int64_t m_whole = reference::whole_batch_roundings(whole.size, options);
  const reference::Comparison whole_cmp = reference::compare(g, bound, m_whole);
  o.whole_ratio = whole_cmp.max_ratio;
  if (share0 > 0) {
    engine->forward_backward(whole.slice(0, share0), 1.0f, false);
    engine->store_grads(g);
    o.share_ratio = reference::compare(g, bound, m_sharded).max_ratio;
  }

  o.passed = sharded.passed() && whole_cmp.passed();
  if (!sharded.passed()) o.message = explain("all-reduced", sharded, layout, m_sharded);
  else if (!whole_cmp.passed()) o.message = explain("whole-batch", whole_cmp, layout, m_whole);
  return o;
}

ReplicaOutcome check_replica_sync(const Scenario& s, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  ReplicaOutcome o;
  std::mutex mu;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    const std::size_t n = rt.engine->param_count();
    std::vector<float> initial(n);
    rt.engine->store_params(initial);
    bool hash_says_synced = true;
    std::string first_report;
    for (int step = 0; step < c.steps && hash_says_synced; ++step) {
      const StepResult r = rt.trainer->step();
      if (!r.replicas.synchronized) {
        hash_says_synced = false;
        first_report = r.replicas.describe();
      }
    }
    // Independently of the hashes: gather everyone's final parameters and state and compare bytes,
    // so that a replica check that misses a difference is caught too.
    const std::size_t total = n + rt.optimizer->state_size();
    std::vector<float> mine(total);
    rt.engine->store_params(std::span<float>(mine.data(), n));
    rt.optimizer->store_state(std::span<float>(mine.data() + n, rt.optimizer->state_size()));
    std::vector<float> all(total * static_cast<std::size_t>(comm.size()));
    comm.host().allgather(mine.data(), all.data(), total, DType::f32);
    bool bytes_equal = true;
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm.size()); ++r)
      bytes_equal &= std::equal(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(total),
                                all.begin() + static_cast<std::ptrdiff_t>(r * total), [](float a, float b) {
                                  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
                                });
    if (!records(target, comm)) return;
    const std::lock_guard<std::mutex> lock(mu);
    o.parameters_moved = !std::equal(initial.begin(), initial.end(), mine.begin());
    if (!hash_says_synced) {
      o.passed = false;
      o.message = first_report;
    } else if (!bytes_equal) {
      o.passed = false;
      o.message = "the replica check reported identical replicas, but their bytes differ";
    }
  });
  return o;
}

namespace {

// A fresh scratch directory that every rank can see: rank 0 creates it and, for processes, tells the
// others its name. In memory (/dev/shm) where allowed -- not for an audited run, since /dev/shm is
// one of the paths any rank may write.
std::filesystem::path make_scratch(const Target& target, const std::string& what, bool in_memory = true) {
  static std::atomic<unsigned> counter{0};
  std::int64_t id[2] = {static_cast<std::int64_t>(::getpid()), static_cast<std::int64_t>(counter++)};
  if (target.process_world) target.process_world->broadcast(id, 2, DType::i64, 0);
  // Durability is tested elsewhere (tests/writer_test.cpp); here memory-backed /dev/shm spares the
  // fsyncs of hundreds of checkpoints.
  std::error_code ec;
  const std::filesystem::path base =
      in_memory && std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
          ? std::filesystem::path("/dev/shm")
          : std::filesystem::temp_directory_path();
  const std::filesystem::path dir = base /
                                    ("dpcheck-" + what + "-" + std::to_string(id[0]) + "-" + std::to_string(id[1]));
  if (!target.process_world || target.process_world->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  if (target.process_world) target.process_world->barrier();
  return dir;
}

void remove_scratch(const Target& target, const std::filesystem::path& dir) {
  if (target.process_world) target.process_world->barrier();
  if (!target.process_world || target.process_world->rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace

ResumeOutcome check_checkpoint_resume(const Scenario& s, int stop_at, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::vector<Checkpoint> straight, resumed;
  std::mutex mu;
  const auto keep = [&](std::vector<Checkpoint>& into, Checkpoint&& ck) {
    const std::lock_guard<std::mutex> lock(mu);
    into.push_back(std::move(ck));
  };
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    while (rt.trainer->next_step() < c.steps) rt.trainer->step();
    if (records(target, comm)) keep(straight, rt.trainer->checkpoint());
  });

  const std::filesystem::path dir = make_scratch(target, "resume");
  ResumeOutcome o;
  try {
    run_world(target, s.world_size, [&](Communicator& comm) {
      RankTrainer rt = make_rank_trainer(target, c, comm, data);
      while (rt.trainer->next_step() < stop_at) rt.trainer->step();
      make_writer(target, comm, dir, {})->save(rt.trainer->checkpoint(), c.model);
    });
    // Everything the first run held is gone; only the files carry the state across.
    run_world(target, s.world_size, [&](Communicator& comm) {
      RankTrainer rt = make_rank_trainer(target, c, comm, data);
      rt.trainer->restore(load_checkpoint(dir, c.model));
      while (rt.trainer->next_step() < c.steps) rt.trainer->step();
      if (records(target, comm)) keep(resumed, rt.trainer->checkpoint());
    });
  } catch (...) {
    remove_scratch(target, dir);
    throw;
  }
  remove_scratch(target, dir);

  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b, std::size_t* at) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
        *at = i;
        return false;
      }
    return true;
  };
  const ParamLayout layout(c.model);
  for (std::size_t r = 0; r < straight.size() && o.passed; ++r) {
    std::size_t at = 0;
    const Checkpoint& a = straight[r];
    const Checkpoint& b = resumed[r];
    if (!same_bits(a.params, b.params, &at))
      o.message = "after resuming at step " + std::to_string(stop_at) + ", parameter " + layout.describe_element(at) +
                  " is " + std::to_string(b.params[at]) + " instead of " + std::to_string(a.params[at]) +
                  " at step " + std::to_string(c.steps);
    else if (!same_bits(a.optimizer_state, b.optimizer_state, &at))
      o.message = "after resuming at step " + std::to_string(stop_at) + ", optimizer state " +
                  a.state_names[at / a.params.size()] + " at " + layout.describe_element(at % a.params.size()) +
                  " differs from the straight run's";
    else if (a.optimizer_steps != b.optimizer_steps)
      o.message = "after resuming, the optimizer counts " + std::to_string(b.optimizer_steps) + " steps instead of " +
                  std::to_string(a.optimizer_steps);
    o.passed = o.message.empty();
  }
  return o;
}

std::string find_mpi_launcher() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    for (const char* name : {"mpirun", "mpiexec"}) {
      const std::filesystem::path p = std::filesystem::path(dir.empty() ? "." : dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  return "";
}

std::string dpcheck_executable() {
  if (const char* env = std::getenv("DPCHECK_BINARY"); env && *env) return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && self.filename() == "dpcheck") return self.string();
  return (audit::find_library().parent_path() / "dpcheck").string();
}

WriteAuditOutcome check_rank0_writes(const Scenario& s, const Target& target) {
  WriteAuditOutcome o;
  const std::filesystem::path dir = make_scratch(Target{}, "audit", false);
  const std::filesystem::path log = dir / "log.jsonl", checkpoints = dir / "checkpoints", output = dir / "output.txt";
  std::vector<std::string> argv{find_mpi_launcher(), "-np", std::to_string(s.world_size), dpcheck_executable(), "train"};
  std::stringstream flags(s.train_flags());
  for (std::string f; flags >> f;) argv.push_back(f);
  argv.insert(argv.end(), {"--comm", "mpi", "--checkpoint-dir", checkpoints.string(), "--checkpoint-every", "1",
                          "--log", log.string(), "--timeout", "60"});
  if (!target.mutant.empty()) argv.insert(argv.end(), {"--mutant", target.mutant});

  audit::AuditOptions options;
  // Open MPI refuses root and more ranks than cores without these; other launchers ignore them.
  options.extra_env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                       "OMPI_MCA_rmaps_base_oversubscribe=1"};
  // Launched from inside an MPI job, the new launcher must not think it belongs to this one.
  if (target.process_world) options.unset = {"OMPI_COMM_WORLD", "OMPI_MCA_", "PMIX_", "PMI_", "OMPI_FILE", "OMPI_UNIVERSE"};
  options.output = output;
  const audit::RunResult run = audit::run_audited(argv, options);

  std::set<std::string> rank0_paths;
  for (const audit::Record& r : run.log.records)
    if (r.rank == 0 && r.result == "ok")
      for (std::string_view p : r.written())
        if (std::string_view(p).rfind(dir.string(), 0) == 0) rank0_paths.emplace(p);
  o.rank0_files = static_cast<std::int64_t>(rank0_paths.size());

  audit::AllowList allow = audit::default_allow_list();
  const audit::AllowList launcher = audit::launcher_allowances(run.log);
  allow.insert(allow.end(), launcher.begin(), launcher.end());
  const std::vector<audit::Record> bad = audit::offending(run.log.records, allow);

  const auto tail = [&] {
    std::ifstream f(output);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    return text.size() > 600 ? "..." + text.substr(text.size() - 600) : text;
  };
  if (!bad.empty()) {
    o.message = std::to_string(bad.size()) + " write-intent calls by ranks other than 0 outside the allowed paths; first: rank " +
                std::to_string(*bad[0].rank) + " " + bad[0].call + " " + bad[0].path + (bad[0].to.empty() ? "" : " -> " + bad[0].to);
  } else if (run.signal != 0 || (run.exit_code != 0 && run.exit_code != 1)) {
    o.message = "the training run " + run.status_text() + ":\n" + tail();
  } else if (!rank0_paths.contains(log.string())) {
    o.message = "rank 0 never wrote the log " + log.string() + " (the audit saw " + std::to_string(o.rank0_files) +
                " files from rank 0)";
  } else if (run.exit_code == 0 && std::none_of(rank0_paths.begin(), rank0_paths.end(), [](const std::string& p) {
               return p.ends_with("/manifest.json");
             })) {
    o.message = "training finished but rank 0 never wrote a checkpoint manifest";
  }
  o.passed = o.message.empty();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return o;
}

SamplerOutcome check_sampler(const SamplerScenario& s, const Target& target) {
  const SamplerConfig& c = s.sampler;
  const auto n = static_cast<std::size_t>(c.world_size);
  const std::int64_t d = c.dataset_size;
  SamplerOutcome o;
  std::mutex mu;
  const auto fail = [&](const std::string& why) {
    const std::lock_guard<std::mutex> lock(mu);
    if (o.passed) o.message = why;
    o.passed = false;
  };
  run_world(target, c.world_size, [&](Communicator& comm) {
    const std::unique_ptr<DistributedSampler> sampler = make_sampler(target, c);
    Communicator& host = comm.host();
    for (int epoch = 0; epoch < s.epochs; ++epoch) {
      const std::string at = "epoch " + std::to_string(epoch) + ": ";
      // Each rank computes its own share; the others learn it only through the communicator.
      const std::vector<std::int64_t> mine = sampler->indices(comm.rank(), epoch);
      const std::vector<std::int64_t> sizes = host.allgather_value<std::int64_t>(static_cast<std::int64_t>(mine.size()));
      const std::int64_t widest = *std::max_element(sizes.begin(), sizes.end());
      std::vector<std::int64_t> padded_mine(mine);
      padded_mine.resize(static_cast<std::size_t>(widest), -1);
      std::vector<std::int64_t> all(static_cast<std::size_t>(widest) * n);
      host.allgather(padded_mine.data(), all.data(), static_cast<std::size_t>(widest), DType::i64);
      // Every rank's idea of the sizes and totals must agree.
      const std::int64_t view = sampler->total_size() * 1'000'003 + sampler->padded() * 1009 + sampler->dropped();
      const std::vector<std::int64_t> views = host.allgather_value<std::int64_t>(view);
      if (!records(target, comm)) continue;

      if (std::any_of(views.begin(), views.end(), [&](std::int64_t v) { return v != views[0]; }))
        fail(at + "ranks disagree on the total, padding or dropped counts");
      std::vector<std::int64_t> count(static_cast<std::size_t>(d), 0);
      std::int64_t total = 0;
      for (std::size_t r = 0; r < n; ++r) {
        if (sizes[r] != sampler->share_size(static_cast<int>(r)))
          fail(at + "rank " + std::to_string(r) + " holds " + std::to_string(sizes[r]) + " examples but share_size says " +
               std::to_string(sampler->share_size(static_cast<int>(r))));
        for (std::int64_t k = 0; k < sizes[r]; ++k) {
          const std::int64_t i = all[r * static_cast<std::size_t>(widest) + static_cast<std::size_t>(k)];
          if (i < 0 || i >= d) {
            fail(at + "rank " + std::to_string(r) + " holds example " + std::to_string(i) + ", outside [0, " +
                 std::to_string(d) + ")");
            continue;
          }
          ++count[static_cast<std::size_t>(i)];
          ++total;
        }
      }
      const std::int64_t lo = *std::min_element(sizes.begin(), sizes.end());
      std::int64_t repeats = 0, missing = 0, first_repeat = -1, first_missing = -1;
      for (std::int64_t i = 0; i < d; ++i) {
        const std::int64_t k = count[static_cast<std::size_t>(i)];
        if (k > 1) { repeats += k - 1; if (first_repeat < 0) first_repeat = i; }
        if (k == 0) { ++missing; if (first_missing < 0) first_missing = i; }
      }
      const auto nn = static_cast<std::int64_t>(n);
      switch (c.policy) {
        case Policy::pad:
          if (d > 0 && (lo != widest || widest != (d + nn - 1) / nn))
            fail(at + "pad shares should all hold ceil(D/N) = " + std::to_string((d + nn - 1) / nn) + " examples");
          if (missing > 0) fail(at + "example " + std::to_string(first_missing) + " is in no share");
          if (repeats != sampler->padded())
            fail(at + std::to_string(repeats) + " examples are repeated (first: " + std::to_string(first_repeat) +
                 ") but the sampler reports " + std::to_string(sampler->padded()) + " padded");
          break;
        case Policy::drop_last:
          if (lo != widest || widest != d / nn) fail(at + "drop-last shares should all hold floor(D/N) = " + std::to_string(d / nn));
          if (repeats > 0) fail(at + "example " + std::to_string(first_repeat) + " is in more than one share");
          if (missing != sampler->dropped() || missing > nn - 1)
            fail(at + std::to_string(missing) + " examples are in no share (first: " + std::to_string(first_missing) +
                 ") but the sampler reports " + std::to_string(sampler->dropped()) + " dropped, at most N-1 allowed");
          break;
        case Policy::uneven:
          if (widest - lo > 1) fail(at + "uneven shares differ by " + std::to_string(widest - lo) + " examples");
          if (repeats > 0) fail(at + "example " + std::to_string(first_repeat) + " is in more than one share");
          if (missing > 0) fail(at + "example " + std::to_string(first_missing) + " is in no share");
          break;
      }
      if (total != sampler->total_size())
        fail(at + "the shares hold " + std::to_string(total) + " examples, total_size says " +
             std::to_string(sampler->total_size()));
    }
  });
  return o;
}

}  // namespace dpcheck
