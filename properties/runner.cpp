#include "properties/runner.hpp"

#include <chrono>

#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

#include "src/error.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

class ProgressListener final : public rc::detail::TestListener {
 public:
  explicit ProgressListener(const RunOptions& options) : options_(options) {}
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {
    ++cases_;
    if (options_.progress) options_.progress(cases_, shrinks_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    if (accepted) ++shrinks_;
    if (options_.progress) options_.progress(cases_, shrinks_);
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
  std::int64_t shrinks() const { return shrinks_; }

 private:
  const RunOptions& options_;
  std::int64_t cases_ = 0, shrinks_ = 0;
};

// RC_CLASSIFY shows string tags as C++ literals; the report wants the words.
std::string unquote(const std::string& tag) {
  return tag.size() >= 2 && tag.front() == '"' && tag.back() == '"' ? tag.substr(1, tag.size() - 2) : tag;
}

}  // namespace

PropertyResult run_property(const PropertyDef& property, const Target& target, const RunOptions& options) {
  if (options.cases < 1) throw UsageError("the number of cases must be at least 1");
  PropertyResult out;
  out.name = std::string(property.name);
  if (property.unavailable) {
    out.skipped = property.unavailable(target);
    if (!out.skipped.empty()) {
      out.passed = true;
      return out;
    }
  }
  CaseStats stats;
  const auto testable = [&] { property.body(target, stats); };

  rc::detail::TestMetadata metadata;
  metadata.id = out.name;
  metadata.description = std::string(property.promise);
  rc::detail::TestParams params;
  // Each property explores its own sequence of cases under the user's seed.
  std::uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : out.name) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  params.seed = mix_key(options.seed, name_hash);
  params.maxSuccess = options.cases;
  params.maxSize = 100;
  params.maxDiscardRatio = 10;
  params.disableShrinking = !options.shrink;
  std::unordered_map<std::string, rc::detail::Reproduce> reproduce;
  if (!options.reproduce.empty()) {
    try {
      const rc::detail::Configuration config = rc::detail::configFromString(options.reproduce);
      for (const auto& [id, r] : config.reproduce) reproduce[out.name] = r;  // one property at a time
    } catch (const std::exception& e) {
      throw UsageError("bad --reproduce string: " + std::string(e.what()));
    }
    if (reproduce.empty()) throw UsageError("bad --reproduce string: expected reproduce=...");
  }

  ProgressListener listener(options);
  const auto start = std::chrono::steady_clock::now();
  const rc::detail::TestResult result =
      rc::detail::checkProperty(rc::detail::toProperty(testable), metadata, params, listener, reproduce);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.max_error_ratio = stats.max_error_ratio;
  out.has_error_ratio = stats.has_error_ratio;
  out.shrinks = listener.shrinks();

  rc::detail::SuccessResult success;
  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  rc::detail::Error error;
  if (result.match(success)) {
    out.passed = true;
    out.cases = success.numSuccess;
    for (const auto& [tags, count] : success.distribution) {
      std::string key;
      for (const std::string& t : tags) key += (key.empty() ? "" : "; ") + unquote(t);
      out.distribution[key] += count;
    }
  } else if (result.match(failure)) {
    out.cases = failure.numSuccess;
    out.failure = failure.description;
    for (const auto& [type, value] : failure.counterExample) out.counterexample += (out.counterexample.empty() ? "" : "\n") + value;
    out.failure_size = stats.last_failure;
    rc::detail::Configuration config;
    config.reproduce[out.name] = failure.reproduce;
    out.reproduce = rc::detail::configToMinimalString(config);
  } else if (result.match(gave_up)) {
    out.cases = gave_up.numSuccess;
    out.failure = "gave up: " + gave_up.description;
  } else if (result.match(error)) {
    out.failure = "error: " + error.description;
  }
  return out;
}

}  // namespace dpcheck
