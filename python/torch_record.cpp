#include "python/torch_record.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "reference/optimizer.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/json_limits.hpp"
#include "src/io/npy.hpp"
#include "src/train/replica_check.hpp"
#include "src/train/writer.hpp"
#include "verdict/verdict.hpp"

namespace dpcheck::torchjob {

namespace fs = std::filesystem;

namespace {

// A record's JSON files are small: a step's parts list is the longest.
constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t{16} << 20;

nlohmann::json read_json(const fs::path& p) {
  check_input_file(p, p.string());
  std::error_code ec;
  if (fs::file_size(p, ec) > kMaxJsonBytes) throw UsageError(p.string() + ": larger than a record's JSON can be");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError("cannot read " + p.string());
  std::ostringstream os;
  os << in.rdbuf();
  const std::string text = os.str();
  check_json_depth(text, p.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw UsageError(p.string() + " is not valid JSON");
  }
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const fs::path& file) {
  if (!j.is_object() || !j.contains(key)) throw UsageError(file.string() + ": no \"" + key + "\"");
  return j.at(key);
}

std::int64_t int_field(const nlohmann::json& j, const char* key, const fs::path& file, std::int64_t lo,
                       std::int64_t hi) {
  const nlohmann::json& v = field(j, key, file);
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    throw UsageError(file.string() + ": \"" + key + "\" is " + v.dump() + ", not an integer in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "]");
  return v.get<std::int64_t>();
}

double number_field(const nlohmann::json& j, const char* key, const fs::path& file) {
  const nlohmann::json& v = field(j, key, file);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw UsageError(file.string() + ": \"" + key + "\" is " + v.dump() + ", not a finite number");
  return v.get<double>();
}

std::string text_field(const nlohmann::json& j, const char* key, const fs::path& file) {
  const nlohmann::json& v = field(j, key, file);
  if (!v.is_string()) throw UsageError(file.string() + ": \"" + key + "\" is not a string");
  return v.get<std::string>();
}

std::vector<float> read_flat(const fs::path& p, std::size_t n) {
  const std::int64_t shape[] = {static_cast<std::int64_t>(n)};
  return read_npy_expect(p, shape).as_finite_float32(p);
}

OptimizerConfig optimizer_of(const nlohmann::json& j, const fs::path& file) {
  OptimizerConfig c;
  c.kind = parse_optimizer(text_field(j, "kind", file));
  c.lr = number_field(j, "lr", file);
  if (c.kind == OptimizerKind::momentum) c.momentum = number_field(j, "momentum", file);
  if (c.kind == OptimizerKind::adam) {
    c.beta1 = number_field(j, "beta1", file);
    c.beta2 = number_field(j, "beta2", file);
    c.eps = number_field(j, "eps", file);
  }
  try {
    c.validate();
  } catch (const UsageError& e) {
    throw UsageError(file.string() + ": the optimizer: " + e.what());
  }
  return c;
}

std::size_t state_blocks(const RecordHeader& h) {
  if (!h.optimizer) return 0;
  return h.optimizer->kind == OptimizerKind::adam ? 2 : h.optimizer->kind == OptimizerKind::momentum ? 1 : 0;
}

}  // namespace

std::string RecordHeader::torch_names(std::string text) const {
  for (std::size_t k = layer_names.size(); k-- > 0;) {
    for (const char* part : {".weight", ".bias"}) {
      const std::string from = "layers." + std::to_string(k) + part, to = layer_names[k] + part;
      for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    }
  }
  return text;
}

bool is_record(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::symlink_status(dir / "record.json", ec));
}

Record read_record(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError(dir.string() + " is not a directory (a record of dpcheck.torch)");
  const fs::path file = dir / "record.json";
  const nlohmann::json j = read_json(file);
  if (int_field(j, "dpcheck_torch_record", file, 1, 1000) != kRecordVersion)
    throw UsageError(file.string() + ": a record of another version of dpcheck.torch (this dpcheck reads version " +
                     std::to_string(kRecordVersion) + ")");
  Record r;
  r.dir = dir;
  RecordHeader& h = r.header;
  h.world_size = static_cast<int>(int_field(j, "world_size", file, 1, 1 << 20));
  const nlohmann::json& m = field(j, "model", file);
  const nlohmann::json& dims = field(m, "dims", file);
  if (!dims.is_array()) throw UsageError(file.string() + ": the model's \"dims\" is not a list");
  for (const nlohmann::json& d : dims) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 1 || d.get<std::int64_t>() > (1 << 30))
      throw UsageError(file.string() + ": the model's width " + d.dump() + " is not a positive integer");
    h.model.dims.push_back(d.get<int>());
  }
  try {
    h.model.activation = parse_activation(text_field(m, "activation", file));
    h.model.loss = parse_loss(text_field(m, "loss", file));
    h.model.validate();
  } catch (const UsageError& e) {
    throw UsageError(file.string() + ": the model: " + e.what());
  }
  const nlohmann::json& names = field(m, "names", file);
  if (!names.is_array() || names.size() != static_cast<std::size_t>(h.model.layers()))
    throw UsageError(file.string() + ": the model's \"names\" must list its " + std::to_string(h.model.layers()) +
                     " Linear layers");
  for (const nlohmann::json& n : names) {
    if (!n.is_string()) throw UsageError(file.string() + ": a layer's name is not a string");
    h.layer_names.push_back(n.get<std::string>());
  }
  const nlohmann::json& o = field(j, "optimizer", file);
  h.optimizer_name = text_field(o, "name", file);
  if (field(o, "kind", file).is_null()) h.optimizer_not_judged = text_field(o, "not_judged", file);
  else h.optimizer = optimizer_of(o, file);
  h.torch_version = text_field(j, "torch", file);
  h.backend = text_field(j, "backend", file);
  if (j.contains("command_line") && j["command_line"].is_array())
    for (const nlohmann::json& a : j["command_line"])
      if (a.is_string()) h.command_line.push_back(a.get<std::string>());
  if (j.contains("failure")) {
    const nlohmann::json& f = j["failure"];
    text_field(f, "kind", file);
    int_field(f, "step", file, 0, std::int64_t{1} << 53);
    text_field(f, "message", file);
    h.failure = f;
  }
  for (const auto& [step, path] : checkpoint_steps(dir)) r.steps.push_back(step);
  std::sort(r.steps.begin(), r.steps.end());
  if (r.steps.empty()) throw UsageError(dir.string() + ": the record holds no step (no step-NNNNNNNN directory)");
  return r;
}

RecordedStep read_recorded_step(const Record& record, std::int64_t step) {
  const RecordHeader& h = record.header;
  const fs::path dir = record.dir / checkpoint_name(step);
  if (!std::binary_search(record.steps.begin(), record.steps.end(), step)) {
    std::string held;
    for (std::size_t i = 0; i < record.steps.size() && i < 8; ++i)
      held += (i ? ", " : "") + std::to_string(record.steps[i]);
    if (record.steps.size() > 8) held += ", ...";
    throw UsageError(record.dir.string() + " holds no step " + std::to_string(step) + " (it holds " + held + ")");
  }
  const fs::path file = dir / "step.json";
  const nlohmann::json j = read_json(file);
  RecordedStep s;
  s.step = int_field(j, "step", file, 0, std::int64_t{1} << 53);
  if (s.step != step)
    throw UsageError(file.string() + ": \"step\" is " + std::to_string(s.step) + " in " + dir.filename().string());
  s.lr = number_field(j, "lr", file);
  s.optimizer_steps = int_field(j, "optimizer_steps", file, 0, std::int64_t{1} << 53);
  if (j.contains("failure")) {
    const nlohmann::json& f = j["failure"];
    s.failure_kind = text_field(f, "kind", file);
    s.failure_message = text_field(f, "message", file);
  }
  const nlohmann::json& parts = field(j, "parts", file);
  if (!parts.is_array() || parts.empty())
    throw UsageError(file.string() + ": \"parts\" is not a list of the ranks' micro-batches");
  std::int64_t total = 0;
  std::vector<std::pair<int, std::int64_t>> sizes;
  for (const nlohmann::json& p : parts) {
    const int rank = static_cast<int>(int_field(p, "rank", file, 0, h.world_size - 1));
    const std::int64_t n = int_field(p, "examples", file, 0, std::int64_t{1} << 40);
    sizes.emplace_back(rank, n);
    total += n;
  }
  if (total < 1) throw UsageError(file.string() + ": the step's parts hold no example");
  const ArrayDataset data = ArrayDataset::load(dir / "x.npy", dir / "y.npy", h.model);
  if (data.size() != total)
    throw UsageError((dir / "x.npy").string() + " holds " + std::to_string(data.size()) +
                     " examples; step.json's parts hold " + std::to_string(total));
  std::vector<std::int64_t> all(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) all[static_cast<std::size_t>(i)] = i;
  const Batch whole = data.gather(all);
  std::int64_t at = 0;
  for (const auto& [rank, n] : sizes) {
    s.parts.push_back({rank, whole.slice(at, at + n)});
    at += n;
  }
  const std::size_t n = ParamLayout(h.model).size();
  const std::size_t state = state_blocks(h) * n;
  s.params = read_flat(dir / "params.npy", n);
  s.grad = read_flat(dir / "grad.npy", n);
  s.params_after = read_flat(dir / "params_after.npy", n);
  s.state = read_flat(dir / "state.npy", state);
  s.state_after = read_flat(dir / "state_after.npy", state);
  return s;
}

std::string RecordedStep::failure_line() const {
  std::string line = failure_message.substr(0, failure_message.find('\n'));
  const std::string lead = "dpcheck.torch: FAILED ";
  if (line.rfind(lead, 0) == 0) line.erase(0, lead.size());
  return line;
}

StepJudgement judge_recorded_step(const Record& record, const RecordedStep& step) {
  const RecordHeader& h = record.header;
  StepJudgement j;
  GradientInput in;
  in.model = h.model;
  in.params = step.params;
  in.parts = step.parts;
  in.gradient = step.grad;
  in.world_size = h.world_size;
  j.gradient = judge_gradient(in);
  RecordedPhase g;
  g.phase = "all-reduce";
  g.ratio = j.gradient.ratio;
  g.element = h.torch_names(j.gradient.element);
  g.message = h.torch_names(j.gradient.message);
  j.phases.push_back(g);

  RecordedPhase o;
  o.phase = "optimizer";
  if (!h.optimizer) {
    o.judged = false;
    o.message = "not judged: " + h.optimizer_not_judged;
  } else {
    OptimizerConfig c = *h.optimizer;
    c.lr = step.lr;
    const ParamLayout layout(h.model);
    const reference::OptimizerStepBound want =
        reference::optimizer_step_bound(c, step.params, step.grad, step.state, step.optimizer_steps);
    WorstElement params, state;
    worst_against_formula(
        step.params_after, want.params, want.params_bound, "parameter",
        [&](std::size_t i) { return layout.describe_element(i); }, params);
    const std::size_t n = layout.size();
    worst_against_formula(
        step.state_after, want.state, want.state_bound, "optimizer state",
        [&](std::size_t i) { return layout.describe_element(i % n); }, state);
    const WorstElement& worst = state.ratio > params.ratio ? state : params;
    o.ratio = worst.ratio;
    o.element =
        h.torch_names((&worst == &state ? "optimizer state at " : "") + layout.describe_element(worst.index % n));
    o.message = h.torch_names(worst.where);
  }
  j.phases.push_back(o);
  for (const RecordedPhase& p : j.phases) {
    if (!p.judged) continue;
    j.max_ratio = std::max(j.max_ratio, p.ratio);
    if (j.first_out_of_bound.empty() && !(p.ratio <= 1.0))
      j.first_out_of_bound = p.phase + (p.element.empty() ? "" : " at " + p.element);
  }
  return j;
}

RecordDrift record_drift(const Record records[2], std::int64_t from) {
  if (records[0].header.model.dims != records[1].header.model.dims ||
      records[0].header.model.activation != records[1].header.model.activation ||
      records[0].header.model.loss != records[1].header.model.loss)
    throw UsageError(records[0].dir.string() + " and " + records[1].dir.string() + " record different models (" +
                     dims_string(records[0].header.model.dims) + " and " + dims_string(records[1].header.model.dims) +
                     ")");
  RecordDrift d;
  const auto holds = [](const Record& r, std::int64_t s) {
    return std::binary_search(r.steps.begin(), r.steps.end(), s);
  };
  for (int k = 0; k < 2; ++k)
    for (const std::int64_t s : records[k].steps)
      if (s >= from && !holds(records[1 - k], s)) ++d.only[k];
  for (const std::int64_t s : records[0].steps) {
    if (s < from || !holds(records[1], s)) continue;
    RecordDriftStep row;
    row.step = s;
    std::vector<float> after[2];
    for (int k = 0; k < 2; ++k) {
      const RecordedStep step = read_recorded_step(records[k], s);
      const StepJudgement j = judge_recorded_step(records[k], step);
      row.ratio[k] = j.max_ratio;
      row.where[k] = j.first_out_of_bound;
      // The next step must start where this one ended: anything else changed the parameters or the
      // optimizer's state outside the step.
      if (holds(records[k], s + 1)) {
        const RecordedStep next = read_recorded_step(records[k], s + 1);
        const ParamLayout layout(records[k].header.model);
        for (std::size_t i = 0; i < step.params_after.size() && row.between[k].empty(); ++i)
          if (std::memcmp(&step.params_after[i], &next.params[i], sizeof(float)) != 0)
            row.between[k] = "the parameters changed between the end of step " + std::to_string(s) +
                             " and the start of step " + std::to_string(s + 1) + " at " +
                             records[k].header.torch_names(layout.describe_element(i)) + " (" +
                             float_bits_text(step.params_after[i]) + " then " + float_bits_text(next.params[i]) + ")";
        if (row.between[k].empty() && step.state_after != next.state)
          row.between[k] =
              "the optimizer's state changed between step " + std::to_string(s) + " and step " + std::to_string(s + 1);
      }
      after[k] = step.params_after;
      // What the job's own checks saw (the ranks' replicas, the sampler's shares) and one rank's record
      // cannot: a failure recorded at this step.
      if (row.where[k].empty() && !step.failure_kind.empty())
        row.where[k] = "the job's " + step.failure_kind + " check";
      if (d.bug_run < 0 && (!row.where[k].empty() || !row.between[k].empty())) {
        d.bug_run = k;
        d.bug_step = s;
        d.bug_where = !j.first_out_of_bound.empty() ? j.first_out_of_bound
                      : !step.failure_kind.empty()  ? "the job failed dpcheck.torch's check: " + step.failure_line()
                                                    : row.between[k];
        d.bug_between_steps = d.bug_where == row.between[k];
      }
    }
    for (std::size_t i = 0; i < after[0].size() && i < after[1].size(); ++i)
      row.apart_ulp = std::max(row.apart_ulp, ulp_distance(after[0][i], after[1][i]));
    d.steps.push_back(row);
  }
  return d;
}

}  // namespace dpcheck::torchjob
