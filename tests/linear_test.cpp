// The linear layer's three products: the float64 reference (reference/linear.cpp) checked on the CPU
// against plain loops and against reference/mlp.cpp's whole-model gradient, and the cuBLAS kernels
// (kernels/linear.cu) checked against the reference on the GPU.
//
// The bound. Every output element is a dot product of k terms (k = in for the forward product, rows for
// the weight gradient, out for the input gradient), from float32 inputs that are exact in float64. In
// any order, with or without fused multiply-adds, a float32 dot product of k terms is within
// gamma_k * sum |terms| of exact (Higham, section 3.1), u = 2^-24; accumulating into the gradient adds a
// (k+1)-th term, the old value. With TF32 tensor cores each input is cut to 10 mantissa bits (rounded
// or truncated: relative error below 2^-10 each, so a product is within (1 + 2^-10)^2 - 1 <= gamma_4 of
// exact at u = 2^-11), and the float32 accumulation, even truncating, stays below gamma_k at 2^-23; both
// fit in gamma_{k+4} at u = 2^-11. Bounds come from the data's magnitudes, never from |result|.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "reference/bound.hpp"
#include "reference/linear.hpp"
#include "reference/mlp.hpp"
#include "src/rng.hpp"
#include "tests/test_support.hpp"

#if DPCHECK_HAVE_CUDA
#include "kernels/device.hpp"
#include "kernels/linear.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

using reference::Matrix;
[[maybe_unused]] constexpr double u32 = 0x1p-24;
[[maybe_unused]] constexpr double u_tf32 = 0x1p-11;

// Values in [-1, 1) times 2^e, e in [-4, 4]: several binades, far from underflow. Fixed by (seed, stream).
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, std::uint64_t stream) {
  const std::uint64_t key = mix_key(seed, 0x11ea);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = std::ldexp(random_symmetric(key, stream, i), static_cast<int>(random_u64(key, stream + 1000, i) % 9) - 4);
  return v;
}

// The largest error / bound over a matrix; infinite for a NaN (an unwritten, poisoned element) or an
// error where the bound is 0.
struct Ratio {
  double worst = 0;
  Eigen::Index at = 0;
};
template <class Got> Ratio ratio_of(const Got& got, const Matrix<double>& want, const Matrix<double>& bound) {
  Ratio r;
  for (Eigen::Index i = 0; i < want.size(); ++i) {
    const double q =
        error_ratio(static_cast<double>(got[static_cast<std::size_t>(i)]), want.data()[i], bound.data()[i]);
    if (i == 0 || q > r.worst) r = {q, i};
  }
  return r;
}

// ---- the reference on the CPU ------------------------------------------------------------------------

// The textbook loops, to hold the Eigen expressions against.
Matrix<double> loop_product(const Matrix<double>& x, const Matrix<double>& y, bool absolute) {
  Matrix<double> p = Matrix<double>::Zero(x.rows(), y.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < y.cols(); ++j)
      for (Eigen::Index k = 0; k < x.cols(); ++k) p(i, j) += absolute ? std::abs(x(i, k) * y(k, j)) : x(i, k) * y(k, j);
  return p;
}

void expect_close(const Matrix<double>& got, const Matrix<double>& want, const Matrix<double>& magnitude,
                  const std::string& what) {
  ASSERT_EQ(got.rows(), want.rows()) << what;
  ASSERT_EQ(got.cols(), want.cols()) << what;
  for (Eigen::Index i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got.data()[i], want.data()[i], 1e-13 * magnitude.data()[i] + 1e-300) << what << " element " << i;
}

TEST(LinearReference, ProductsAndMagnitudesMatchPlainLoops) {
  for (const auto& [rows, in, out] :
       {std::array{1, 1, 1}, std::array{3, 17, 5}, std::array{33, 7, 1}, std::array{2, 1, 9}, std::array{0, 4, 3}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(out));
    const Matrix<double> a = reference::to_matrix(random_floats(static_cast<std::size_t>(rows * in), 1, 1), rows, in);
    const Matrix<double> w = reference::to_matrix(random_floats(static_cast<std::size_t>(out * in), 1, 2), out, in);
    const Matrix<double> d = reference::to_matrix(random_floats(static_cast<std::size_t>(rows * out), 1, 3), rows, out);
    const reference::Product z = reference::linear_forward(a, w);
    const reference::Product gw = reference::linear_weight_grad(d, a);
    const reference::Product h = reference::linear_input_grad(d, w);
    const Matrix<double> wt = w.transpose(), dt = d.transpose();
    expect_close(z.value, loop_product(a, wt, false), z.magnitude, "z");
    expect_close(z.magnitude, loop_product(a, wt, true), z.magnitude, "|z|");
    expect_close(gw.value, loop_product(dt, a, false), gw.magnitude, "gW");
    expect_close(gw.magnitude, loop_product(dt, a, true), gw.magnitude, "|gW|");
    expect_close(h.value, loop_product(d, w, false), h.magnitude, "h");
    expect_close(h.magnitude, loop_product(d, w, true), h.magnitude, "|h|");
    EXPECT_EQ(gw.value.rows(), out);
    EXPECT_EQ(gw.value.cols(), in);
    if (rows == 0) {
      EXPECT_EQ(gw.value, Matrix<double>::Zero(out, in));  // an empty batch adds nothing
    }
  }
}

// The three products, composed into a whole model with identity activations and mse (bias added and
// summed inline), give reference/mlp.cpp's gradient: the per-layer reference is the model's.
TEST(LinearReference, ComposeToTheWholeModelGradient) {
  for (const std::vector<int>& dims :
       {std::vector<int>{3, 1}, std::vector<int>{5, 7, 2}, std::vector<int>{1, 4, 3, 6}}) {
    const ModelConfig model{dims, Activation::identity, Loss::mse};
    const std::vector<float> params = init_params(model, 5);
    const Batch batch = first_examples(model, 11, 5);
    const auto w = reference::weights<double>(model, params);
    const auto b = reference::biases<double>(model, params);
    const int L = model.layers();
    std::vector<Matrix<double>> act{reference::to_matrix(batch.x, batch.size, model.in_dim())};
    for (int l = 0; l < L; ++l) {
      Matrix<double> z = reference::linear_forward(act.back(), w[static_cast<std::size_t>(l)]).value;
      z.rowwise() += b[static_cast<std::size_t>(l)];
      act.push_back(z);
    }
    const Matrix<double> y = reference::to_matrix(batch.y, batch.size, model.out_dim());
    Matrix<double> delta = (act.back() - y) * (2.0 / static_cast<double>(batch.size * model.out_dim()));
    const ParamLayout layout(model);
    std::vector<double> grad(layout.size());
    for (int l = L - 1; l >= 0; --l) {
      const auto li = static_cast<std::size_t>(l);
      const Matrix<double> gw = reference::linear_weight_grad(delta, act[li]).value;
      for (Eigen::Index i = 0; i < gw.size(); ++i)
        grad[layout.weight(l).offset + static_cast<std::size_t>(i)] = gw.data()[i];
      const reference::RowVector<double> gb = delta.colwise().sum();
      for (Eigen::Index i = 0; i < gb.size(); ++i) grad[layout.bias(l).offset + static_cast<std::size_t>(i)] = gb(i);
      if (l > 0) delta = reference::linear_input_grad(delta, w[li]).value;
    }
    const auto want = reference::loss_and_gradient<double>(model, params, batch);
    for (std::size_t i = 0; i < grad.size(); ++i)
      EXPECT_NEAR(grad[i], want.grad[i], 1e-12 * (1 + std::abs(want.grad[i])))
          << dims_string(dims) << " " << layout.describe_element(i);
  }
}

// The bound holds for another float32 path (Eigen's float product), and a product that leaves out one
// term of the dot product lies outside it: the bound can tell a wrong product from rounding.
TEST(LinearReference, BoundHoldsForFloat32AndRejectsAMissingTerm) {
  for (const auto& [rows, in, out] : {std::array{1, 1, 1}, std::array{17, 33, 5}, std::array{64, 300, 3}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(out));
    const std::vector<float> af = random_floats(static_cast<std::size_t>(rows * in), 2, 1);
    const std::vector<float> wf = random_floats(static_cast<std::size_t>(out * in), 2, 2);
    const Matrix<double> a = reference::to_matrix(af, rows, in), w = reference::to_matrix(wf, out, in);
    const reference::Product z = reference::linear_forward(a, w);
    const Matrix<double> bound = reference::gamma(in, u32) * z.magnitude;
    using MatrixF = Matrix<float>;
    const MatrixF z32 = a.cast<float>() * w.cast<float>().transpose();
    const Ratio ok = ratio_of(std::span<const float>(z32.data(), static_cast<std::size_t>(z32.size())), z.value, bound);
    EXPECT_LE(ok.worst, 1.0);
    const MatrixF short32 = a.leftCols(in - 1).cast<float>() * w.leftCols(in - 1).cast<float>().transpose();
    std::vector<float> missing(static_cast<std::size_t>(rows * out), 0.0f);
    if (in > 1) std::copy_n(short32.data(), missing.size(), missing.begin());
    EXPECT_GT(ratio_of(missing, z.value, bound).worst, 1.0);
  }
}

#if DPCHECK_HAVE_CUDA

// ---- the kernels on the GPU ----------------------------------------------------------------------------

// Dimensions that hit odd and unaligned sizes, around tile and warp widths, and any size up to 300.
rc::Gen<int> gen_dim() {
  return rc::gen::oneOf(rc::gen::element(1, 3, 17, 31, 32, 33, 127, 128, 129, 257), rc::gen::inRange(1, 301));
}

// All bits set: a NaN, so an element the kernel does not write cannot pass.
// gamma for a k-term dot product on this path (see the top of the file).
double gamma_for(std::int64_t k, bool tf32) {
  return tf32 ? reference::gamma(k + 4, u_tf32) : reference::gamma(k, u32);
}

void check_products(bool tf32) {
  cuda::Stream stream;
  cuda::Blas blas(stream.get(), tf32);
  const cudaStream_t s = stream.get();
  double worst_seen = 0;
  rc::detail::checkGTest([&] {
    const int rows = *gen_dim(), in = *gen_dim(), out = *gen_dim();
    const bool accumulate = *rc::gen::arbitrary<bool>();
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    const auto nr = static_cast<std::size_t>(rows), ni = static_cast<std::size_t>(in),
               no = static_cast<std::size_t>(out);
    const std::vector<float> a = random_floats(nr * ni, seed, 1), w = random_floats(no * ni, seed, 2);
    const std::vector<float> d = random_floats(nr * no, seed, 3), old = random_floats(no * ni, seed, 4);
    const auto da = upload(a, s), dw = upload(w, s), dd = upload(d, s);
    cuda::DeviceBuffer<float> dz(nr * no), dh(nr * ni);
    const auto dg = upload(old, s);
    poison(dz, nr * no, s);
    poison(dh, nr * ni, s);
    if (!accumulate) poison(dg, no * ni, s);
    cuda::linear_forward(blas.get(), da.get(), dw.get(), dz.get(), rows, in, out);
    cuda::linear_weight_grad(blas.get(), dd.get(), da.get(), dg.get(), rows, in, out, accumulate);
    cuda::linear_input_grad(blas.get(), dd.get(), dw.get(), dh.get(), rows, in, out);
    const std::vector<float> z = download(dz, nr * no, s), g = download(dg, no * ni, s), h = download(dh, nr * ni, s);

    const Matrix<double> A = reference::to_matrix(a, rows, in), W = reference::to_matrix(w, out, in);
    const Matrix<double> D = reference::to_matrix(d, rows, out), Old = reference::to_matrix(old, out, in);
    const reference::Product rz = reference::linear_forward(A, W);
    reference::Product rg = reference::linear_weight_grad(D, A);
    const reference::Product rh = reference::linear_input_grad(D, W);
    Matrix<double> bound_g = gamma_for(rows, tf32) * rg.magnitude;
    if (accumulate) {
      rg.value += Old;
      bound_g = gamma_for(rows + 1, tf32) * (rg.magnitude + Old.cwiseAbs());
    }
    const Ratio qz = ratio_of(z, rz.value, gamma_for(in, tf32) * rz.magnitude);
    const Ratio qg = ratio_of(g, rg.value, bound_g);
    const Ratio qh = ratio_of(h, rh.value, gamma_for(out, tf32) * rh.magnitude);
    RC_LOG() << rows << "x" << in << "x" << out << (accumulate ? " accumulate" : "") << ": error ratios z " << qz.worst
             << " at " << qz.at << ", gW " << qg.worst << " at " << qg.at << ", h " << qh.worst << " at " << qh.at
             << "\n";
    RC_ASSERT(qz.worst <= 1.0);
    RC_ASSERT(qg.worst <= 1.0);
    RC_ASSERT(qh.worst <= 1.0);
    worst_seen = std::max({worst_seen, qz.worst, qg.worst, qh.worst});
  });
  testing::Test::RecordProperty("max_error_ratio", std::to_string(worst_seen));
}

TEST(LinearGpu, ProductsWithinDerivedBoundOfFloat64Reference) {
  DPCHECK_REQUIRE_GPU();
  check_products(false);
}

TEST(LinearGpu, Tf32ProductsWithinTheTf32Bound) {
  DPCHECK_REQUIRE_GPU();
  check_products(true);
}

// cuBLAS gives the same bits for the same inputs on one handle and stream: the replicas' gradients and
// a replayed step depend on it.
TEST(LinearGpu, RepeatedProductsGiveTheSameBits) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  cuda::Blas blas(stream.get(), false);
  const cudaStream_t s = stream.get();
  const int rows = 513, in = 257, out = 33;
  const auto da = upload(random_floats(513 * 257, 9, 1), s), dd = upload(random_floats(513 * 33, 9, 2), s);
  cuda::DeviceBuffer<float> dg(33 * 257);
  std::vector<std::vector<float>> runs;
  for (int k = 0; k < 3; ++k) {
    poison(dg, 33 * 257, s);
    cuda::linear_weight_grad(blas.get(), dd.get(), da.get(), dg.get(), rows, in, out, false);
    runs.push_back(download(dg, 33 * 257, s));
  }
  for (int k = 1; k < 3; ++k)
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[static_cast<std::size_t>(k)].data(), runs[0].size() * sizeof(float)), 0);
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
