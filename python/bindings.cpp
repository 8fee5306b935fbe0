// dpcheck._core: the thin layer that hands dpcheck's C++ checks to dpcheck.torch (python/dpcheck/).
// Arrays cross as Python buffers (NumPy arrays of PyTorch tensors, shared, not copied); the hashing
// and the judging run with the interpreter's lock released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "divergence/trace.hpp"
#include "python/torch_checks.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/train/replica_check.hpp"
#include "src/train/shares.hpp"

namespace py = pybind11;

namespace dpcheck::torchjob {

namespace {

// A C-contiguous buffer's bytes.
std::string_view bytes_of(const py::buffer_info& info, const char* what) {
  std::int64_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim; d-- > 0;) {
    if (info.shape[static_cast<std::size_t>(d)] > 1 && info.strides[static_cast<std::size_t>(d)] != stride)
      throw UsageError(std::string(what) + ": the buffer is not contiguous");
    stride *= info.shape[static_cast<std::size_t>(d)];
  }
  return {static_cast<const char*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

std::uint64_t hash_buffer(const py::buffer& b, std::uint64_t seed) {
  const py::buffer_info info = b.request();
  const std::string_view bytes = bytes_of(info, "hash");
  py::gil_scoped_release release;
  return hash_bytes(bytes.data(), bytes.size(), seed);
}

// Each buffer's hash, and one hash of them all in order (with their count).
py::tuple hash_all(const py::list& buffers, std::uint64_t seed) {
  std::vector<py::buffer_info> infos;
  std::vector<std::string_view> views;
  for (const py::handle h : buffers) {
    infos.push_back(py::reinterpret_borrow<py::buffer>(h).request());
    views.push_back(bytes_of(infos.back(), "hash_all"));
  }
  std::vector<std::uint64_t> hashes(views.size() + 1);
  {
    py::gil_scoped_release release;
    for (std::size_t i = 0; i < views.size(); ++i) hashes[i] = hash_bytes(views[i].data(), views[i].size(), seed);
    hashes.back() = views.size();
  }
  const std::uint64_t combined = hash_bytes(hashes.data(), hashes.size() * sizeof(std::uint64_t), seed);
  hashes.pop_back();
  return py::make_tuple(hashes, combined);
}

std::vector<std::int64_t> int64_vector(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& a) {
  return {a.data(), a.data() + a.size()};
}

std::vector<float> float_vector(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  return {a.data(), a.data() + a.size()};
}

// Shares as a list of int64 arrays, one a rank, laid out as EpochShares wants.
struct Shares {
  std::vector<std::int64_t> flat, sizes;
  std::size_t widest = 0;
  EpochShares view(std::int64_t dataset_size) const { return {dataset_size, flat, widest, sizes}; }
};
Shares shares_of(const py::list& ranks) {
  Shares s;
  std::vector<std::vector<std::int64_t>> each;
  for (const py::handle h : ranks) {
    each.push_back(int64_vector(py::cast<py::array>(h)));
    s.widest = std::max(s.widest, each.back().size());
    s.sizes.push_back(static_cast<std::int64_t>(each.back().size()));
  }
  s.flat.assign(s.widest * each.size(), -1);
  for (std::size_t r = 0; r < each.size(); ++r)
    std::copy(each[r].begin(), each[r].end(), s.flat.begin() + static_cast<std::ptrdiff_t>(r * s.widest));
  return s;
}

py::dict judge_epoch(std::int64_t epoch, std::int64_t dataset_size, const py::list& ranks,
                     const std::optional<py::list>& previous, std::optional<bool> shuffled, bool strict) {
  if (dataset_size < 0) throw UsageError("the data set's size is negative");
  const Shares now = shares_of(ranks);
  std::optional<Shares> before;
  if (previous) before = shares_of(*previous);
  ShareVerdict v;
  {
    py::gil_scoped_release release;
    const EpochShares prev = before ? before->view(dataset_size) : EpochShares{};
    v = judge_shares(epoch, now.view(dataset_size), ShareRules{strict, shuffled}, before ? &prev : nullptr);
  }
  py::list repeated;
  for (const ShareCount::Repeat& r : v.count.repeated) repeated.append(py::make_tuple(r.example, r.ranks));
  py::dict d;
  d["passed"] = v.passed;
  d["message"] = v.message;
  d["padded"] = v.padded;
  d["dropped"] = v.dropped;
  d["shuffled"] = v.shuffled;
  d["repeats_previous_epoch"] = v.repeats_previous_epoch;
  d["repeats"] = v.count.repeats;
  d["missing"] = v.count.missing;
  d["repeated"] = repeated;
  d["missed"] = v.count.missed;
  return d;
}

Batch batch_of(const ModelConfig& model, const py::array& x, const py::array& y) {
  Batch b;
  b.in_dim = model.in_dim();
  b.out_dim = model.out_dim();
  b.loss = model.loss;
  b.x = float_vector(x);
  if (b.x.size() % static_cast<std::size_t>(b.in_dim) != 0)
    throw UsageError("a batch's inputs hold " + std::to_string(b.x.size()) + " values, not a multiple of the model's " +
                     std::to_string(b.in_dim) + " inputs");
  b.size = static_cast<std::int64_t>(b.x.size()) / b.in_dim;
  if (model.loss == Loss::mse) {
    b.y = float_vector(y);
    if (b.y.size() != static_cast<std::size_t>(b.size) * static_cast<std::size_t>(b.out_dim))
      throw UsageError("a batch of " + std::to_string(b.size) + " examples has " + std::to_string(b.y.size()) +
                       " targets, where mse needs " + std::to_string(b.size * b.out_dim));
  } else {
    b.labels = int64_vector(y);
    if (b.labels.size() != static_cast<std::size_t>(b.size))
      throw UsageError("a batch of " + std::to_string(b.size) + " examples has " + std::to_string(b.labels.size()) +
                       " class labels");
    for (const std::int64_t l : b.labels)
      if (l < 0 || l >= b.out_dim)
        throw UsageError("class label " + std::to_string(l) + " is outside [0, " + std::to_string(b.out_dim) + ")");
  }
  return b;
}

py::dict judge_gradient_py(const std::vector<int>& dims, const std::string& activation, const std::string& loss,
                           const py::array& params, const py::list& parts, const py::array& gradient, int world_size) {
  GradientInput in;
  in.model.dims = dims;
  in.model.activation = parse_activation(activation);
  in.model.loss = parse_loss(loss);
  in.model.validate();
  in.params = float_vector(params);
  in.gradient = float_vector(gradient);
  in.world_size = world_size;
  for (const py::handle h : parts) {
    const py::tuple t = py::cast<py::tuple>(h);
    in.parts.push_back({py::cast<int>(t[0]), batch_of(in.model, py::cast<py::array>(t[1]), py::cast<py::array>(t[2]))});
  }
  GradientJudgement j;
  {
    py::gil_scoped_release release;
    j = judge_gradient(in);
  }
  py::list weights;
  for (const PartWeight& w : j.weights) {
    py::dict pw;
    pw["rank"] = w.rank;
    pw["micro_batch"] = w.micro_batch;
    pw["examples"] = w.examples;
    pw["weight"] = w.weight;
    weights.append(pw);
  }
  py::dict d;
  d["passed"] = j.passed;
  d["ratio"] = j.ratio;
  d["element"] = j.element;
  d["value"] = j.value;
  d["reference"] = j.reference;
  d["bound"] = j.bound;
  d["bound_terms"] = j.bound_terms;
  d["batch"] = j.batch;
  d["largest_share"] = j.largest_share;
  d["roundings"] = j.roundings;
  d["weights"] = weights;
  d["weights_differ"] = j.weights_differ;
  d["fit_residual"] = j.fit_residual;
  d["message"] = j.message;
  return d;
}

py::dict locate_py(const std::string& dtype, const py::list& ranks, const std::vector<std::int64_t>& shape) {
  std::vector<py::buffer_info> infos;
  std::vector<std::string_view> views;
  for (const py::handle h : ranks) {
    infos.push_back(py::reinterpret_borrow<py::buffer>(h).request());
    views.push_back(bytes_of(infos.back(), "locate"));
  }
  TensorDifference t;
  {
    py::gil_scoped_release release;
    t = locate_difference(dtype, views, shape);
  }
  py::dict d;
  d["differs"] = t.differs;
  d["flat_index"] = t.flat_index;
  d["index"] = t.index;
  d["differing"] = t.differing;
  d["values"] = t.values;
  d["texts"] = t.texts;
  d["minority"] = t.minority;
  d["distance"] = t.distance;
  d["unit"] = t.unit;
  return d;
}

// A trace's numbers for one float32 tensor (divergence/trace.hpp): its digest, and over its finite
// elements the largest magnitude and the sum, with the count of the others.
py::dict summarize_py(const py::array_t<float, py::array::c_style>& a) {
  TensorSummary s;
  {
    py::gil_scoped_release release;
    s = summarize(std::span<const float>(a.data(), static_cast<std::size_t>(a.size())));
  }
  py::dict d;
  d["digest"] = digest_hex(s.digest);
  d["max_abs"] = s.max_abs;
  d["sum"] = s.sum;
  d["non_finite"] = s.non_finite;
  return d;
}

}  // namespace

}  // namespace dpcheck::torchjob

PYBIND11_MODULE(_core, m) {
  using namespace dpcheck::torchjob;
  m.doc() = "dpcheck's C++ checks for dpcheck.torch";
  m.attr("version") = DPCHECK_VERSION;
  // pybind11 tries the translators last registered first: the derived UsageError after Error.
  py::register_exception<dpcheck::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<dpcheck::UsageError>(m, "UsageError", PyExc_ValueError);
  m.def("hash", &hash_buffer, py::arg("buffer"), py::arg("seed") = 0, "XXH3-64 of a contiguous buffer's bytes");
  m.def("hash_all", &hash_all, py::arg("buffers"), py::arg("seed") = 0,
        "Each buffer's XXH3-64 and one hash of them all, in order: (list, int)");
  m.def("judge_epoch", &judge_epoch, py::arg("epoch"), py::arg("dataset_size"), py::arg("shares"),
        py::arg("previous") = py::none(), py::arg("shuffled") = py::none(), py::arg("strict") = false,
        "One epoch's shares (an int64 array a rank) held to disjointness and cover");
  m.def("judge_gradient", &judge_gradient_py, py::arg("dims"), py::arg("activation"), py::arg("loss"),
        py::arg("params"), py::arg("parts"), py::arg("gradient"), py::arg("world_size"),
        "The all-reduced gradient against the float64 gradient of every rank's batch, within the derived bound");
  m.def("locate", &locate_py, py::arg("dtype"), py::arg("ranks"), py::arg("shape"),
        "The first element where the ranks' copies of a tensor differ, with the vote there");
  m.def("summarize", &summarize_py, py::arg("values"), "A trace's summary of a float32 array");
  m.def("ulp_distance", [](double a, double b) { return dpcheck::ulp_distance(a, b); });
}
