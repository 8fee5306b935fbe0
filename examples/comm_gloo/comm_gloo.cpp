/* Gloo as a dpcheck communicator plugin: every all-reduce algorithm the library ships, over its TCP
 * transport on the loopback interface, with broadcast, allgather and barrier from its collectives.
 *
 * The algorithm is chosen by DPCHECK_GLOO_ALGORITHM when dpcheck first asks for the table (see
 * kAlgorithms below and README.md). The adapter passes the library's results through as they come:
 * an algorithm that leaves ranks with different bits, or sums wrongly for some world sizes, is for
 * dpcheck to report, not for this file to hide.
 *
 * Connections: each rank opens a pair per peer on 127.0.0.1, the pairs' addresses travel through the
 * bootstrap's allgather, and every rank connects its pairs. Nothing else is used for the rendezvous:
 * no store, no file.
 *
 * The older algorithm classes (AllreduceRing and its kin) bind their buffers and a range of slots
 * when they are constructed, and a slot matches its peer's only if every rank constructs the same
 * objects in the same order. They are therefore cached by what every rank passes alike (dtype, op,
 * count), never by address, and run on a staging buffer of their own that the caller's buffer is
 * copied into and back out of. The newer collectives (gloo::allreduce, gloo::broadcast,
 * gloo::allgather, gloo::barrier) take the caller's buffer and a tag per call and need no cache. */
#include <dpcheck/plugin.h>

#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <sys/socket.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define DPCHECK_GLOO_STR2(x) #x
#define DPCHECK_GLOO_STR(x) DPCHECK_GLOO_STR2(x)

/* The library's version: CMake passes its package's (Gloo_VERSION) and, where dpkg knows it, the
   Debian package's; gloo/config.h's numbers otherwise. */
#ifndef DPCHECK_GLOO_VERSION
#define DPCHECK_GLOO_VERSION \
  DPCHECK_GLOO_STR(GLOO_VERSION_MAJOR) "." DPCHECK_GLOO_STR(GLOO_VERSION_MINOR) "." DPCHECK_GLOO_STR(GLOO_VERSION_PATCH)
#endif

namespace {

enum class Algorithm { ring, ring_chunked, halving_doubling, bcube, allreduce_ring, allreduce_bcube };

struct AlgorithmName {
  const char* value;  // DPCHECK_GLOO_ALGORITHM's spelling, and the table's name after "gloo "
  Algorithm algorithm;
};

constexpr AlgorithmName kAlgorithms[] = {
    {"ring", Algorithm::ring},                          // gloo::AllreduceRing
    {"ring_chunked", Algorithm::ring_chunked},          // gloo::AllreduceRingChunked
    {"halving_doubling", Algorithm::halving_doubling},  // gloo::AllreduceHalvingDoubling
    {"bcube", Algorithm::bcube},                        // gloo::AllreduceBcube
    {"allreduce_ring", Algorithm::allreduce_ring},      // gloo::allreduce, AllreduceOptions::RING
    {"allreduce_bcube", Algorithm::allreduce_bcube},    // gloo::allreduce, AllreduceOptions::BCUBE
};

/* PyTorch's ProcessGroupGloo reduces CPU tensors with gloo::allreduce and its default algorithm, the
   ring; unset, this plugin does the same. */
constexpr const char* kDefaultAlgorithm = "allreduce_ring";

bool is_old_api(Algorithm a) { return a != Algorithm::allreduce_ring && a != Algorithm::allreduce_bcube; }

/* ---- the table, built once ------------------------------------------------------------------------ */

struct Selection {
  bool known = false;
  Algorithm algorithm = Algorithm::allreduce_ring;
  std::string value;  // as the environment gave it
  std::string name;
  std::string version;
  std::string unknown_error;  // init's message when the value names no algorithm
};

const Selection& selection();

/* ---- errors ---------------------------------------------------------------------------------------- */

/* init's message when init fails: no handle then, and last_error(NULL) is asked on the same thread. */
thread_local std::string init_error;

const char* dtype_name(dpcheck_dtype_t t) {
  switch (t) {
    case DPCHECK_FLOAT32: return "float32";
    case DPCHECK_FLOAT64: return "float64";
    case DPCHECK_INT64: return "int64";
    case DPCHECK_BFLOAT16: return "bfloat16";
    case DPCHECK_FLOAT16: return "float16";
  }
  return "dtype ?";
}

const char* op_name(dpcheck_op_t op) {
  switch (op) {
    case DPCHECK_SUM: return "sum";
    case DPCHECK_AVG: return "avg";
    case DPCHECK_MIN: return "min";
    case DPCHECK_MAX: return "max";
  }
  return "op ?";
}

std::size_t dtype_bytes(dpcheck_dtype_t t) {
  switch (t) {
    case DPCHECK_FLOAT32: return 4;
    case DPCHECK_FLOAT64:
    case DPCHECK_INT64: return 8;
    case DPCHECK_BFLOAT16:
    case DPCHECK_FLOAT16: return 2;
  }
  throw std::invalid_argument("dtype " + std::to_string(static_cast<int>(t)) + " is no dtype of plugin ABI 3");
}

/* ---- the connections --------------------------------------------------------------------------------- */

/* gloo::Context with a full mesh of pairs set up over dpcheck's bootstrap. gloo::rendezvous::Context
   does the same over a Store; the bootstrap is a collective allgather, which is all the exchange
   needs. */
class BootstrapContext final : public gloo::Context {
 public:
  BootstrapContext(int my_rank, int world) : gloo::Context(my_rank, world) {}

  void connect_full_mesh(const std::shared_ptr<gloo::transport::Device>& device, const dpcheck_bootstrap_t& boot) {
    std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
    transport->setTimeout(getTimeout());  // the pairs' connect and every wait on them

    // Rank r's block: for each peer p, the address of r's pair for p (a length, then the bytes).
    constexpr std::size_t kEntry = sizeof(std::uint32_t) + gloo::transport::Address::kMaxByteSize;
    const std::size_t block = static_cast<std::size_t>(size) * kEntry;
    std::vector<char> mine(block, 0), all(block * static_cast<std::size_t>(size), 0);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::vector<char> address = transport->createPair(peer)->address().bytes();
      if (address.size() > gloo::transport::Address::kMaxByteSize)
        throw std::runtime_error("a pair's address is " + std::to_string(address.size()) + " bytes, over Gloo's " +
                                 std::to_string(gloo::transport::Address::kMaxByteSize));
      const auto length = static_cast<std::uint32_t>(address.size());
      char* entry = mine.data() + static_cast<std::size_t>(peer) * kEntry;
      std::memcpy(entry, &length, sizeof length);
      std::memcpy(entry + sizeof length, address.data(), address.size());
    }
    if (boot.allgather(boot.ctx, mine.data(), all.data(), block) != 0)
      throw std::runtime_error("the bootstrap's allgather of the pairs' addresses failed (a peer did not arrive)");
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const char* entry = all.data() + static_cast<std::size_t>(peer) * block + static_cast<std::size_t>(rank) * kEntry;
      std::uint32_t length = 0;
      std::memcpy(&length, entry, sizeof length);
      if (length == 0 || length > gloo::transport::Address::kMaxByteSize)
        throw std::runtime_error("rank " + std::to_string(peer) + " sent no address for its pair with this rank");
      const std::vector<char> address(entry + sizeof length, entry + sizeof length + length);
      // Blocks until the pair is connected, or throws once the context's timeout has passed.
      transport->getPair(peer)->connect(address);
    }
    device_ = device;
    transportContext_ = std::move(transport);
  }
};

/* ---- the older algorithm classes, cached ------------------------------------------------------------- */

/* gloo::Algorithm's destructor is noexcept(false); one that throws while tearing down after a failure
   has nothing to add to the error already reported. */
struct DestroyAlgorithm {
  void operator()(gloo::Algorithm* algorithm) const noexcept {
    try {
      delete algorithm;
    } catch (...) {
    }
  }
};

struct CachedAlgorithm {
  dpcheck_dtype_t dtype = DPCHECK_FLOAT32;
  dpcheck_op_t op = DPCHECK_SUM;
  std::size_t count = 0;
  std::unique_ptr<unsigned char[]> staging;  // the buffer the algorithm was built on
  std::unique_ptr<gloo::Algorithm, DestroyAlgorithm> algorithm;
  std::size_t footprint = 0;  // bytes held, roughly: the staging buffer and the algorithm's own
};

/* Built algorithms, least recently used first. Which entry a call finds or evicts depends only on the
   sequence of (dtype, op, count) the ranks pass, which is the same on every rank, so the ranks build
   (and take slots for) the same algorithms in the same order. */
class AlgorithmCache {
 public:
  /* Entries are kept while their footprints together stay under this; a larger one is built for its
     call alone. Four ranks as threads of one process hold four caches. */
  static constexpr std::size_t kBudget = std::size_t{512} << 20;

  ~AlgorithmCache() { clear(); }

  CachedAlgorithm* find(dpcheck_dtype_t dtype, dpcheck_op_t op, std::size_t count) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->dtype == dtype && it->op == op && it->count == count) {
        entries_.splice(entries_.end(), entries_, it);
        return &entries_.back();
      }
    return nullptr;
  }

  CachedAlgorithm* insert(CachedAlgorithm entry) {
    while (!entries_.empty() && held_ + entry.footprint > kBudget) evict_oldest();
    held_ += entry.footprint;
    entries_.push_back(std::move(entry));
    return &entries_.back();
  }

  void release(CachedAlgorithm* entry) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (&*it == entry) {
        held_ -= it->footprint;
        entries_.erase(it);
        return;
      }
  }

  bool fits(std::size_t footprint) const { return footprint <= kBudget; }

  void clear() {
    while (!entries_.empty()) evict_oldest();
  }

 private:
  void evict_oldest() {
    held_ -= entries_.front().footprint;
    entries_.pop_front();
  }

  std::list<CachedAlgorithm> entries_;
  std::size_t held_ = 0;
};

/* ---- a rank's handle ----------------------------------------------------------------------------------- */

struct Comm {
  int rank = 0, size = 1;
  Algorithm algorithm = Algorithm::allreduce_ring;
  std::string name;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<BootstrapContext> context;
  AlgorithmCache cache;
  std::uint32_t tag = 0;  // the newer collectives' tag: one per call, in the same order on every rank
  std::string error;

  ~Comm() {
    // The algorithms hold buffers on the context's pairs; the pairs go before the device's event loop.
    cache.clear();
    context.reset();
    device.reset();
  }
};

/* Runs `body`; an exception becomes a non-zero return and last_error's text: what was being done
   (`describe()`, built only then), the rank, and the exception's own message. Nothing leaves. */
template <class Describe, class Body>
int guarded(std::string& error, int rank, const Describe& describe, const Body& body) noexcept {
  try {
    try {
      body();
      return 0;
    } catch (const std::exception& e) {
      error = describe() + " on rank " + std::to_string(rank) + ": " + e.what();
    } catch (...) {
      error = describe() + " on rank " + std::to_string(rank) + ": an exception that is no std::exception";
    }
  } catch (...) {
    error.clear();  // no memory for the message: last_error says so
  }
  return 1;
}

/* ---- the reductions -------------------------------------------------------------------------------------- */

template <class T> const gloo::ReductionFunction<T>* old_reduction(dpcheck_op_t op) {
  switch (op) {
    case DPCHECK_MIN: return gloo::ReductionFunction<T>::min;
    case DPCHECK_MAX: return gloo::ReductionFunction<T>::max;
    case DPCHECK_SUM:
    case DPCHECK_AVG: break;
  }
  return gloo::ReductionFunction<T>::sum;
}

using NewReduction = void (*)(void*, const void*, const void*, std::size_t);

template <class T> NewReduction new_reduction(dpcheck_op_t op) {
  switch (op) {
    case DPCHECK_MIN: return static_cast<NewReduction>(&gloo::min<T>);
    case DPCHECK_MAX: return static_cast<NewReduction>(&gloo::max<T>);
    case DPCHECK_SUM:
    case DPCHECK_AVG: break;
  }
  return static_cast<NewReduction>(&gloo::sum<T>);
}

/* avg: Gloo has no mean, so the adapter divides Gloo's sum by the world size, as PyTorch's DDP does
   over Gloo. Every rank divides the same bits by the same number, so a sum that agrees stays so. */
template <class T> void divide(void* buf, std::size_t count, int world) {
  T* p = static_cast<T*>(buf);
  if constexpr (std::is_same_v<T, gloo::float16>) {
    // Through float and back, rounding to nearest even, writing the bits (not float16's operator=).
    for (std::size_t i = 0; i < count; ++i)
      p[i].x = gloo::cpu_float2half_rn(gloo::cpu_half2float(p[i]) / static_cast<float>(world)).x;
  } else {
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(world));
  }
}

/* ---- all-reduce ------------------------------------------------------------------------------------------- */

template <class T> gloo::Algorithm* build_old(Algorithm a, const std::shared_ptr<gloo::Context>& context, T* ptr,
                                              int count, dpcheck_op_t op) {
  const std::vector<T*> ptrs{ptr};
  const gloo::ReductionFunction<T>* fn = old_reduction<T>(op);
  switch (a) {
    case Algorithm::ring: return new gloo::AllreduceRing<T>(context, ptrs, count, fn);
    case Algorithm::ring_chunked: return new gloo::AllreduceRingChunked<T>(context, ptrs, count, fn);
    case Algorithm::halving_doubling: return new gloo::AllreduceHalvingDoubling<T>(context, ptrs, count, fn);
    case Algorithm::bcube: return new gloo::AllreduceBcube<T>(context, ptrs, count, fn);
    case Algorithm::allreduce_ring:
    case Algorithm::allreduce_bcube: break;
  }
  throw std::logic_error("not an algorithm class");
}

/* What an old-API algorithm holds beside its staging buffer: the rings keep two buffers of the whole
   count; halving-doubling and bcube keep receive buffers of about the whole count. */
std::size_t footprint_of(std::size_t bytes) { return 3 * bytes + 4096; }

template <class T> void allreduce_old(Comm& c, void* buf, std::size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op) {
  const std::size_t bytes = count * sizeof(T);
  // The classes keep the count and the byte count in an int.
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw std::length_error(std::to_string(count) + " elements are " + std::to_string(bytes) +
                            " bytes, more than Gloo's algorithm classes take (they keep the byte count in an int)");
  CachedAlgorithm* entry = c.cache.find(dtype, op, count);
  CachedAlgorithm single;  // one too large to keep, built for this call alone
  if (!entry) {
    CachedAlgorithm built;
    built.dtype = dtype;
    built.op = op;
    built.count = count;
    built.staging.reset(new unsigned char[bytes ? bytes : sizeof(T)]);
    built.footprint = footprint_of(bytes);
    built.algorithm.reset(
        build_old<T>(c.algorithm, c.context, reinterpret_cast<T*>(built.staging.get()), static_cast<int>(count), op));
    if (c.cache.fits(built.footprint)) {
      entry = c.cache.insert(std::move(built));
    } else {
      single = std::move(built);
      entry = &single;
    }
  }
  try {
    if (bytes) std::memcpy(entry->staging.get(), buf, bytes);
    entry->algorithm->run();
    if (bytes) std::memcpy(buf, entry->staging.get(), bytes);
  } catch (...) {
    // An algorithm that failed part way holds buffers in an unknown state: never run it again.
    if (entry != &single) c.cache.release(entry);
    throw;
  }
}

template <class T> void allreduce_new(Comm& c, void* buf, std::size_t count, dpcheck_op_t op) {
  gloo::AllreduceOptions opts(c.context);
  opts.setAlgorithm(c.algorithm == Algorithm::allreduce_bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                              : gloo::AllreduceOptions::Algorithm::RING);
  opts.setOutput(static_cast<T*>(buf), count);
  opts.setReduceFunction(new_reduction<T>(op));
  opts.setTag(c.tag++);
  opts.setTimeout(c.timeout);
  gloo::allreduce(opts);
}

template <class T> void allreduce_typed(Comm& c, void* buf, std::size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op) {
  if (is_old_api(c.algorithm)) allreduce_old<T>(c, buf, count, dtype, op);
  else allreduce_new<T>(c, buf, count, op);
  if (op == DPCHECK_AVG) divide<T>(buf, count, c.size);
}

/* ---- the entry points -------------------------------------------------------------------------------------- */

/* 3/4 of DPCHECK_PLUGIN_TIMEOUT_MS, so that Gloo's own error reaches dpcheck before its watchdog
   ends the run (the bootstrap gives up at 3/4 too); Gloo's default (30 s) when it is not set. */
std::chrono::milliseconds gloo_timeout(std::chrono::milliseconds fallback) {
  const char* text = std::getenv("DPCHECK_PLUGIN_TIMEOUT_MS");
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const long long ms = std::strtoll(text, &end, 10);
  if (*end != '\0' || ms <= 0) return fallback;
  return std::chrono::milliseconds(ms > 3 ? ms * 3 / 4 : 1);
}

int gloo_init(const dpcheck_bootstrap_t* boot, void** comm) {
  *comm = nullptr;
  std::unique_ptr<Comm> c;
  const int rc = guarded(
      init_error, boot->rank,
      [&] { return "init (" + selection().name + ", " + std::to_string(boot->size) + " ranks over TCP on 127.0.0.1)"; },
      [&] {
        const Selection& s = selection();
        if (!s.known) throw std::invalid_argument(s.unknown_error);
        c = std::make_unique<Comm>();
        c->rank = boot->rank;
        c->size = boot->size;
        c->algorithm = s.algorithm;
        c->name = s.name;
        c->context = std::make_shared<BootstrapContext>(boot->rank, boot->size);
        c->timeout = gloo_timeout(c->context->getTimeout());
        c->context->setTimeout(c->timeout);
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";  // loopback only
        attr.ai_family = AF_INET;
        c->device = gloo::transport::tcp::CreateDevice(attr);
        c->context->connect_full_mesh(c->device, *boot);
      });
  if (rc != 0) {
    try {
      c.reset();  // closes what was opened, waiting for no one
    } catch (...) {
    }
    return rc;
  }
  *comm = c.release();
  return 0;
}

int gloo_allreduce(void* comm, void* buf, std::size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op, void*) {
  Comm* c = static_cast<Comm*>(comm);
  const auto describe = [&] {
    return "allreduce (" + c->name + ", " + dtype_name(dtype) + " " + op_name(op) + ", " + std::to_string(count) +
           " elements)";
  };
  return guarded(c->error, c->rank, describe, [&] {
    switch (dtype) {
      case DPCHECK_FLOAT32: return allreduce_typed<float>(*c, buf, count, dtype, op);
      case DPCHECK_FLOAT64: return allreduce_typed<double>(*c, buf, count, dtype, op);
      case DPCHECK_INT64: return allreduce_typed<std::int64_t>(*c, buf, count, dtype, op);
      case DPCHECK_FLOAT16: return allreduce_typed<gloo::float16>(*c, buf, count, dtype, op);
      case DPCHECK_BFLOAT16: break;
    }
    throw std::invalid_argument("Gloo has no reduction for this dtype");
  });
}

int gloo_broadcast(void* comm, void* buf, std::size_t count, dpcheck_dtype_t dtype, int root, void*) {
  Comm* c = static_cast<Comm*>(comm);
  const auto describe = [&] {
    return "broadcast (" + std::to_string(count) + " " + dtype_name(dtype) + " elements from rank " +
           std::to_string(root) + ")";
  };
  return guarded(c->error, c->rank, describe, [&] {
    // Bytes travel as they are: the dtype only sizes them.
    gloo::BroadcastOptions opts(c->context);
    opts.setOutput(static_cast<unsigned char*>(buf), count * dtype_bytes(dtype));
    opts.setRoot(root);
    opts.setTag(c->tag++);
    opts.setTimeout(c->timeout);
    gloo::broadcast(opts);
  });
}

int gloo_allgather(void* comm, const void* send, void* recv, std::size_t count, dpcheck_dtype_t dtype, void*) {
  Comm* c = static_cast<Comm*>(comm);
  const auto describe = [&] {
    return "allgather (" + std::to_string(count) + " " + dtype_name(dtype) + " elements a rank)";
  };
  return guarded(c->error, c->rank, describe, [&] {
    const std::size_t bytes = count * dtype_bytes(dtype);
    // gloo::allgather takes the remainder of an offset by the output's size, 0 here (SIGFPE): nothing
    // to gather, so Gloo is not called.
    if (bytes == 0) return;
    // In place from this rank's block, which `send` may already be (memmove, not memcpy).
    unsigned char* out = static_cast<unsigned char*>(recv);
    std::memmove(out + static_cast<std::size_t>(c->rank) * bytes, send, bytes);
    gloo::AllgatherOptions opts(c->context);
    opts.setOutput(out, bytes * static_cast<std::size_t>(c->size));
    opts.setTag(c->tag++);
    opts.setTimeout(c->timeout);
    gloo::allgather(opts);
  });
}

int gloo_barrier(void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  return guarded(
      c->error, c->rank, [] { return std::string("barrier"); },
      [&] {
        gloo::BarrierOptions opts(c->context);
        opts.setTag(c->tag++);
        opts.setTimeout(c->timeout);
        gloo::barrier(opts);
      });
}

const char* gloo_last_error(void* comm) {
  const std::string& error = comm ? static_cast<Comm*>(comm)->error : init_error;
  return error.empty() ? "out of memory while describing the error" : error.c_str();
}

/* On a normal end every rank's last collective has returned before any finalize starts, and a
   collective returns only once what it waits for has arrived, so every byte a rank sent has reached
   its peer by then and the pairs can close; after a failure nothing is waited for either: the
   algorithms, pairs and event loop are released as they stand. */
void gloo_finalize(void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  try {
    delete c;
  } catch (...) {
  }
}

std::uint32_t declared_dtypes() {
  std::uint32_t mask =
      DPCHECK_DTYPE_BIT(DPCHECK_FLOAT32) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT64) | DPCHECK_DTYPE_BIT(DPCHECK_INT64);
#ifdef DPCHECK_GLOO_DECLARE_FLOAT16
  // Only in libdpcheck_comm_gloo_float16.so: gloo::float16's assignment drops some results (README.md,
  // "float16"), which that build lets dpcheck show.
  mask |= DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16);
#endif
  return mask;
}

const Selection& selection() {
  static const Selection s = [] {
    Selection out;
    const char* env = std::getenv("DPCHECK_GLOO_ALGORITHM");
    out.value = env && *env ? env : kDefaultAlgorithm;
    std::string valid;
    for (const AlgorithmName& a : kAlgorithms) {
      valid += (valid.empty() ? "" : ", ") + std::string(a.value);
      if (out.value == a.value) {
        out.known = true;
        out.algorithm = a.algorithm;
      }
    }
    out.version = "Gloo " DPCHECK_GLOO_VERSION;
#ifdef DPCHECK_GLOO_PACKAGE_VERSION
    out.version += " (Debian " DPCHECK_GLOO_PACKAGE_VERSION ")";
#endif
    if (out.known) {
      out.name = "gloo " + out.value;
#ifdef DPCHECK_GLOO_DECLARE_FLOAT16
      out.name += " with float16";
#endif
    } else {
      out.name = "gloo, unknown algorithm " + out.value;
      out.unknown_error = "DPCHECK_GLOO_ALGORITHM is '" + out.value +
                          "', which names no algorithm of this plugin; valid: " + valid +
                          " (unset or empty: " + kDefaultAlgorithm + ")";
    }
    return out;
  }();
  return s;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) {
  static const dpcheck_comm_plugin_t table = [] {
    const Selection& s = selection();
    dpcheck_comm_plugin_t t{};
    t.abi = DPCHECK_PLUGIN_ABI;
    t.name = s.name.c_str();
    t.memory = DPCHECK_HOST;
    t.init = gloo_init;
    t.allreduce = gloo_allreduce;
    t.broadcast = gloo_broadcast;
    t.allgather = gloo_allgather;
    t.barrier = gloo_barrier;
    t.last_error = gloo_last_error;
    t.finalize = gloo_finalize;
    t.version = s.version.c_str();
    t.dtypes = declared_dtypes();
    t.ops = DPCHECK_OP_BIT(DPCHECK_SUM) | DPCHECK_OP_BIT(DPCHECK_AVG) | DPCHECK_OP_BIT(DPCHECK_MIN) |
            DPCHECK_OP_BIT(DPCHECK_MAX);
    return t;
  }();
  return &table;
}

/* The variable that chooses the algorithm (include/dpcheck/plugin.h, "Environment"): a repro bundle
   records its value, and a replay under another value is warned of, by name. */
extern "C" __attribute__((visibility("default"))) const char* const* dpcheck_plugin_env(void) {
  static const char* const names[] = {"DPCHECK_GLOO_ALGORITHM", nullptr};
  return names;
}
