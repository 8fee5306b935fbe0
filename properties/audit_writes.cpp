// audit_sees_every_write: the write audit itself under a property. only_rank0_writes trusts the audit to
// see every write; here the audit is the thing checked. A case plants calls of every kind the audit
// claims to see (src/audit/planted.hpp: create, truncate, append, in-place O_RDWR, openat, creat,
// truncate(), rename, renameat, unlink, remove, link, symlink, mkdir, a shared writable mmap, fopen in
// "w", "a", "r+", "w+", "a+"), each made by a drawn rank other than 0 on a drawn path, and the same kind
// again by rank 0; and reads (O_RDONLY, openat O_RDONLY, fopen "r", a private mmap) by ranks other
// than 0. One launch of `dpcheck plant-writes` under mpirun and the audit makes them all. Every write by
// a rank other than 0 must be recorded with its rank, its path and its kind (the call and its flags)
// and judged an offence; rank 0's must be recorded as rank 0's and not judged; no read may leave a
// record, and nothing else may be judged an offence. Shrinking removes plants, down to the one the
// audit got wrong.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <ostream>
#include <set>
#include <sstream>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "src/audit/audit.hpp"
#include "src/audit/planted.hpp"

namespace dpcheck {

namespace {

namespace fs = std::filesystem;

struct PlantCase {
  int world_size = 2;
  std::vector<audit::Plant> plants;
};

// One line: "2 ranks, 1 planted call: rank 1 open-rdwr '6-a' (named relatively)".
void showValue(const PlantCase& c, std::ostream& os) {
  os << c.world_size << " ranks, " << c.plants.size() << " planted call" << (c.plants.size() == 1 ? "" : "s") << ":";
  for (std::size_t i = 0; i < c.plants.size(); ++i) {
    const audit::Plant& p = c.plants[i];
    os << (i == 0 ? " " : "; ") << "rank " << p.rank << " " << p.kind << " '" << p.name << "'"
       << (p.relative ? " (named relatively)" : "");
  }
}

// Each half of a list, then the list less each chunk of it (RapidCheck's removeChunks). A case launches
// processes, a second or so each, and a failure is mostly one plant among dozens: halving finds it in
// about 2 log2(n) launches, where removeChunks alone keeps windows of every size in turn (50 launches
// and more for a plant in the middle of forty).
rc::Seq<std::vector<std::size_t>> halves_then_chunks(const std::vector<std::size_t>& v) {
  if (v.size() < 2) return rc::shrink::removeChunks(v);
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  return rc::seq::concat(
      rc::seq::just(std::vector<std::size_t>(v.begin(), mid), std::vector<std::size_t>(mid, v.end())),
      rc::shrink::removeChunks(v));
}

// Every index of a list at first; shrinking removes them, down to the few a failure needs.
rc::Gen<std::vector<std::size_t>> all_then_fewer(std::size_t n) {
  return rc::Gen<std::vector<std::size_t>>([n](const rc::Random&, int) {
    std::vector<std::size_t> all(n);
    std::iota(all.begin(), all.end(), std::size_t{0});
    return rc::shrinkable::shrinkRecur(std::move(all), &halves_then_chunks);
  });
}

// A file name with what names may hold: spaces, dashes, UTF-8 beyond ASCII; sometimes in a subdirectory.
// The index keeps the names of one case apart.
std::string gen_name(std::size_t index) {
  static constexpr std::string_view pieces[] = {"a", "b", "z", "0", "7", "-", "_", " ", "\xc3\xa9", "\xe6\x97\xa5"};
  std::string name = std::to_string(index) + "-";
  const int length = *rc::gen::inRange(0, 5);
  for (int i = 0; i < length; ++i) name += pieces[*rc::gen::inRange<std::size_t>(0, std::size(pieces))];
  return *rc::gen::inRange(0, 4) == 3 ? "sub/" + name : name;  // shrinks to no subdirectory
}

// The plants are drawn after the list of which to make, each only if made: shrinking the list first
// leaves no other plant's name or rank to shrink, one launch each.
rc::Gen<PlantCase> gen_plant_case() {
  return rc::gen::exec([] {
    PlantCase c;
    c.world_size = *rc::gen::inRange(2, 5);  // processes: a few, each costs a start-up
    // Every kind by a rank other than 0, and each writing kind again by rank 0: the control, since rank 0
    // may make the same call.
    struct Slot {
      std::string_view kind;
      bool rank0;
    };
    std::vector<Slot> slots;
    for (const audit::PlantKind& k : audit::plant_kinds()) {
      slots.push_back({k.name, false});
      if (k.writes) slots.push_back({k.name, true});
    }
    for (const std::size_t i : *all_then_fewer(slots.size())) {
      audit::Plant p;
      p.rank = slots[i].rank0 ? 0 : *rc::gen::inRange(1, c.world_size);
      p.kind = std::string(slots[i].kind);
      p.relative = *rc::gen::inRange(0, 2) == 1;
      p.name = gen_name(i);
      c.plants.push_back(std::move(p));
    }
    return c;
  });
}

std::string describe(const audit::Plant& p, const std::string& path) {
  const audit::PlantKind& k = *audit::find_plant_kind(p.kind);
  return "rank " + std::to_string(p.rank) + "'s " + std::string(k.what) + " (" + p.kind + ") of " + path;
}

std::string record_text(const audit::Record& r) {
  std::string out = (r.rank ? "rank " + std::to_string(*r.rank) : std::string("no rank")) + " " + r.call + " " + r.path;
  if (!r.to.empty()) out += " -> " + r.to;
  if (!r.flags.empty()) out += " " + r.flags;
  if (r.result != "ok") out += " (" + r.result + ")";
  return out;
}

// Whether the record names the plant's kind: one of its calls, with its flag among the flags.
bool names_kind(const audit::Record& r, const audit::PlantKind& k) {
  if (std::find(k.calls.begin(), k.calls.end(), r.call) == k.calls.end() || r.call.empty()) return false;
  if (k.flag.empty()) return true;
  std::stringstream flags(r.flags);
  for (std::string f; std::getline(flags, f, '|');)
    if (f == k.flag) return true;
  return false;
}

WriteAuditOutcome check_audit_sees(const PlantCase& c, const Target& target) {
  WriteAuditOutcome o;
  const fs::path scratch = make_scratch(Target{}, "audit-plants", false);
  // The kernel's name for it: the audit records the working directory's real path.
  const fs::path dir = fs::canonical(scratch) / "plants";
  fs::create_directories(dir);
  audit::prepare_plants(dir, c.plants);

  std::vector<std::string> argv{find_mpi_launcher(),  "-np",          std::to_string(c.world_size),
                                dpcheck_executable(), "plant-writes", "--dir",
                                dir.string()};
  for (const audit::Plant& p : c.plants) argv.insert(argv.end(), {"--plant", audit::plant_text(p)});
  audit::AuditOptions options;
  options.extra_env = launcher_env();  // as only_rank0_writes launches
  if (target.process_world)
    options.unset = {"OMPI_COMM_WORLD", "OMPI_MCA_", "PMIX_", "PMI_", "OMPI_FILE", "OMPI_UNIVERSE"};
  options.output = scratch / "output.txt";
  options.mutant = audit_mutant(target.mutant);
  // The launch takes seconds (a minute under AddressSanitizer on a loaded machine). A launcher that hangs
  // at start (seen once in CI's many launches) is stopped and launched once more, instead of holding the
  // property until its test's limit; a second hang is said as such, not judged as the audit's.
  options.timeout = std::chrono::seconds(180);
  audit::RunResult run = audit::run_audited(argv, options);
  if (run.timed_out) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    audit::prepare_plants(dir, c.plants);
    run = audit::run_audited(argv, options);
  }

  std::vector<std::string> failures;
  if (!run.succeeded()) {
    std::ifstream f(options.output);
    std::stringstream text;
    text << f.rdbuf();
    const std::string reason = run_failure_reason(text.str());
    o.not_judged = true;
    failures.push_back("not a judgement of the audit: the planted calls' run " + run.status_text() +
                       (reason.empty() ? std::string() : " (dpcheck said: " + reason + ")"));
  }

  // Every rank must have loaded the audit library, or its calls went unseen whatever the records say.
  std::set<int> ranks;
  for (const audit::Process& p : run.log.processes)
    if (p.rank) ranks.insert(*p.rank);
  for (int r = 0; r < c.world_size && failures.empty(); ++r)
    if (!ranks.contains(r)) failures.push_back("rank " + std::to_string(r) + " never loaded the audit library");

  audit::AllowList allow = audit::default_allow_list();
  const audit::AllowList launcher = audit::launcher_allowances(run.log);
  allow.insert(allow.end(), launcher.begin(), launcher.end());
  const std::vector<audit::Record> bad = audit::offending(run.log.records, allow);
  const auto offends = [&](const audit::Record& r) {
    return std::any_of(bad.begin(), bad.end(), [&](const audit::Record& b) {
      return b.pid == r.pid && b.call == r.call && b.path == r.path && b.to == r.to;
    });
  };

  std::set<std::string> planted;
  for (const audit::Plant& p : c.plants) planted.insert(audit::plant_path(dir, p).string());
  const bool judged = failures.empty();
  for (const audit::Plant& p : c.plants) {
    if (!judged) break;
    const audit::PlantKind& kind = *audit::find_plant_kind(p.kind);
    const std::string path = audit::plant_path(dir, p).string();
    std::vector<const audit::Record*> of_path;
    for (const audit::Record& r : run.log.records)
      if (r.path == path) of_path.push_back(&r);
    std::string seen;
    for (const audit::Record* r : of_path) seen += (seen.empty() ? "" : "; ") + record_text(*r);
    if (!kind.writes) {
      if (!of_path.empty())
        failures.push_back("false alarm: " + describe(p, path) +
                           " only reads, and the audit recorded a write: " + seen);
      continue;
    }
    const auto it = std::find_if(of_path.begin(), of_path.end(), [&](const audit::Record* r) {
      return r->rank == p.rank && r->result == "ok" && names_kind(*r, kind);
    });
    if (it == of_path.end()) {
      // Rank 0 may write, but the audit must see its calls, and see them as rank 0's.
      failures.push_back(describe(p, path) + " was not recorded as that call by that rank" +
                         (p.rank == 0 ? " (rank 0 may write, but the audit must see it)" : "") + ": " +
                         (seen.empty() ? "the audit has no record of the path" : "the audit recorded only " + seen));
    } else if (p.rank != 0 && !offends(**it)) {
      failures.push_back(describe(p, path) + " was recorded (" + record_text(**it) +
                         ") but not judged a write outside the allowed paths");
    } else if (p.rank == 0) {
      ++o.rank0_files;
    }
  }
  // Nothing else may be judged an offence: neither a write of dpcheck's own nor a false alarm.
  if (judged)
    for (const audit::Record& r : bad)
      if (!planted.contains(r.path)) {
        failures.push_back("the audit judged a call that no plant made an offence: " + record_text(r));
        break;
      }

  if (!failures.empty())
    o.message = failures.front() +
                (failures.size() > 1 ? " (and " + std::to_string(failures.size() - 1) + " more failures in this case)"
                                     : std::string());
  o.passed = failures.empty();
  std::error_code ec;
  fs::remove_all(scratch, ec);
  return o;
}

}  // namespace

void audit_writes_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const PlantCase c = *gen_plant_case();
  record.size = {static_cast<std::int64_t>(c.plants.size()), c.world_size, 0, 0};
  // One process launches and audits the planted calls; with processes of our own, rank 0 does it and
  // tells the others the verdict.
  WriteAuditOutcome o;
  if (!target.process_world || target.process_world->rank() == 0) o = check_audit_sees(c, target);
  if (target.process_world) {
    std::int64_t verdict[2] = {o.passed ? 1 : 0, o.not_judged ? 1 : 0};
    target.process_world->broadcast(verdict, 2, DType::i64, 0);
    o.passed = verdict[0] == 1;
    o.not_judged = verdict[1] == 1;
  }
  RC_TAG(std::to_string(c.world_size) + " ranks");
  record.not_judged = o.not_judged;
  if (!o.passed) fail_case(o.message.empty() ? "rank 0 found a write the audit got wrong" : o.message);
}

}  // namespace dpcheck
