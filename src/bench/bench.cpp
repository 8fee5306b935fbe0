// The `dpcheck bench` harness (src/bench/bench.hpp): the memcpy baseline, the allreduce rows, the table and
// its JSON form, the parsing of size and rank lists, and the rows that come from worker processes
// under mpirun.
#include "src/bench/bench.hpp"

#include <algorithm>
#include <barrier>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <ostream>
#include <span>
#include <thread>

#include "src/error.hpp"
#include "src/io/process.hpp"

namespace dpcheck::bench {

namespace {

using Clock = std::chrono::steady_clock;

// 64-byte aligned, so that the local backend's slices start on cache lines.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t bytes)
      : data_(static_cast<unsigned char*>(::operator new (std::max<std::size_t>(bytes, 64), std::align_val_t{64}))) {}
  ~AlignedBuffer() { ::operator delete (data_, std::align_val_t{64}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  unsigned char* data() const { return data_; }

 private:
  unsigned char* data_;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Rank r's element j. Every partial sum is a small integer, so the float32 sum is exact in any order
// and the check is 0 ULP; the value changes with j and with r, so a misplaced slice, a skipped rank or
// a stale buffer all show up.
float fill_value(int rank, std::size_t j) { return static_cast<float>(j % 251 + static_cast<std::size_t>(rank)); }
float expected_sum(int ranks, std::size_t j) {
  const auto n = static_cast<std::size_t>(ranks);
  return static_cast<float>(n * (j % 251) + n * (n - 1) / 2);
}

void fill(std::span<float> buf, int rank) {
  for (std::size_t j = 0; j < buf.size(); ++j) buf[j] = fill_value(rank, j);
}

// One rank's share of bench_allreduce for one N. Collective control decisions (the iteration count,
// the #wrong total) go through the communicator under test, which is what an "mpi" backend will need
// as well; rank 0 keeps the rows.
void allreduce_rank(Communicator& c, const std::string& backend, const AllreduceConfig& cfg, double memcpy_gbs,
                    std::vector<AllreduceRow>& rows) {
  const std::size_t max_bytes = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  AlignedBuffer storage(max_bytes);
  auto* all = reinterpret_cast<float*>(storage.data());
  // The first touch of fresh memory is two orders of magnitude slower than later passes here; pay it
  // once, before anything is timed.
  fill(std::span<float>(all, max_bytes / 4), c.rank());

  const int n = c.size();
  for (std::size_t bytes : cfg.sizes) {
    const std::size_t count = bytes / 4;
    const std::span<float> buf(all, count);
    fill(buf, c.rank());
    for (int i = 0; i < cfg.warmup; ++i) c.allreduce(buf, ReduceOp::sum);

    std::int64_t iters = cfg.iters;
    if (iters == 0) {
      const auto t0 = Clock::now();
      c.allreduce(buf, ReduceOp::sum);
      const double t = std::max(seconds(Clock::now() - t0), 1e-7);
      iters = std::clamp<std::int64_t>(static_cast<std::int64_t>(cfg.row_seconds / t), 5, 20'000);
      c.broadcast(std::span<std::int64_t>(&iters, 1), 0);  // rank 0's estimate decides for everyone
    }

    // Back-to-back calls, each timed from the end of the previous one, as a training loop issues them.
    // The values grow with every in-place sum; only their timing matters here.
    std::vector<double> times(static_cast<std::size_t>(iters));
    c.barrier();
    auto prev = Clock::now();
    for (double& t : times) {
      c.allreduce(buf, ReduceOp::sum);
      const auto now = Clock::now();
      t = seconds(now - prev);
      prev = now;
    }

    // The check, as nccl-tests does it: fresh inputs, one more call, every element against its closed form.
    fill(buf, c.rank());
    c.allreduce(buf, ReduceOp::sum);
    std::uint64_t wrong = 0;
    for (std::size_t j = 0; j < count; ++j) wrong += buf[j] != expected_sum(n, j) ? 1 : 0;
    std::uint64_t wrong_total = 0;
    for (std::uint64_t w : c.allgather_value<std::uint64_t>(wrong)) wrong_total += w;

    if (c.rank() != 0) continue;
    AllreduceRow row;
    row.backend = backend;
    row.ranks = n;
    row.bytes = bytes;
    row.count = count;
    row.iters = static_cast<int>(iters);
    const double t = median(times);
    row.time_us = t * 1e6;
    row.algbw_gbs = static_cast<double>(bytes) / t / 1e9;
    row.busbw_gbs = row.algbw_gbs * 2.0 * (n - 1) / n;
    row.traffic_gbs = 2.0 * n * static_cast<double>(bytes) / t / 1e9;
    row.memcpy_ratio = memcpy_gbs > 0 ? row.traffic_gbs / memcpy_gbs : 0;
    row.wrong = wrong_total;
    rows.push_back(row);
  }
}

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::vector<std::string_view> split_on(std::string_view list, char sep) {
  std::vector<std::string_view> items;
  for (;;) {
    const std::size_t comma = list.find(sep);
    items.push_back(list.substr(0, comma));
    if (comma == std::string_view::npos) return items;
    list.remove_prefix(comma + 1);
  }
}

std::vector<std::string_view> split_commas(std::string_view list) { return split_on(list, ','); }

}  // namespace

double median(std::vector<double> v) {
  DPCHECK_ASSERT(!v.empty());
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

BenchBackend thread_backend(const Backend& row, std::string name, std::chrono::milliseconds timeout) {
  DPCHECK_ASSERT(row.ranks_as_threads());
  return {std::move(name), [&row, timeout](int ranks, const std::function<void(Communicator&)>& fn) {
            row.run_threads(ranks, fn, timeout);
          }};
}

BenchBackend process_backend(const Backend& row, std::string name, Communicator& world) {
  DPCHECK_ASSERT(row.may_run_under_launcher());
  return {std::move(name), [&row, &world](int ranks, const std::function<void(Communicator&)>& fn) {
            if (ranks != world.size())
              throw UsageError("this world has " + std::to_string(world.size()) + " processes, not " +
                               std::to_string(ranks));
            row.run_processes(world, fn);
          }};
}

MemcpyBaseline measure_memcpy(std::size_t bytes, int threads, int repeats) {
  if (bytes == 0 || threads < 1 || repeats < 1)
    throw UsageError("memcpy baseline: bytes, threads and repeats must be positive");
  AlignedBuffer src(bytes), dst(bytes);
  std::vector<double> times(static_cast<std::size_t>(repeats));
  std::barrier sync(threads);

  const auto copier = [&](int t) {
    const std::size_t lo = bytes * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
    const std::size_t hi = bytes * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
    // Each thread touches the pages it will copy, so the first-touch cost stays out of the timing.
    std::memset(src.data() + lo, 1, hi - lo);
    std::memset(dst.data() + lo, 0, hi - lo);
    for (int rep = -1; rep < repeats; ++rep) {  // rep -1 is an untimed warm-up pass
      sync.arrive_and_wait();
      const auto t0 = Clock::now();
      std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
      sync.arrive_and_wait();
      if (t == 0 && rep >= 0) times[static_cast<std::size_t>(rep)] = seconds(Clock::now() - t0);
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(copier, t);
  copier(0);
  for (std::thread& h : helpers) h.join();

  MemcpyBaseline b;
  b.bytes = bytes;
  b.threads = threads;
  b.repeats = repeats;
  b.gbs = 2.0 * static_cast<double>(bytes) / median(times) / 1e9;
  return b;
}

std::vector<AllreduceRow> bench_allreduce(const BenchBackend& backend, const AllreduceConfig& cfg,
                                          const MemcpyBaseline& baseline) {
  if (cfg.sizes.empty() || cfg.ranks.empty()) throw UsageError("allreduce: no sizes or no rank counts to run");
  for (std::size_t s : cfg.sizes)
    if (s == 0 || s % 4 != 0)
      throw UsageError("allreduce: size " + std::to_string(s) + " is not a positive multiple of 4 bytes (float32)");
  for (int n : cfg.ranks)
    if (n < 1 || n > max_ranks)
      throw UsageError("allreduce: rank count " + std::to_string(n) + " is not between 1 and " +
                       std::to_string(max_ranks));
  if (cfg.iters < 0 || cfg.warmup < 0) throw UsageError("allreduce: iterations must not be negative");

  std::vector<AllreduceRow> rows;
  for (int n : cfg.ranks) {
    std::vector<AllreduceRow> part;
    backend.run(n, [&](Communicator& c) { allreduce_rank(c, backend.name, cfg, baseline.gbs, part); });
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

void print_allreduce_table(std::ostream& out, const MemcpyBaseline& baseline, const std::vector<AllreduceRow>& rows,
                           const std::vector<std::string>& notes) {
  char line[256];
  out << "# dpcheck bench allreduce: float32 sum, in place; time is the median per call\n";
  std::snprintf(line, sizeof line,
                "# memcpy baseline: %d threads copying %s, bytes read + written: %.2f GB/s (median of %d)\n",
                baseline.threads, size_text(baseline.bytes).c_str(), baseline.gbs, baseline.repeats);
  out << line << "# traffic counts every rank's buffer read once and written once: 2 * N * size / time\n";
  for (const std::string& note : notes) out << "# note: " << note << "\n";
  out << "#\n";
  std::snprintf(line, sizeof line, "# %13s %4s %12s %11s %10s %11s %11s %13s %8s %7s\n", "backend", "N", "size",
                "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "traffic(GB/s)", "/memcpy", "#wrong");
  out << line;
  std::uint64_t wrong = 0;
  for (const AllreduceRow& r : rows) {
    std::snprintf(line, sizeof line, "  %13s %4d %12zu %11zu %10.1f %11.2f %11.2f %13.2f %8.2f %7llu\n",
                  r.backend.c_str(), r.ranks, r.bytes, r.count, r.time_us, r.algbw_gbs, r.busbw_gbs, r.traffic_gbs,
                  r.memcpy_ratio, static_cast<unsigned long long>(r.wrong));
    out << line;
    wrong += r.wrong;
  }
  out << "# wrong elements in all rows: " << wrong << "\n";
}

nlohmann::ordered_json allreduce_json(const MemcpyBaseline& baseline, const std::vector<AllreduceRow>& rows,
                                      const std::vector<std::string>& notes) {
  nlohmann::ordered_json j;
  j["benchmark"] = "allreduce";
  j["dtype"] = "float32";
  j["op"] = "sum";
  j["in_place"] = true;
  j["memcpy"] = {
      {"bytes", baseline.bytes}, {"threads", baseline.threads}, {"repeats", baseline.repeats}, {"gbs", baseline.gbs}};
  j["notes"] = notes;
  j["rows"] = nlohmann::ordered_json::array();
  for (const AllreduceRow& r : rows)
    j["rows"].push_back({{"backend", r.backend},
                         {"ranks", r.ranks},
                         {"bytes", r.bytes},
                         {"count", r.count},
                         {"iters", r.iters},
                         {"time_us", r.time_us},
                         {"algbw_gbs", r.algbw_gbs},
                         {"busbw_gbs", r.busbw_gbs},
                         {"traffic_gbs", r.traffic_gbs},
                         {"memcpy_ratio", r.memcpy_ratio},
                         {"wrong", r.wrong}});
  return j;
}

std::vector<AllreduceRow> allreduce_rows_from_json(const nlohmann::json& j) {
  std::vector<AllreduceRow> rows;
  try {
    for (const nlohmann::json& r : j.at("rows")) {
      AllreduceRow row;
      r.at("backend").get_to(row.backend);
      r.at("ranks").get_to(row.ranks);
      r.at("bytes").get_to(row.bytes);
      r.at("count").get_to(row.count);
      r.at("iters").get_to(row.iters);
      r.at("time_us").get_to(row.time_us);
      r.at("algbw_gbs").get_to(row.algbw_gbs);
      r.at("busbw_gbs").get_to(row.busbw_gbs);
      r.at("traffic_gbs").get_to(row.traffic_gbs);
      r.at("memcpy_ratio").get_to(row.memcpy_ratio);
      r.at("wrong").get_to(row.wrong);
      rows.push_back(row);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("allreduce rows: ") + e.what());
  }
  return rows;
}

// ---- rows from worker processes ----------------------------------------------------------------------

nlohmann::json run_mpi_worker(const MpiWorkerLaunch& launch, int ranks, const std::vector<std::string>& worker_args,
                              std::string_view prefix) {
  std::vector<std::string> args{launch.mpirun,
                                "--allow-run-as-root",
                                "--oversubscribe",
                                "-np",
                                std::to_string(ranks),
                                "-x",
                                "MALLOC_MMAP_MAX_=0",
                                "-x",
                                "MALLOC_TRIM_THRESHOLD_=68719476736",
                                launch.dpcheck};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  std::string command;
  for (const std::string& a : args) command += (command.empty() ? "" : " ") + a;
  ChildOptions child;
  child.argv = args;
  child.input = ChildOptions::Input::null;
  child.out = child.err = ChildOptions::Output::capture;
  child.timeout = launch.limit;
  const ChildResult r = run_child(child);
  const int status = r.shell_status();

  std::string_view rows_json;
  for (std::string_view rest = r.out; !rest.empty();) {
    const std::size_t eol = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, eol);
    if (line.starts_with(prefix)) rows_json = line.substr(prefix.size());
    rest.remove_prefix(std::min(eol + 1, rest.size()));
  }
  if (status != 0 || rows_json.empty()) {
    // The end of the workers' standard error says what went wrong; the start is mostly launcher noise.
    std::string err = r.err;
    if (r.timed_out) err += "\n(stopped after " + std::to_string(launch.limit.count()) + " s)\n";
    if (err.empty()) err = r.out;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    if (err.size() > 2000) err = "..." + err.substr(err.size() - 2000);
    throw Error("`" + command + "` " +
                (status != 0 ? "exited with status " + std::to_string(status) : std::string("printed no rows")) +
                (err.empty() ? std::string() : ":\n" + err));
  }
  nlohmann::json parsed = nlohmann::json::parse(rows_json, nullptr, false);
  if (parsed.is_discarded()) throw Error("`" + command + "` printed rows that are not JSON");
  return parsed;
}

std::vector<AllreduceRow> allreduce_rows_via_mpirun(const MpiWorkerLaunch& launch,
                                                    const std::vector<std::string>& backends,
                                                    const AllreduceConfig& cfg, const MemcpyBaseline& baseline) {
  std::string sizes, names;
  for (std::size_t s : cfg.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  for (const std::string& b : backends) names += (names.empty() ? "" : ",") + b;
  std::vector<AllreduceRow> rows;
  for (int n : cfg.ranks) {
    const nlohmann::json parsed =
        run_mpi_worker(launch, n,
                       {"bench", "allreduce-worker", "--backends", names, "--sizes", sizes, "--iters",
                        std::to_string(cfg.iters), "--warmup", std::to_string(cfg.warmup)},
                       worker_rows_prefix);
    for (AllreduceRow& row : allreduce_rows_from_json(parsed)) {
      row.memcpy_ratio = baseline.gbs > 0 ? row.traffic_gbs / baseline.gbs : 0;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

std::size_t parse_size(std::string_view text) {
  const auto bad = [&](const std::string& why) -> UsageError {
    return UsageError("size '" + std::string(text) + "': " + why);
  };
  if (text.empty()) throw bad("empty");
  if (text.front() == '-') throw bad("sizes must be positive");
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) throw bad("too large");
  if (ec != std::errc{}) throw bad("not a number of bytes (examples: 4096, 4K, 1M, 2G)");
  const std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  int shift = 0;
  if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  else if (!suffix.empty()) throw bad("unknown suffix '" + std::string(suffix) + "' (use K, M or G)");
  if (value == 0) throw bad("sizes must be positive");
  if (value > (std::numeric_limits<std::size_t>::max() >> shift)) throw bad("too large");
  return value << shift;
}

std::vector<std::size_t> parse_sizes(std::string_view list) {
  std::vector<std::size_t> sizes;
  for (std::string_view item : split_commas(list)) sizes.push_back(parse_size(item));
  return sizes;
}

std::vector<int> parse_ranks(std::string_view list) {
  std::vector<int> ranks;
  for (std::string_view item : split_commas(list)) {
    int n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (item.empty() || ec != std::errc{} || end != item.data() + item.size() || n < 1 || n > max_ranks)
      throw UsageError("rank count '" + std::string(item) + "': not a whole number from 1 to " +
                       std::to_string(max_ranks));
    ranks.push_back(n);
  }
  return ranks;
}

}  // namespace dpcheck::bench
