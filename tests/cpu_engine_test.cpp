// The CPU engine (src/cpu/cpu_engine.cpp) against the float64 reference with the derived bound, on random
// shapes including 1-wide layers and odd sizes, with the gradient buffer poisoned before each run so an
// element the engine forgets to write cannot pass; and the host's MemoryService in the same file: XXH3-64
// by its published values, first_difference and the copies on bits rather than values. Every GEMM code
// path the CPU has (src/gemm/cpu_gemm.hpp), on one thread and on all, against the same bound, each giving the
// same bits run after run; the variables that pin a path and a thread count.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/gemm/cpu_gemm.hpp"
#include "src/train/engine.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

void poison(Engine& e) { std::fill_n(e.grads(), e.param_count(), std::numeric_limits<float>::quiet_NaN()); }

RC_GTEST_PROP(CpuEngine, GradientWithinDerivedBoundOfFloat64Reference, ()) {
  const auto [s, m, b, params] = draw_batch();
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  poison(*engine);
  const double loss = engine->forward_backward(b, 1.0f, false);
  std::vector<float> g(engine->param_count());
  engine->store_grads(g);
  const auto bound = reference::gradient_bound(m, params, b);
  const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size));
  RC_LOG() << "error ratio " << cmp.max_ratio << " at " << ParamLayout(m).describe_element(cmp.worst) << "\n";
  RC_ASSERT(cmp.passed());
  // The loss is reported in double from float32 outputs: close to the reference's, not bitwise.
  RC_ASSERT(std::abs(loss - bound.reference.loss) <= 1e-4 * (1 + std::abs(bound.reference.loss)));
}

// Sets an environment variable for one scope, and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct GemmPath {
  cpu::Isa isa;
  int threads;
};

// Every path this CPU has, on one thread and on all the cores (two at least, so that products are cut).
std::vector<GemmPath> gemm_paths() {
  std::vector<GemmPath> out;
  for (cpu::Isa isa : cpu::available_isas()) {
    out.push_back({isa, 1});
    out.push_back({isa, std::max(2, cpu::cores())});
  }
  return out;
}

std::string describe(const GemmPath& p) { return std::string(cpu::isa_name(p.isa)) + " x" + std::to_string(p.threads); }

// The gradient of `m` on `b` from `params` on the path, poisoned first.
std::vector<float> gradient_on(const GemmPath& p, const ModelConfig& m, const Batch& b,
                               const std::vector<float>& params) {
  const ScopedEnv isa("DPCHECK_CPU_ISA", std::string(cpu::isa_name(p.isa)));
  const ScopedEnv threads("DPCHECK_CPU_THREADS", std::to_string(p.threads));
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  poison(*engine);
  engine->forward_backward(b, 1.0f, false);
  std::vector<float> g(engine->param_count());
  engine->store_grads(g);
  return g;
}

RC_GTEST_PROP(CpuEngine, EveryGemmPathStaysWithinTheDerivedBound, ()) {
  const auto [s, m, b, params] = draw_batch();
  const auto bound = reference::gradient_bound(m, params, b);
  for (const GemmPath& p : gemm_paths()) {
    const std::vector<float> g = gradient_on(p, m, b, params);
    const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size));
    RC_LOG() << describe(p) << ": error ratio " << cmp.max_ratio << " at " << ParamLayout(m).describe_element(cmp.worst)
             << "\n";
    RC_ASSERT(cmp.passed());
  }
}

// Shapes large enough for Eigen's packed kernels, its remainder rows and columns, and its threads: on
// every path within the bound, the same bits on a second run, and the paths not all one (the variables
// really change the path: FMA rounds differently from a multiply and an add).
TEST(CpuEngine, EveryGemmPathOnLargeOddShapesIsBoundedAndRepeatsItsBits) {
  for (const ModelConfig& m : {ModelConfig{{67, 130, 33}, Activation::tanh, Loss::cross_entropy},
                               ModelConfig{{129, 257, 96, 17}, Activation::relu, Loss::mse}}) {
    const Batch b = first_examples(m, 203, 5);
    const std::vector<float> params = init_params(m, 5);
    const auto bound = reference::gradient_bound(m, params, b);
    std::optional<std::vector<float>> baseline;
    bool some_path_differs = false;
    for (const GemmPath& p : gemm_paths()) {
      SCOPED_TRACE(dims_string(m.dims) + " on " + describe(p));
      const std::vector<float> g = gradient_on(p, m, b, params);
      const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size));
      EXPECT_TRUE(cmp.passed()) << "error ratio " << cmp.max_ratio << " at "
                                << ParamLayout(m).describe_element(cmp.worst);
      EXPECT_EQ(g, gradient_on(p, m, b, params));
      if (!baseline) baseline = g;
      some_path_differs |= g != *baseline;
    }
    if (cpu::available_isas().size() > 1) {
      EXPECT_TRUE(some_path_differs);
    }
  }
}

TEST(CpuEngine, PathVariablesAreCheckedAndRanksAsThreadsKeepOneThread) {
  {
    const ScopedEnv isa("DPCHECK_CPU_ISA", "sse9");
    EXPECT_THROW(make_cpu_engine(ModelConfig{{3, 2}, Activation::identity, Loss::mse}), Error);
  }
  {
    const ScopedEnv isa("DPCHECK_CPU_ISA", "baseline");
    EXPECT_EQ(cpu::engine_isa(), cpu::Isa::baseline);
    EXPECT_NE(cpu::describe_engine_path().find("DPCHECK_CPU_ISA=baseline"), std::string::npos);
  }
  EXPECT_EQ(cpu::engine_isa(), cpu::available_isas().back());  // unset: the widest
  for (const char* bad : {"0", "-1", "two", "3x", "100000"}) {
    const ScopedEnv threads("DPCHECK_CPU_THREADS", bad);
    EXPECT_THROW(cpu::engine_threads(), Error) << bad;
  }
  const ScopedEnv threads("DPCHECK_CPU_THREADS", "3");
  EXPECT_EQ(cpu::engine_threads(), 3);
  // Two ranks as threads share the machine: one thread each, whatever the variable says; a world of
  // one rank has the machine to itself.
  std::vector<int> seen(2, 0);
  run_local(2, [&](Communicator& comm) { seen[static_cast<std::size_t>(comm.rank())] = cpu::engine_threads(); });
  EXPECT_EQ(seen, std::vector<int>(2, 1));
  run_local(1, [&](Communicator&) { seen[0] = cpu::engine_threads(); });
  EXPECT_EQ(seen[0], 3);
}

TEST(CpuEngine, ScaleByPowerOfTwoIsExact) {
  ModelConfig m{{7, 5, 3}, Activation::tanh, Loss::cross_entropy};
  auto e = make_cpu_engine(m);
  e->load_params(init_params(m, 2));
  const Batch b = first_examples(m, 13, 2);
  std::vector<float> g1(e->param_count()), g4(e->param_count());
  e->forward_backward(b, 1.0f, false);
  e->store_grads(g1);
  e->forward_backward(b, 4.0f, false);
  e->store_grads(g4);
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g4[i], 4.0f * g1[i]) << i;
}

TEST(CpuEngine, AccumulateAddsToTheBuffer) {
  ModelConfig m{{3, 4, 2}, Activation::relu, Loss::mse};
  auto e = make_cpu_engine(m);
  e->load_params(init_params(m, 4));
  const Batch b = first_examples(m, 10, 4);
  const Batch first = b.slice(0, 6), second = b.slice(6, 10);
  std::vector<float> ga(e->param_count()), gb(e->param_count()), gsum(e->param_count());
  e->forward_backward(first, 1.0f, false);
  e->store_grads(ga);
  e->forward_backward(second, 1.0f, false);
  e->store_grads(gb);
  e->forward_backward(first, 1.0f, false);
  e->forward_backward(second, 1.0f, true);
  e->store_grads(gsum);
  double moved = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    const double want = static_cast<double>(ga[i]) + static_cast<double>(gb[i]);
    // The engine adds inside its GEMM, so the sum may round differently from ga + gb: a few ulps.
    EXPECT_NEAR(gsum[i], want, 4 * 0x1p-24 * (std::abs(ga[i]) + std::abs(gb[i])) + 1e-30) << i;
    moved += std::abs(gb[i]);
  }
  EXPECT_GT(moved, 0.0);
}

TEST(CpuEngine, EmptyBatchZeroesTheGradient) {
  ModelConfig m{{3, 2}, Activation::identity, Loss::mse};
  auto e = make_cpu_engine(m);
  poison(*e);
  Batch empty;
  empty.in_dim = 3;
  empty.out_dim = 2;
  EXPECT_EQ(e->forward_backward(empty, 1.0f, false), 0.0);
  for (std::size_t i = 0; i < e->param_count(); ++i) EXPECT_EQ(e->grads()[i], 0.0f);
}

TEST(CpuEngine, HashSeesEveryBit) {
  std::vector<float> a(1000, 0.5f), b = a;
  EXPECT_EQ(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7));
  EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(a.data(), a.size(), 8));
  for (std::size_t i : {std::size_t{0}, std::size_t{500}, std::size_t{999}}) {
    b = a;
    b[i] = std::nextafter(b[i], 1.0f);
    EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7)) << i;
  }
  b = a;
  b[3] = -0.0f;
  a[3] = 0.0f;
  EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7));  // bits, not values
}

// ---- the host's MemoryService ------------------------------------------------------------------------

TEST(HostMemory, IsTheCpuEnginesAndHashesWithXxh3) {
  const MemoryService& memory = host_memory();
  EXPECT_EQ(memory.memory_space(), MemorySpace::host);
  EXPECT_EQ(memory.hash_name(), "xxh3");
  const auto e = make_cpu_engine(ModelConfig{{3, 4, 2}, Activation::relu, Loss::mse});
  EXPECT_EQ(&e->memory(), &memory);
  EXPECT_EQ(e->memory_space(), MemorySpace::host);
  // XXH3-64's published hash of no bytes with seed 0, and libxxhash's XXH3_64bits_withSeed of the
  // little-endian bytes of {1, -0, 2.5} with seed 7: the name printed is the function computed.
  const std::vector<float> three{1.0f, -0.0f, 2.5f};
  EXPECT_EQ(memory.hash(three.data(), 0, 0), 0x2d06800538d394c2ull);
  EXPECT_EQ(memory.hash(three.data(), three.size(), 7), 0x637f0cb39ddb2217ull);
  EXPECT_EQ(memory.hash(three.data(), three.size(), 7), hash_host(three.data(), three.size(), 7));
}

TEST(HostMemory, FirstDifferenceComparesBitsAndFindsTheFirst) {
  const MemoryService& memory = host_memory();
  const std::vector<float> a{0.0f, 1.0f, std::bit_cast<float>(0x7fc00001u), 3.0f, 4.0f};
  const std::size_t n = a.size();
  std::vector<float> b = a;
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), n);
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), 0), 0u);
  b[0] = -0.0f;  // equal values, different bits
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), 0u);
  b = a;
  b[2] = std::bit_cast<float>(0x7fc00002u);  // another NaN payload
  b[4] = 5.0f;                               // a later difference does not hide it
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), 2u);
  EXPECT_EQ(memory.first_difference(b.data(), a.data(), n), 2u);
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), 2), 2u);  // only the first two compared
}

TEST(HostMemory, CopiesKeepEveryBit) {
  const MemoryService& memory = host_memory();
  const std::vector<float> in{-0.0f, std::numeric_limits<float>::denorm_min(), std::bit_cast<float>(0xffc01234u), 7.5f};
  std::vector<float> mid(in.size(), 1.0f), out(in.size(), 1.0f);
  memory.copy_from_host(in.data(), mid.data(), in.size());
  memory.copy_to_host(mid.data(), out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mid[i]), std::bit_cast<std::uint32_t>(in[i])) << i;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(in[i])) << i;
  }
  std::vector<float> untouched(in.size(), 1.0f);
  memory.copy_to_host(in.data(), untouched.data(), 0);  // n = 0 copies nothing
  memory.copy_from_host(in.data(), untouched.data(), 0);
  EXPECT_EQ(untouched, std::vector<float>(in.size(), 1.0f));
}

}  // namespace
}  // namespace dpcheck
