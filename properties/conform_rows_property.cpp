// conform_rows_catch_broken_communicators: conform's own checks, judged. A case draws three
// communicators, each with one realistic defect (or a correct one) and a world of 2 to 8 ranks as
// threads, runs the conform row meant for each on it in-process (run_conform_comm_check, the code
// `dpcheck conform` runs), and demands:
//   - a defect that the world shows fails its row, with a case (conform's minimal one: its cases rise),
//     and the row's replay line, run as printed (its --world-size, --check and --case), fails again at
//     that case;
//   - a defect the world cannot show (a tree for powers of two on 4 ranks) passes, as it must;
//   - a correct communicator -- dpcheck's own, or one exact in another order (every rank sums from the
//     last rank down) -- passes a row drawn from the all-reduce's, the same-bits and run-to-run ones,
//     and the schedule it does follow.
// Beside them, one kernel table in-process: a linear forward that drops the last in % 4 terms, an
// activation that leaves the last n % 8 elements unwritten, or a correct linear forward in another order,
// through conform's kernel row for it, with the same demands (a minimal case that its replay line's
// --check and --case fail again; a pass for the correct one).
// A weakened check passes a broken communicator as it passes a correct one, so no run of conform
// against a correct library can tell it apart; this property can.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "conform/conform.hpp"
#include "dpcheck/plugin.h"
#include "properties/common.hpp"
#include "src/comm.hpp"
#include "src/dtype.hpp"
#include "src/low_precision.hpp"
#include "src/plugin/kernel_plugin.hpp"

namespace dpcheck {

namespace {

enum class Kind {
  local,             // dpcheck's own (rank order)
  reverse_order,     // exact in another order: every rank sums from rank N - 1 down
  own_order,         // each rank sums starting from itself
  call_order,        // the order turns by one rank each call, the same on every rank
  some_ranks_turn,   // every other call each rank sums from itself: rank 0's bits never change, the others' do
  pow2_tree,         // a tree built for powers of two: ranks past the largest power of two are never added
  chunk_off_by_one,  // each chunk after the first starts one element late: its first element misses a rank
  avg_wrong_n,       // avg divides by N rounded up to a power of two (a buffer count padded)
  avg_bf16_scale,    // avg multiplies by 1/N held in bfloat16 (a scale factor kept in the 16-bit format)
  f16_as_integers,   // float16 added as the integers of its bit patterns (gloo::float16's bug)
  bf16_as_f16,       // bfloat16 declared, but its buffers read and written as float16
  f64_in_f32,        // float64 declared, but summed in float32
  max_as_unsigned,   // 16-bit max compares the bit patterns as unsigned integers: negatives lose
};

struct Defect {
  Kind kind;
  std::string_view name;
  std::string_view row;           // the conform row that must fail it; "" for a correct communicator
  std::string_view schedule;      // the schedule it claims (--schedule), "" for none
  int min_world = 2;              // the smallest world that shows it
  bool not_power_of_two = false;  // shows only where N is no power of two
  bool shows(int n) const {
    return n >= min_world && (!not_power_of_two || !std::has_single_bit(static_cast<unsigned>(n)));
  }
};

constexpr Defect kDefects[] = {
    {Kind::local, "dpcheck's own communicator", "", ""},
    {Kind::local, "dpcheck's own communicator, claiming the rank-order schedule it follows", "", "rank-order"},
    {Kind::reverse_order, "a communicator that sums from the last rank down on every rank", "", ""},
    {Kind::own_order, "a communicator whose ranks each sum from themselves", "same bits on every rank float32 sum", "",
     3},
    {Kind::own_order, "a communicator whose ranks each sum from themselves", "same bits on every rank bfloat16 sum", "",
     3},
    {Kind::call_order, "a communicator whose order turns with every call", "run-to-run float32 sum", "", 3},
    {Kind::some_ranks_turn, "a communicator whose ranks but rank 0 sum from themselves every other call",
     "run-to-run float32 sum", "", 3},
    {Kind::pow2_tree, "a tree built for powers of two", "allreduce float32 sum", "", 2, true},
    {Kind::chunk_off_by_one, "a ring whose chunks after the first start one element late", "allreduce float32 sum", ""},
    {Kind::avg_wrong_n, "an average divided by N rounded up to a power of two", "allreduce float32 avg", "", 2, true},
    {Kind::avg_bf16_scale, "an average scaled by 1/N held in bfloat16", "allreduce float32 avg", "", 3, true},
    {Kind::f16_as_integers, "float16 added as integers of its bit patterns", "allreduce float16 sum", ""},
    {Kind::bf16_as_f16, "bfloat16 declared and read as float16", "allreduce bfloat16 sum", ""},
    {Kind::f64_in_f32, "float64 declared and summed in float32", "allreduce float64 sum", ""},
    {Kind::max_as_unsigned, "a 16-bit max of the bit patterns as unsigned integers", "allreduce bfloat16 max", ""},
    {Kind::local, "dpcheck's own communicator (rank order), claiming a ring", "schedule float32 sum", "ring", 3},
};

// The rows a correct communicator is held to (and, for one claiming its schedule, the schedule's).
constexpr std::string_view kCorrectRows[] = {"allreduce float32 sum",
                                             "allreduce float32 avg",
                                             "allreduce float64 sum",
                                             "allreduce float64 avg",
                                             "allreduce bfloat16 sum",
                                             "allreduce bfloat16 avg",
                                             "allreduce float16 sum",
                                             "allreduce float16 avg",
                                             "allreduce bfloat16 max",
                                             "allreduce float16 max",
                                             "same bits on every rank float32 sum",
                                             "same bits on every rank bfloat16 avg",
                                             "run-to-run float32 sum",
                                             "run-to-run float16 sum"};
constexpr std::string_view kScheduleRows[] = {"schedule float32 sum", "schedule bfloat16 avg", "schedule float16 sum"};

// The defect's all-reduce on host copies of every rank's buffer, gathered through the host
// communicator; every call it does not break goes to the inner communicator.
class DefectiveComm final : public ForwardingCommunicator {
 public:
  DefectiveComm(Communicator& inner, Kind kind) : ForwardingCommunicator(inner), kind_(kind) {}

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const std::uint64_t call = calls_++;
    if (!breaks(dtype, op)) return inner_.allreduce(buf, count, dtype, op);
    const auto n = static_cast<std::size_t>(size());
    const std::size_t width = dtype_size(dtype);
    std::vector<unsigned char> mine(count * width), all(count * width * n);
    inner_.to_host(buf, mine.data(), mine.size());
    inner_.host().allgather(mine.data(), all.data(), count, dtype);
    for (std::size_t i = 0; i < count; ++i) put(mine.data(), i, dtype, element(all.data(), count, i, dtype, op, call));
    inner_.from_host(mine.data(), buf, mine.size());
  }

 private:
  bool breaks(DType dtype, ReduceOp op) const {
    const bool sum_or_avg = op == ReduceOp::sum || op == ReduceOp::avg;
    const bool floating = dtype == DType::f32 || dtype == DType::f64 || is_16bit_float(dtype);
    switch (kind_) {
      case Kind::local: return false;
      case Kind::reverse_order:
      case Kind::own_order:
      case Kind::call_order:
      case Kind::some_ranks_turn:
      case Kind::pow2_tree:
      case Kind::chunk_off_by_one: return floating && sum_or_avg;
      case Kind::avg_wrong_n: return floating && op == ReduceOp::avg;
      case Kind::avg_bf16_scale: return (dtype == DType::f32 || dtype == DType::f64) && op == ReduceOp::avg;
      case Kind::f16_as_integers: return dtype == DType::f16 && op == ReduceOp::sum;
      case Kind::bf16_as_f16: return dtype == DType::bf16 && op == ReduceOp::sum;
      case Kind::f64_in_f32: return dtype == DType::f64 && sum_or_avg;
      case Kind::max_as_unsigned: return is_16bit_float(dtype) && op == ReduceOp::max;
    }
    return false;
  }

  static std::uint16_t bits16(const unsigned char* p, std::size_t k) {
    std::uint16_t b;
    std::memcpy(&b, p + 2 * k, 2);
    return b;
  }
  // Element k of a buffer of dtype, widened exactly (bfloat16 read as float16 by bf16_as_f16).
  double get(const unsigned char* p, std::size_t k, DType dtype) const {
    switch (dtype) {
      case DType::f32: {
        float v;
        std::memcpy(&v, p + 4 * k, 4);
        return v;
      }
      case DType::f64: {
        double v;
        std::memcpy(&v, p + 8 * k, 8);
        return v;
      }
      case DType::bf16:
        return kind_ == Kind::bf16_as_f16 ? fp16_bits_to_float(bits16(p, k)) : bf16_bits_to_float(bits16(p, k));
      default: return fp16_bits_to_float(bits16(p, k));
    }
  }
  // v rounded to the buffers' format (float32 for f64_in_f32).
  double rounded(double v, DType dtype) const {
    switch (dtype) {
      case DType::f32: return static_cast<float>(v);
      case DType::f64: return kind_ == Kind::f64_in_f32 ? static_cast<double>(static_cast<float>(v)) : v;
      case DType::bf16:
        if (kind_ == Kind::bf16_as_f16) return fp16_bits_to_float(float_to_fp16_bits(static_cast<float>(v)));
        return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
      default: return fp16_bits_to_float(float_to_fp16_bits(static_cast<float>(v)));
    }
  }
  void put(unsigned char* p, std::size_t k, DType dtype, double v) const {
    switch (dtype) {
      case DType::f32: {
        const auto f = static_cast<float>(v);
        std::memcpy(p + 4 * k, &f, 4);
        return;
      }
      case DType::f64: std::memcpy(p + 8 * k, &v, 8); return;
      default: {
        std::uint16_t b = 0;
        if (kind_ == Kind::f16_as_integers || kind_ == Kind::max_as_unsigned) b = static_cast<std::uint16_t>(v);
        else if (dtype == DType::bf16 && kind_ != Kind::bf16_as_f16) b = float_to_bf16_bits(static_cast<float>(v));
        else b = float_to_fp16_bits(static_cast<float>(v));
        std::memcpy(p + 2 * k, &b, 2);
      }
    }
  }

  // Element i of the result: the ranks in the defect's order, each addition rounded to the format.
  // (The two defects of bit patterns return the pattern itself, which put stores as it is.)
  double element(const unsigned char* all, std::size_t count, std::size_t i, DType dtype, ReduceOp op,
                 std::uint64_t call) const {
    const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    const std::size_t width = dtype_size(dtype);
    const auto at = [&](std::size_t r) { return all + r * count * width; };
    if (kind_ == Kind::f16_as_integers || kind_ == Kind::max_as_unsigned) {
      std::uint16_t acc = bits16(at(0), i);
      for (std::size_t r = 1; r < n; ++r) {
        const std::uint16_t b = bits16(at(r), i);
        acc = kind_ == Kind::f16_as_integers ? static_cast<std::uint16_t>(acc + b) : std::max(acc, b);
      }
      return acc;
    }
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < n; ++k) {
      switch (kind_) {
        case Kind::reverse_order: order.push_back(n - 1 - k); break;
        case Kind::own_order: order.push_back((me + k) % n); break;
        case Kind::call_order: order.push_back((call + k) % n); break;
        case Kind::some_ranks_turn: order.push_back((call % 2 * me + k) % n); break;
        default: order.push_back(k);
      }
    }
    if (kind_ == Kind::pow2_tree) order.resize(std::bit_floor(n));
    if (kind_ == Kind::chunk_off_by_one)
      for (std::size_t c = 1; c < n; ++c) {
        const std::size_t begin = count / n * c + std::min(c, count % n),
                          end = count / n * (c + 1) + std::min(c + 1, count % n);
        if (i == begin && begin < end) order.erase(std::find(order.begin(), order.end(), c - 1));
      }
    double acc = get(at(order[0]), i, dtype);
    for (std::size_t k = 1; k < order.size(); ++k) acc = rounded(acc + get(at(order[k]), i, dtype), dtype);
    if (op != ReduceOp::avg) return acc;
    if (kind_ == Kind::avg_bf16_scale)
      return rounded(acc * static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(1.0f / static_cast<float>(n)))),
                     dtype);
    const double divisor = kind_ == Kind::avg_wrong_n ? static_cast<double>(std::bit_ceil(n)) : static_cast<double>(n);
    return rounded(dtype == DType::f64 && kind_ != Kind::f64_in_f32
                       ? acc / divisor
                       : static_cast<double>(static_cast<float>(acc) / static_cast<float>(divisor)),
                   dtype);
  }

  Kind kind_;
  std::uint64_t calls_ = 0;
};

// The row's verdict on the defect's communicator over n ranks as threads: "" or its failure, the same
// text on every rank.
std::string run_row(const Defect& d, int n, const std::string& row, const ConformOptions& options,
                    std::string* replay = nullptr) {
  Target local;
  std::string said;
  std::mutex mu;
  run_world(local, n, [&](Communicator& comm) {
    DefectiveComm broken(comm, d.kind);
    const std::string got = run_conform_comm_check(broken, row, options, comm.rank() == 0 ? replay : nullptr);
    const std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) said = got;
  });
  return said;
}

// The value of `flag` in a printed command line: " --world-size 3" -> "3", " --case 'count=5 offset=1'"
// -> "count=5 offset=1"; nullopt when the line has no such flag.
std::optional<std::string> flag_value(const std::string& line, const std::string& flag) {
  const std::size_t at = line.find(" " + flag + " ");
  if (at == std::string::npos) return std::nullopt;
  const std::size_t from = at + flag.size() + 2;
  if (from < line.size() && line[from] == '\'') {
    const std::size_t end = line.find('\'', from + 1);
    return end == std::string::npos ? std::nullopt : std::optional(line.substr(from + 1, end - from - 1));
  }
  return line.substr(from, line.find(' ', from) == std::string::npos ? std::string::npos : line.find(' ', from) - from);
}

// "case count=5 offset=1, ..." -> "count=5 offset=1"
std::string case_of(const std::string& failure) {
  const std::string prefix = "case ";
  if (!failure.starts_with(prefix)) return "";
  return failure.substr(prefix.size(), failure.find(',') - prefix.size());
}

// ---- kernels ---------------------------------------------------------------------------------------
// Kernel tables that live in this process, each one op written as a kernel's author writes it, through
// conform's kernel rows (conform_kernels, the code `dpcheck conform --kernels` runs) under a label of
// their own (in_process_kernel_plugin). The ops left out of a table run dpcheck's own.

enum class KernelKind {
  four_partial_sums,      // a dot product in four partial sums, the tail folded in: correct, in another order
  dot_drops_tail,         // unrolled four terms at a time, the last in % 4 terms never added
  activation_drops_tail,  // eight elements at a time, the last n % 8 left unwritten
};

struct KernelDefect {
  KernelKind kind;
  std::string_view name;
  std::string_view row;  // the conform row it is held to
  bool correct;
};

constexpr KernelDefect kKernelDefects[] = {
    {KernelKind::four_partial_sums, "a linear forward in four partial sums (another order, correct)", "linear_forward",
     true},
    {KernelKind::dot_drops_tail, "a linear forward unrolled by four that drops the last in % 4 terms", "linear_forward",
     false},
    {KernelKind::activation_drops_tail, "an activation forward by eights that leaves the last n % 8 unwritten",
     "activation_forward", false},
};

template <KernelKind kKind> int defect_linear_forward(void*, const float* x, const float* w, const float* b, float* y,
                                                      std::int64_t rows, std::int64_t in, std::int64_t out, void*) {
  const std::int64_t body = in - in % 4;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      const float* xr = x + r * in;
      const float* wo = w + o * in;
      float s[4] = {0, 0, 0, 0};
      for (std::int64_t k = 0; k < body; k += 4)
        for (int j = 0; j < 4; ++j) s[j] += xr[k + j] * wo[k + j];
      if constexpr (kKind != KernelKind::dot_drops_tail)
        for (std::int64_t k = body; k < in; ++k) s[k - body] += xr[k] * wo[k];
      y[r * out + o] = (s[0] + s[1]) + (s[2] + s[3]) + b[o];
    }
  return 0;
}

int defect_activation_forward(void*, dpcheck_activation_t activation, const float* x, float* y, std::int64_t n, void*) {
  for (std::int64_t i = 0; i + 8 <= n; i += 8)
    for (std::int64_t j = i; j < i + 8; ++j) y[j] = activation == DPCHECK_RELU ? std::max(x[j], 0.0f) : std::tanh(x[j]);
  return 0;
}

dpcheck_kernel_plugin_t make_kernel_table(KernelKind kind) {
  dpcheck_kernel_plugin_t t{};
  t.abi = DPCHECK_PLUGIN_ABI;
  t.memory = DPCHECK_HOST;
  switch (kind) {
    case KernelKind::four_partial_sums:
      t.name = "four-partial-sums";
      t.linear_forward = defect_linear_forward<KernelKind::four_partial_sums>;
      break;
    case KernelKind::dot_drops_tail:
      t.name = "dot-drops-tail";
      t.linear_forward = defect_linear_forward<KernelKind::dot_drops_tail>;
      break;
    case KernelKind::activation_drops_tail:
      t.name = "activation-drops-tail";
      t.activation_forward = defect_activation_forward;
      break;
  }
  return t;
}

const dpcheck_kernel_plugin_t* kernel_table(KernelKind kind) {
  static const dpcheck_kernel_plugin_t tables[] = {make_kernel_table(KernelKind::four_partial_sums),
                                                   make_kernel_table(KernelKind::dot_drops_tail),
                                                   make_kernel_table(KernelKind::activation_drops_tail)};
  return &tables[static_cast<std::size_t>(kind)];
}

// The kernel row's verdict on the defect: "" or its failure ("case rows=1 in=3 ..., why"), and its replay
// line. The table is run as `dpcheck conform --kernels <label>` runs a plugin.
std::string run_kernel_row(const KernelDefect& d, const ConformOptions& options, std::string* replay = nullptr) {
  Target target;
  target.kernels = "in-process:" + std::string(kernel_table(d.kind)->name);
  in_process_kernel_plugin(target.kernels, kernel_table(d.kind));
  ConformOptions o = options;
  o.check = std::string(d.row);
  o.properties = nullptr;
  const std::vector<ConformRow> rows = conform_kernels(target, o);
  if (rows.size() != 1)
    fail_case("conform --kernels --check '" + o.check + "' gave " + std::to_string(rows.size()) + " rows");
  const ConformRow& row = rows.front();
  if (replay) *replay = row.replay;
  if (row.verdict == ConformVerdict::pass) return "";
  return "case " + row.minimal + ", " + row.detail;
}

// One case: the communicator, its world, the row it is held to, and the seed of the row's random inputs.
struct ConformCase {
  std::size_t defect = 0;  // into kDefects
  int world = 2;
  std::string row;
  std::uint64_t seed = 1;
  const Defect& d() const { return kDefects[defect]; }
  // "a tree built for powers of two on 3 ranks, row 'allreduce float32 sum', seed 5"
  std::string describe() const {
    return std::string(d().name) + " on " + std::to_string(world) + " ranks, row '" + row + "'" +
           (d().schedule.empty() ? "" : " (--schedule " + std::string(d().schedule) + ")") + ", seed " +
           std::to_string(seed);
  }
};

void showValue(const ConformCase& c, std::ostream& os) { os << c.describe(); }

// The defect uniformly (correct communicators among them), a world of 2 to 8 ranks, shrinking to 2; a
// correct communicator's row drawn from those it is held to.
rc::Gen<ConformCase> gen_conform_case() {
  return rc::gen::exec([] {
    ConformCase c;
    c.defect = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kDefects)));
    c.world = *rc::gen::inRange(2, 9);
    const std::size_t correct_pick = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kCorrectRows)));
    const std::size_t schedule_pick = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kScheduleRows)));
    c.seed = *rc::gen::inRange<std::uint64_t>(1, 1u << 20);
    c.row = std::string(c.d().row);
    if (c.row.empty()) c.row = c.d().schedule.empty() ? kCorrectRows[correct_pick] : kScheduleRows[schedule_pick];
    return c;
  });
}

}  // namespace

namespace {

// One communicator of a case: its row run as conform runs it, and judged.
void check_conform_case(const ConformCase& c, const Target& target) {
  const Defect& d = c.d();
  const int n = c.world;
  ConformOptions options;
  options.seed = c.seed;
  options.max_bytes = std::size_t{1} << 12;  // counts to 1021 float32 elements: conform's small cases
  options.schedule = std::string(d.schedule);
  options.mutant = target.mutant;
  options.replay_prefix = "dpcheck conform --comm DEFECT";
  const std::string what = c.describe();
  std::string line;
  const std::string failure = run_row(d, n, c.row, options, &line);
  const bool correct = d.row.empty(), should_fail = !correct && d.shows(n);
  RC_CLASSIFY(correct, "a correct communicator");
  RC_CLASSIFY(should_fail, "a defect the world shows");
  RC_CLASSIFY(!correct && !should_fail, "a defect the world cannot show");
  if (!should_fail) {
    if (!failure.empty()) fail_case("conform failed " + what + ", which keeps that row's promise: " + failure);
    return;
  }
  if (failure.empty()) fail_case("conform passed " + what + ": the row is meant to catch it");
  // Replayed as its line prints it -- the world size, the check and the case it names -- that case alone
  // fails again (with values of its own where the defect depends on the calls before it). A line without
  // its world size replays on conform's default worlds, not on the one it failed on.
  const std::string minimal = case_of(failure);
  if (minimal.empty()) fail_case("conform failed " + what + " without naming a case: " + failure);
  const std::optional<std::string> world = flag_value(line, "--world-size"), check = flag_value(line, "--check"),
                                   case_text = flag_value(line, "--case");
  if (!world || !check || !case_text)
    fail_case("conform failed " + what + " at case '" + minimal + "', and its replay line names no " +
              (!world   ? "world size"
               : !check ? "check"
                        : "case") +
              ": " + line);
  if (world->empty() || world->find_first_not_of("0123456789") != std::string::npos || world->size() > 4)
    fail_case("the replay line of " + what + " names the world size '" + *world + "': " + line);
  options.case_text = *case_text;
  const std::string again = run_row(d, std::stoi(*world), *check, options);
  if (case_of(again) != minimal)
    fail_case("conform failed " + what + " at case '" + minimal + "' (" + failure + "), and its replay line (" + line +
              ") " + (again.empty() ? std::string("passes") : "fails otherwise: " + again));
}

// One kernel of a case: a table of kKernelDefects and the seed of its row's shapes. Every defect shows
// on conform's shapes (tiny and tile edges hold sizes off every multiple of four and eight), and a
// correct one passes; a failure's replay line, its --check and --case, fails again at that case.
struct KernelCase {
  std::size_t defect = 0;
  std::uint64_t seed = 1;
  const KernelDefect& d() const { return kKernelDefects[defect]; }
  std::string describe() const {
    return std::string(d().name) + ", row '" + std::string(d().row) + "', seed " + std::to_string(seed);
  }
};

void showValue(const KernelCase& c, std::ostream& os) { os << c.describe(); }

rc::Gen<KernelCase> gen_kernel_case() {
  return rc::gen::exec([] {
    KernelCase c;
    c.defect = *uniform(rc::gen::inRange<std::size_t>(0, std::size(kKernelDefects)));
    c.seed = *rc::gen::inRange<std::uint64_t>(1, 1u << 20);
    return c;
  });
}

void check_kernel_case(const KernelCase& c, const Target& target) {
  ConformOptions options;
  options.seed = c.seed;
  options.cases = 12;
  options.max_kernel_size = 70;  // conform's tiny and tile-edge shapes
  options.mutant = target.mutant;
  options.replay_prefix = "dpcheck conform --kernels DEFECT";
  const std::string what = c.describe();
  std::string line;
  const std::string failure = run_kernel_row(c.d(), options, &line);
  RC_CLASSIFY(c.d().correct, "a correct kernel");
  if (c.d().correct) {
    if (!failure.empty()) fail_case("conform failed " + what + ", which keeps that row's promise: " + failure);
    return;
  }
  if (failure.empty()) fail_case("conform passed " + what + ": the row is meant to catch it");
  const std::string minimal = case_of(failure);
  const std::optional<std::string> check = flag_value(line, "--check"), case_text = flag_value(line, "--case");
  if (minimal.empty() || !check || !case_text || *check != c.d().row)
    fail_case("conform failed " + what + ", but its replay line does not name the row and the case: " + line);
  options.case_text = *case_text;
  const std::string again = run_kernel_row(c.d(), options);
  if (case_of(again) != minimal)
    fail_case("conform failed " + what + " at case '" + minimal + "' (" + failure + "), and its replay line (" + line +
              ") " + (again.empty() ? std::string("passes") : "fails otherwise: " + again));
}

// Communicators a case: a defect that shows on some worlds only (no power of two, three ranks or more)
// is drawn in one communicator of thirty or so, and verify's hundred cases should meet each.
constexpr std::size_t kPerCase = 3;

}  // namespace

void conform_rows_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const std::vector<ConformCase> cases = *rc::gen::container<std::vector<ConformCase>>(kPerCase, gen_conform_case());
  int largest = 0;
  std::string note;
  for (const ConformCase& c : cases) {
    largest = std::max(largest, c.world);
    note += (note.empty() ? "" : "; ") + c.describe();
  }
  const KernelCase kernel = *gen_kernel_case();
  note += "; " + kernel.describe();
  record.size = {0, largest, 0, 0};
  record.note = note;
  for (const ConformCase& c : cases) check_conform_case(c, target);
  check_kernel_case(kernel, target);
}

}  // namespace dpcheck
