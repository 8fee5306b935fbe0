// dpcheck conform: does a user's plugin (include/dpcheck/plugin.h) keep the promises? Each check is a
// row of one table: a collective or kernel exercised on inputs whose right answer is known exactly or
// within a derived bound, a fingerprint of how the plugin sums (information, not a verdict), and then
// every property of `verify` with the plugin in place. A failing row names the promise that broke,
// the minimal case, and the command that replays that case alone (--check NAME --case TEXT).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "src/target/target.hpp"

namespace dpcheck {

// unsupported: the plugin declares that it does not take what the check asks (a dtype, an op; see
// include/dpcheck/plugin.h, "Capabilities"), so the check is neither passed nor failed.
// switches: the schedule given with --schedule is followed bit for bit at some counts, and at the
// others the library hands the call to another schedule whose bits it gives exactly (a switch by size,
// as Open MPI's ring makes below N elements). The claim was the user's, not the library's, so this is
// not a failure; the row says where the prediction stops and what the library does there.
enum class ConformVerdict { pass, fail, info, skip, unsupported, switches };
// "pass", "FAIL", "info", "skip", "unsupported", "switches"
std::string_view conform_verdict_name(ConformVerdict v);

struct ConformRow {
  std::string section;  // "collectives", "robustness", "fingerprint", "kernels", "properties"
  std::string check;    // its name, for --check: "allreduce float32 sum", "linear_forward"
  ConformVerdict verdict = ConformVerdict::pass;
  std::string detail;   // what was covered or measured ("counts 0..67108864, 31 sizes, 4 offsets")
  std::string promise;  // failure: the promise that broke ("every rank holds the exact sum")
  std::string minimal;  // failure: the minimal case, as --case takes it ("count=5 offset=1")
  std::string replay;   // failure: the command that replays the minimal case (or verify's replay line)
  double seconds = 0;
  // Kernel checks: the largest error ratio (error / derived bound) in each class of shapes drawn
  // ("tiny", "odd", "past a power of two", "rows = 0", ...), for the report.
  std::map<std::string, double> ratio_by_shape_class;
};

struct ConformOptions;
// verify's properties as conform rows ("properties" section): the checks' names ("property <name>", in
// the table's order) and what runs those that `options` asks for against `target`, calling on_row for
// each, each failing row's replay being verify's replay line.
struct PropertyRows {
  std::vector<std::string> checks;
  std::function<std::vector<ConformRow>(const Target& target, const ConformOptions& options)> run;
};

struct ConformOptions {
  std::uint64_t seed = 1;
  int cases = 100;  // per property of verify; random shapes per kernel check
  std::chrono::milliseconds timeout = Communicator::default_timeout;
  std::string check;      // non-empty: run that check alone
  std::string case_text;  // with check: that one case (a row's `minimal`)
  // verify's properties, run after the plugin's own checks; none when null. Conform's checks are a
  // layer below the properties, so the caller gives them (properties/conform_rows.hpp).
  const PropertyRows* properties = nullptr;
  std::size_t max_bytes = std::size_t{64} << 20;  // the largest buffer a collective check passes
  // Kernel checks: the largest dimension (rows, in, out) a drawn shape reaches.
  int max_kernel_size = 1024;
  // The full sweep (every count up to max_bytes on every world size) rather than the quick default.
  bool thorough = false;
  // --schedule: the all-reduce schedule the communicator claims (reference/allreduce_schedule.hpp's
  // parse_schedule text); its bits are checked against the schedule's emulation. Empty: not checked.
  std::string schedule;
  // --allreduce-only: the all-reduce's checks alone (is_allreduce_check), for a library whose variables
  // choose its all-reduce's algorithm and nothing else (MPICH's, Open MPI's), so that each algorithm's row
  // does not run the broadcasts, all-gathers and barriers that are the same under every one.
  bool allreduce_only = false;
  // World sizes besides the main one that the collective checks also run on (ranks as threads), with
  // counts up to 2^20 elements: a tree or ring that only works for some N meets the others.
  std::vector<int> extra_world_sizes;
  // The command that runs conform_absent_rank_probe in a child process (a hang there must not end the
  // run); empty: the check is skipped, with this as the reason.
  std::vector<std::string> absent_rank_command;
  std::string absent_rank_skip = "not run";
  // The command line that replays a case: "dpcheck conform --kernels ./libk.so" (the launcher prefix
  // and --world-size included), to which " --check '<name>' --case '<minimal>'" is appended.
  std::string replay_prefix;
  // A mutant of conform's own checks (mutants/mutants.hpp), which the property that judges them
  // (conform_rows_catch_broken_communicators) hands on; "" for none.
  std::string mutant;
  // Called as each row is decided, so that a long run shows progress and a crash leaves the rows so far.
  std::function<void(const ConformRow&)> on_row;
  // Called as a property of verify runs its cases, with the row's check ("property <name>"), the cases
  // tried so far and the cases it runs (for a progress line).
  std::function<void(const std::string& check, std::int64_t cases, std::int64_t total)> on_cases;
};

// The kernels of `target.kernels` (a plugin path): each op it provides against the float64 reference
// within the derived bound, on shapes drawn in classes up to options.max_kernel_size (tiny, tile
// edges, odd, past a power of two, large, rows = 0), at unaligned offsets, with outputs poisoned with
// NaN before each call, accumulate both ways; run-to-run bitwise determinism; then, with options.properties,
// every property of verify with the plugin's kernels in the engine. UsageError when the plugin cannot
// be loaded; Error on a runtime fault.
std::vector<ConformRow> conform_kernels(const Target& target, const ConformOptions& options);

// The names of conform_kernels' checks, in the order they run.
std::vector<std::string> conform_kernel_checks();

// The communicator of `target.backend` (a plugin, or a built-in backend such as mpi-native) on a world of `world_size`
// ranks (the launcher's world when target.process_world is set).
std::vector<ConformRow> conform_comm(const Target& target, int world_size, const ConformOptions& options);

// The names of conform_comm's checks for a world of `world_size` ranks, in the order they run.
std::vector<std::string> conform_comm_checks();

// Every check of a communicator that runs on a world the caller made, by name, in order: the collective
// checks of conform_comm_checks() (not the absent rank, which needs a world of its own, nor the
// fingerprint, which reports and does not judge; nor an avg of int64, which dpcheck's own backends
// refuse), then the promises only dpcheck's own backends make
// (conform/conform_comm_backends.hpp), which conform does not run against a plugin. The tests run this
// suite on every built-in backend (tests/comm_conformance.hpp).
std::vector<std::string> conform_comm_suite();

// The check `name` of conform_comm_suite() on `comm`, every case of it that options allow (counts up to
// options.max_bytes, options.thorough, options.seed), on every rank (collective: every rank calls it).
// Returns "" when it passed, else the first failing case, the first rank that saw it fail and what it
// saw, and the promise that broke: the same text on every rank. UsageError for another name. Where it
// failed and `replay` is given, rank 0's `replay` gets the row's replay line, as `dpcheck conform` prints
// it (options.replay_prefix, the world size, --check and --case).
std::string run_conform_comm_check(Communicator& comm, const std::string& name, const ConformOptions& options,
                                   std::string* replay = nullptr);

// UsageError unless `check` (when given) names a check of conform_comm or a property of verify
// ("property <name>"), and `case_text` (when given) is a case of that check. Run before any output.
void check_conform_comm_selection(const std::string& check, const std::string& case_text,
                                  const PropertyRows* properties);
// A --check of "property <name>": UsageError unless `properties` has it (naming those it has), or when
// there are none.
void require_property_check(const std::string& check, const PropertyRows* properties);
// Whether a check of conform_comm_checks() judges the all-reduce: its exact sums in every dtype and op,
// the buffer reused, the same bits and run to run, the schedule, and the fingerprint.
bool is_allreduce_check(const std::string& name);
// The count of elements --case gives ("count=5 offset=1" -> 5), for sizing the run before any buffer
// is allocated; 0 when there is no case. Call after check_conform_comm_selection.
std::size_t conform_case_count(const std::string& check, const std::string& case_text);

// The hidden half of the "absent rank" check, run in a child process (ranks as threads): every rank
// but the last calls allreduce, the last never does; prints one line saying how each rank's call
// ended and returns 0 when every waiting rank's call failed within the timeout (a hang ends the
// process through the watchdog, exit 3).
int conform_absent_rank_probe(const Target& target, int world_size);

}  // namespace dpcheck
