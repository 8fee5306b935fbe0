#include "properties/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <limits>

#include <rapidcheck.h>

#include "mutants/mutants.hpp"
#include "properties/case_token.hpp"
#include "properties/scenario.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

using rc::detail::CaseDescription;
using rc::detail::CaseResult;
using CaseShrinkable = rc::Shrinkable<CaseDescription>;

constexpr int kMaxSize = 100;         // RapidCheck's default max_size
constexpr int kMaxDiscardRatio = 10;  // and max_discard_ratio

// RapidCheck's spread of case sizes over the cases: every size in [0, kMaxSize] in turn, and the
// largest size always used.
int size_for(int cases, int i) {
  const int sizes = kMaxSize + 1;
  const int regular = (cases / sizes) * sizes;
  if (i < regular) return i % sizes;
  const int rest = cases - regular;
  return rest == 1 ? 0 : ((i % sizes) * kMaxSize) / (rest - 1);
}

// RC_CLASSIFY shows string tags as C++ literals; the report wants the words.
std::string unquote(const std::string& tag) {
  return tag.size() >= 2 && tag.front() == '"' && tag.back() == '"' ? tag.substr(1, tag.size() - 2) : tag;
}

std::string example_text(const CaseDescription& d) {
  std::string text;
  if (!d.example) return text;
  for (const auto& [type, value] : d.example()) text += (text.empty() ? "" : "\n") + value;
  return text;
}

std::string percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * share);
  return buf;
}

// Gathers what the cases measured into the result.
void absorb(PropertyResult& out, const CaseRecord& r) {
  if (r.ratio >= 0) {
    out.has_error_ratio = true;
    out.max_error_ratio = std::max(out.max_error_ratio, r.ratio);
  }
  if (r.probabilistic_ratio >= 0) {
    out.has_probabilistic_ratio = true;
    out.max_probabilistic_ratio = std::max(out.max_probabilistic_ratio, r.probabilistic_ratio);
  }
  for (int path = 0; path < 2; ++path) out.tightness[path] = std::max(out.tightness[path], r.tightness[path]);
  if (r.probe_ratio >= 0) {
    out.weakest_probe = out.probed == 0 ? r.probe_ratio : std::min(out.weakest_probe, r.probe_ratio);
    ++out.probed;
    if (r.probe_ratio > 1.0) ++out.probe_caught;
  }
}

// A case's formats where verify draws them (CaseDraw::precisions, allreduce_dtypes).
struct CaseFormats {
  Precision precision = Precision::fp32;
  DType allreduce_dtype = DType::f32;
};

void showValue(const CaseFormats& f, std::ostream& os) {
  os << "formats: " << precision_name(f.precision) << " products, " << allreduce_dtype_name(f.allreduce_dtype)
     << " all-reduce";
}

// Each list drawn uniformly (whatever the case's size), shrinking towards its first entry; a target's
// own format where its list is empty.
rc::Gen<CaseFormats> gen_formats(const Target& target, const CaseDraw& draw) {
  const std::vector<Precision> precisions =
      draw.precisions.empty() ? std::vector<Precision>{target.precision} : draw.precisions;
  const std::vector<DType> dtypes =
      draw.allreduce_dtypes.empty() ? std::vector<DType>{target.allreduce_dtype} : draw.allreduce_dtypes;
  return rc::gen::map(uniform(rc::gen::pair(rc::gen::inRange<std::size_t>(0, precisions.size()),
                                            rc::gen::inRange<std::size_t>(0, dtypes.size()))),
                      [precisions, dtypes](const std::pair<std::size_t, std::size_t>& i) {
                        return CaseFormats{precisions[i.first], dtypes[i.second]};
                      });
}

class Search {
 public:
  Search(const PropertyDef& property, const Target& target, const RunOptions& options, PropertyResult& out)
      : property_(rc::detail::toProperty([&property, &target, this] {
          const CaseDraw& draw = options_.draw;
          if (fault_) std::rethrow_exception(fault_);  // no more cases, nor shrinking, once a plugin faulted
          try {
            if (property.draws_formats && (!draw.precisions.empty() || !draw.allreduce_dtypes.empty())) {
              // The formats drawn per case, as the first draw of the case: a failure shrinks towards
              // float32, and the case token holds the case's formats.
              const CaseFormats f = *gen_formats(target, draw);
              Target drawn = target;
              drawn.precision = f.precision;
              drawn.allreduce_dtype = f.allreduce_dtype;
              RC_CLASSIFY(f.precision != Precision::fp32, std::string(precision_name(f.precision)) + " products");
              RC_CLASSIFY(f.allreduce_dtype != DType::f32,
                          std::string(allreduce_dtype_name(f.allreduce_dtype)) + " all-reduce");
              property.body(drawn, draw, current_);
            } else {
              property.body(target, draw, current_);
            }
          } catch (const PluginFault&) {
            if (options_.plugin_fault_ends_run) fault_ = std::current_exception();
            throw;
          }
        })),
        options_(options),
        reruns_(property.case_divisor > 1 ? std::min(options.reruns, 2) : options.reruns),
        out_(out) {}

  void run(std::uint64_t seed) {
    rc::Random r(seed);
    int passed = 0, discarded = 0, recent_discards = 0;
    while (passed < options_.cases) {
      const int size = size_for(options_.cases, passed) + recent_discards / 10;
      const rc::Random random = r.split();
      const CaseShrinkable shrinkable = property_(random, size);
      const CaseDescription d = evaluate(shrinkable);
      if (fault_) std::rethrow_exception(fault_);
      ++evaluated_;
      absorb(out_, current_);
      tick();
      switch (d.result.type) {
        case CaseResult::Type::Success: {
          ++passed;
          recent_discards = 0;
          if (!d.tags.empty()) {
            std::string key;
            for (const std::string& t : d.tags) key += (key.empty() ? "" : "; ") + unquote(t);
            ++out_.distribution[key];
          }
          if (current_.ratio >= 0) out_.error_ratios.push_back(current_.ratio);
          if (current_.ratio > out_.closest.ratio) {
            out_.closest.ratio = current_.ratio;
            out_.closest.note = current_.note;
            out_.closest.example = example_text(d);
            out_.closest.reproduce = encode_case_token({out_.name, {random, size, {}}});
          }
          break;
        }
        case CaseResult::Type::Discard:
          ++discarded;
          ++recent_discards;
          if (discarded > kMaxDiscardRatio * options_.cases) {
            out_.cases = passed;
            out_.failure = "gave up: " + std::to_string(discarded) + " cases discarded";
            return;
          }
          break;
        case CaseResult::Type::Failure:
          out_.cases = passed;
          failed(shrinkable, d, {random, size, {}});
          return;
      }
    }
    out_.cases = passed;
    out_.passed = true;
  }

  void replay(const rc::detail::Reproduce& reproduce) {
    const rc::Maybe<CaseShrinkable> walked =
        rc::shrinkable::walkPath(property_(reproduce.random, reproduce.size), reproduce.shrinkPath);
    if (fault_) std::rethrow_exception(fault_);
    if (!walked) throw UsageError("bad --reproduce string: it leads to no case of " + out_.name);
    out_.replayed = true;
    out_.reproduce = encode_case_token({out_.name, reproduce});
    const Runs runs = run_again(*walked);
    if (runs.fails == 0) {
      out_.passed = true;
      out_.cases = 1;
      absorb(out_, runs.last_record);
      if (runs.last_record.ratio >= 0) out_.error_ratios.push_back(runs.last_record.ratio);
      out_.closest.ratio = runs.last_record.ratio;
      out_.closest.note = runs.last_record.note;
      out_.closest.example = example_text(runs.last);
      out_.closest.reproduce = out_.reproduce;
      out_.runs = reruns_;
      return;
    }
    absorb(out_, runs.failing_record);
    record_failure(runs);
  }

 private:
  struct Runs {
    int fails = 0;
    CaseDescription last, failing;
    CaseRecord last_record, failing_record;
  };

  CaseDescription evaluate(const CaseShrinkable& s) {
    current_ = CaseRecord{};
    return s.value();
  }

  // The case run options.reruns times.
  Runs run_again(const CaseShrinkable& s) {
    Runs runs;
    for (int k = 0; k < reruns_; ++k) {
      runs.last = evaluate(s);
      runs.last_record = current_;
      if (runs.last.result.type == CaseResult::Type::Failure) {
        ++runs.fails;
        runs.failing = runs.last;
        runs.failing_record = current_;
      }
    }
    return runs;
  }

  void record_failure(const Runs& runs) {
    out_.passed = false;
    out_.runs = reruns_;
    out_.failing_runs = runs.fails;
    out_.failure = runs.failing.result.description;
    out_.counterexample = example_text(runs.failing);
    out_.failure_size = runs.failing_record.size;
    out_.not_judged = runs.failing_record.not_judged;
  }

  // The first failing case: run it again to see whether it fails every time, shrink it (a smaller case
  // counts as failing if any of its runs fails, when the first did not fail every time), and run the
  // minimal case again to say how often it fails.
  void failed(const CaseShrinkable& first, const CaseDescription& first_description, rc::detail::Reproduce reproduce) {
    const CaseRecord first_record = current_;
    int fails = 1;
    for (int k = 1; k < reruns_; ++k) fails += evaluate(first).result.type == CaseResult::Type::Failure ? 1 : 0;
    const bool steady = fails == reruns_;
    if (!options_.shrink) {
      Runs runs;
      runs.fails = fails;
      runs.failing = first_description;
      runs.failing_record = first_record;
      record_failure(runs);
      out_.reproduce = encode_case_token({out_.name, reproduce});
      return;
    }

    CaseShrinkable best = first;
    CaseDescription best_description = first_description;
    CaseRecord best_record = first_record;
    {
      rc::Seq<CaseShrinkable> shrinks = best.shrinks();
      std::size_t i = 0;
      while (rc::Maybe<CaseShrinkable> s = shrinks.next()) {
        CaseDescription d = evaluate(*s);
        bool failing = d.result.type == CaseResult::Type::Failure;
        for (int k = 1; !steady && !failing && k < reruns_; ++k) {
          d = evaluate(*s);
          failing = d.result.type == CaseResult::Type::Failure;
        }
        if (failing) {
          best = *s;
          best_description = d;
          best_record = current_;
          shrinks = best.shrinks();
          reproduce.shrinkPath.push_back(i);
          i = 0;
          ++out_.shrinks;
        } else {
          ++i;
        }
        tick();
      }
    }
    Runs runs = run_again(best);
    if (runs.fails == 0) {
      // It failed while shrinking but not in these runs: report the failure that was seen.
      runs.failing = best_description;
      runs.failing_record = best_record;
    }
    record_failure(runs);
    out_.reproduce = encode_case_token({out_.name, reproduce});
  }

  void tick() {
    if (options_.progress) options_.progress(evaluated_, out_.shrinks);
  }

  rc::detail::Property property_;
  const RunOptions& options_;
  // A case that launches processes costs seconds: its failures are run twice, not options.reruns times.
  int reruns_;
  PropertyResult& out_;
  CaseRecord current_;
  std::int64_t evaluated_ = 0;
  std::exception_ptr fault_;
};

}  // namespace

const PropertyDef& case_token_property(const std::string& token) {
  return find_property(decode_case_token(token).property);
}

std::string PropertyResult::tightness_text(std::string_view and_word) const {
  std::string text;
  for (int path = 0; path < 2; ++path) {
    if (tightness[path] < 0 || tightness_paths[path].empty()) continue;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g (", tightness[path]);
    text += (text.empty() ? "" : std::string(and_word)) + buf + std::string(tightness_paths[path]) + ")";
  }
  return text;
}

PropertyResult run_property(const PropertyDef& property, const Target& target, const RunOptions& options) {
  register_mutants();  // the target's mutant, if any, is built through the table
  if (options.cases < 1) throw UsageError("the number of cases must be at least 1");
  if (options.reruns < 1) throw UsageError("the number of runs of a failing case must be at least 1");
  PropertyResult out;
  out.name = std::string(property.name);
  out.min_power = property.min_power;
  out.min_tightness = property.min_tightness;
  out.tightness_paths[0] = property.tightness_paths[0];
  out.tightness_paths[1] = property.tightness_paths[1];
  std::optional<CaseToken> token;
  if (!options.reproduce.empty()) {
    token = decode_case_token(options.reproduce);
    if (token->property != out.name)
      throw UsageError("the --reproduce string replays a case of " + token->property + ", not of " + out.name);
  }
  if (!property.simulates && target.backend->simulated) {
    out.skipped =
        "it needs real ranks: simulated ones play every rank on one replica, which no other replica can "
        "differ from, and write no files of their own";
    out.passed = true;
    return out;
  }
  if (property.unavailable) {
    out.skipped = property.unavailable(target);
    if (!out.skipped.empty()) {
      out.passed = true;
      return out;
    }
  }

  Search search(property, target, options, out);
  const auto start = std::chrono::steady_clock::now();
  if (token) {
    search.replay(token->reproduce);
  } else {
    // Each property explores its own sequence of cases under the user's seed.
    std::uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a
    for (char c : out.name) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    search.run(mix_key(options.seed, name_hash));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (out.passed && !out.replayed && out.min_power > 0 && out.probed >= min_probed_cases &&
      out.power() < out.min_power) {
    out.passed = false;
    out.failure = "the check has lost its power: with one example dropped, the gradient left the bound in only " +
                  std::to_string(out.probe_caught) + " of " + std::to_string(out.probed) + " probed cases (" +
                  percent(out.power()) + "; at least " + percent(out.min_power) +
                  " required), so the bound is too loose to tell a batch from the batch without one of its examples";
  }
  if (out.passed && !out.replayed && out.min_tightness > 0 && out.cases >= min_tightness_cases) {
    for (int path = 0; path < 2 && out.passed; ++path)
      if (out.tightness[path] >= 0 && out.tightness[path] < out.min_tightness) {
        out.passed = false;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.3g (at least %.3g required)", out.tightness[path], out.min_tightness);
        out.failure = std::string("the bound has grown loose: over ") + std::to_string(out.cases) +
                      " cases no correct evaluation (" + std::string(out.tightness_paths[path]) +
                      ") came nearer to it than an error ratio of " + buf +
                      ", where plain rounding reaches about twice that";
      }
  }
  return out;
}

std::string reproduce_command(const Target& target, const CaseDraw& draw, const std::string& token) {
  std::string cmd = launch_prefix(target) + dpcheck_program() + " verify";
  if (target.engine != &default_engine_row()) cmd += " --engine " + std::string(target.engine->name);
  if (!target.backend->engine_default) cmd += " --comm " + shell_word(target.backend->name);
  if (target.tf32) cmd += " --tf32";
  // A format the run fixed is named even at its default, where verify would otherwise draw it per case.
  if (target.precision != Precision::fp32 || (draw.precisions.empty() && precision_drawable(target)))
    cmd += " --precision " + std::string(precision_name(target.precision));
  if (target.allreduce_dtype != DType::f32 || (draw.allreduce_dtypes.empty() && allreduce_dtype_drawable(target)))
    cmd += " --allreduce-dtype " + std::string(allreduce_dtype_name(target.allreduce_dtype));
  if (!target.kernels.empty()) cmd += " --kernels " + shell_word(target.kernels);
  if (!target.mutant.empty()) cmd += " --mutant " + target.mutant;
  // A process backend's world is the launcher's; a thread backend's is a flag (or drawn per case, and
  // then recorded in the token).
  if (target.world_size > 0 && !target.process_world) cmd += " --world-size " + std::to_string(target.world_size);
  if (!draw.model_dims.empty()) cmd += " --model " + dims_string(draw.model_dims);
  if (draw.thorough) cmd += " --thorough";  // the token replays a case of the wider space
  return cmd + " --reproduce " + shell_quoted(token);
}

std::string failure_replay(const Target& target, const CaseDraw& draw, const PropertyResult& result) {
  return reproduce_command(target, draw, result.reproduce) +
         (result.flaky() ? " --reruns " + std::to_string(comes_and_goes_reruns) : std::string());
}

}  // namespace dpcheck
