// The "cpu" engine: float32 forward and backward with Eigen. Its float64 counterpart, written to be read
// rather than to be fast, is reference/mlp.cpp; the checks compare this engine against it. Its buffers are
// host memory (src/io/memory_service.cpp holds the host's MemoryService). With a kernel plugin (--kernels,
// src/plugin/kernel_plugin.hpp), each op the plugin provides runs in place of the engine's own, on the same
// buffers and with the same semantics; the others stay the engine's. The matrix products run on the widest
// instruction set the CPU has, on all its cores when this rank has the machine to itself
// (src/gemm/cpu_gemm.hpp); every buffer is the engine's, kept from one step to the next, since fresh memory
// is slow to touch.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "src/builtin_names.hpp"
#include "src/error.hpp"
#include "src/gemm/cpu_gemm.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/train/engine.hpp"

namespace dpcheck {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

class CpuEngine final : public Engine {
 public:
  CpuEngine(const ModelConfig& model, std::shared_ptr<const Kernels> kernels, const EngineSpec& spec)
      : model_(model),
        kernels_(std::move(kernels)),
        spec_(spec),
        layout_(model),
        params_(layout_.size(), 0.0f),
        grads_(layout_.size(), 0.0f),
        isa_(cpu::engine_isa()),
        z_(static_cast<std::size_t>(model.layers())),
        a_(z_.size()),
        h_(z_.size()),
        delta_(z_.size()),
        low_w_(z_.size()),
        low_in_(z_.size()),
        low_delta_(z_.size()) {}

  std::string_view name() const override { return builtin::cpu; }
  const MemoryService& memory() const override { return host_memory(); }
  const ModelConfig& model() const override { return model_; }
  std::size_t param_count() const override { return layout_.size(); }
  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }

  void load_params(std::span<const float> host) override {
    DPCHECK_ASSERT(host.size() == params_.size());
    host_memory().copy_from_host(host.data(), params_.data(), host.size());
  }
  void store_params(std::span<float> host) const override {
    DPCHECK_ASSERT(host.size() == params_.size());
    host_memory().copy_to_host(params_.data(), host.data(), host.size());
  }
  void store_grads(std::span<float> host) const override {
    DPCHECK_ASSERT(host.size() == grads_.size());
    host_memory().copy_to_host(grads_.data(), host.data(), host.size());
  }
  void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }

  double forward_backward(const Batch& batch, float scale, bool accumulate) override {
    DPCHECK_ASSERT(batch.in_dim == model_.in_dim() && batch.out_dim == model_.out_dim());
    DPCHECK_ASSERT(batch.loss == model_.loss);
    if (!accumulate) zero_grads();
    if (batch.size == 0) return 0.0;
    const auto n = static_cast<Eigen::Index>(batch.size);
    const int layers = model_.layers();
    const ConstMap x(batch.x.data(), n, model_.in_dim());
    const int threads = cpu::engine_threads();

    for (int l = 0; l < layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      const ConstMap w = weight(l);
      // The product's inputs: as they are in float32, or rounded to the low precision (kept for the
      // backward pass, whose products take the same rounded activations and weights).
      const float* in = l == 0 ? x.data() : a_[li - 1].data();
      const float* w_in = w.data();
      if (low_precision()) {
        round_into(low_in_[li], in, n, w.cols());
        round_into(low_w_[li], w.data(), w.rows(), w.cols());
        in = low_in_[li].data();
        w_in = low_w_[li].data();
      }
      z_[li].resize(n, w.rows());
      if (plugin(KernelOp::linear_forward)) {
        kernels_->linear_forward(in, w_in, bias(l).data(), z_[li].data(), n, w.cols(), w.rows());
      } else {
        const ConstMap in_m(in, n, w.cols()), w_m(w_in, w.rows(), w.cols());
        if (spec_.accumulate_in_low_precision) low_precision_product(in_m, w_m.transpose(), z_[li], false);
        else cpu::gemm(isa_, threads, false, true, n, w.rows(), w.cols(), in, w_in, z_[li].data(), false);
        z_[li].rowwise() += bias(l);
      }
      if (l + 1 < layers) {
        a_[li].resize(n, w.rows());
        if (plugin_activation(KernelOp::activation_forward))
          kernels_->activation_forward(model_.activation, z_[li].data(), a_[li].data(), z_[li].size());
        else activate(z_[li], a_[li]);
      }
    }

    const double loss = output_delta(batch, scale);

    for (int l = layers - 1; l >= 0; --l) {
      const auto li = static_cast<std::size_t>(l);
      const Slice& ws = layout_.weight(l);
      Map gw(grads_.data() + ws.offset, ws.shape[0], ws.shape[1]);
      // The products' inputs, as in the forward pass; the delta rounded too. The bias gradient sums
      // the float32 delta.
      const float* in = l == 0 ? x.data() : a_[li - 1].data();
      const float* w_in = weight(l).data();
      const RowMatrix& delta = delta_[li];
      const float* d_in = delta.data();
      if (low_precision()) {
        in = low_in_[li].data();
        w_in = low_w_[li].data();
        round_into(low_delta_[li], delta.data(), delta.rows(), delta.cols());
        d_in = low_delta_[li].data();
      }
      const ConstMap in_m(in, n, ws.shape[1]), w_m(w_in, ws.shape[0], ws.shape[1]), d_m(d_in, n, ws.shape[0]);
      if (plugin(KernelOp::linear_backward)) {
        // The grads were zeroed above unless the engine accumulates, so either flag is right; passing
        // the engine's own exercises both of the plugin's paths in training with micro-batches.
        RowMatrix& h = h_[li];
        if (l > 0) h.resize(n, ws.shape[1]);
        if (low_precision()) {
          // The plugin's linear_backward takes one delta for both: it sums the bias gradient from the
          // rounded delta, so the float32 bias gradient is put back afterwards.
          Eigen::Map<Eigen::RowVectorXf> gb(grads_.data() + layout_.bias(l).offset, ws.shape[0]);
          const Eigen::RowVectorXf before = gb;
          kernels_->linear_backward(in, w_in, d_in, l > 0 ? h.data() : nullptr, gw.data(), gb.data(), n, ws.shape[1],
                                    ws.shape[0], accumulate);
          gb = (accumulate ? before : Eigen::RowVectorXf::Zero(ws.shape[0])) + delta.colwise().sum();
        } else {
          kernels_->linear_backward(in, w_in, d_in, l > 0 ? h.data() : nullptr, gw.data(),
                                    grads_.data() + layout_.bias(l).offset, n, ws.shape[1], ws.shape[0], accumulate);
        }
        layer_ready(l);
        if (l > 0) backward_through_activation(h, li - 1);
        continue;
      }
      if (spec_.accumulate_in_low_precision) low_precision_product(d_m.transpose(), in_m, gw, true);
      else cpu::gemm(isa_, threads, true, false, ws.shape[0], ws.shape[1], n, d_in, in, gw.data(), true);
      Eigen::Map<Eigen::RowVectorXf> gb(grads_.data() + layout_.bias(l).offset, ws.shape[0]);
      gb += delta.colwise().sum();
      layer_ready(l);
      if (l > 0) {
        RowMatrix& h = h_[li];
        if (spec_.accumulate_in_low_precision) {
          low_precision_product(d_m, w_m, h, false);
        } else {
          h.resize(n, ws.shape[1]);
          cpu::gemm(isa_, threads, false, false, n, ws.shape[1], ws.shape[0], d_in, w_in, h.data(), false);
        }
        backward_through_activation(h, li - 1);
      }
    }
    return loss;
  }

 private:
  bool low_precision() const { return spec_.precision != Precision::fp32; }

  // dst = the rows x cols floats at src, each rounded to the engine's precision.
  void round_into(RowMatrix& dst, const float* src, Eigen::Index rows, Eigen::Index cols) const {
    dst.resize(rows, cols);
    const Precision p = spec_.precision;
    for (Eigen::Index i = 0; i < dst.size(); ++i) dst.data()[i] = round_to_precision(src[i], p);
  }

  // The mutant bf16-accumulate: dst (+)= a * b with every partial sum rounded to the low precision,
  // as a kernel whose accumulator is a 16-bit register would.
  template <class A, class B, class D> void low_precision_product(const A& a, const B& b, D& dst, bool add) const {
    const Precision p = spec_.precision == Precision::fp32 ? Precision::bf16 : spec_.precision;
    const RowMatrix ea = a, eb = b;
    if (!add) dst.resize(ea.rows(), eb.cols());
    for (Eigen::Index i = 0; i < ea.rows(); ++i)
      for (Eigen::Index j = 0; j < eb.cols(); ++j) {
        float acc = add ? dst(i, j) : 0.0f;
        for (Eigen::Index k = 0; k < ea.cols(); ++k) acc = round_to_precision(acc + ea(i, k) * eb(k, j), p);
        dst(i, j) = acc;
      }
  }

  // Whether the plugin runs `op` (an activation op only for an activation it has: not identity).
  bool plugin(KernelOp op) const { return kernels_ && kernels_->provides(op); }
  bool plugin_activation(KernelOp op) const { return model_.activation != Activation::identity && plugin(op); }

  // delta_[li] = h f'(z) for layer li's activation.
  void backward_through_activation(const RowMatrix& h, std::size_t li) {
    RowMatrix& delta = delta_[li];
    delta.resize(h.rows(), h.cols());
    if (plugin_activation(KernelOp::activation_backward)) {
      kernels_->activation_backward(model_.activation, z_[li].data(), a_[li].data(), h.data(), delta.data(), h.size());
      return;
    }
    const RowMatrix& z = z_[li];
    const RowMatrix& a = a_[li];
    switch (model_.activation) {
      case Activation::relu: {
        // A plain loop over the three buffers: the same values as Eigen's select, without its overhead.
        const float* hp = h.data();
        const float* zp = z.data();
        float* dp = delta.data();
        for (Eigen::Index i = 0; i < h.size(); ++i) dp[i] = zp[i] > 0.0f ? hp[i] : 0.0f;
        return;
      }
      case Activation::tanh: delta = h.array() * (1.0f - a.array() * a.array()); return;
      case Activation::identity: delta = h; return;
    }
  }

  ConstMap weight(int l) const {
    const Slice& s = layout_.weight(l);
    return ConstMap(params_.data() + s.offset, s.shape[0], s.shape[1]);
  }
  Eigen::Map<const Eigen::RowVectorXf> bias(int l) const {
    const Slice& s = layout_.bias(l);
    return Eigen::Map<const Eigen::RowVectorXf>(params_.data() + s.offset, s.shape[0]);
  }

  // a = f(z), into a's storage (sized like z).
  void activate(const RowMatrix& z, RowMatrix& a) const {
    switch (model_.activation) {
      case Activation::relu: a = z.cwiseMax(0.0f); return;
      // std::tanh rather than Eigen's vectorised approximation, whose error the bound does not model.
      case Activation::tanh: a = z.unaryExpr([](float v) { return std::tanh(v); }); return;
      case Activation::identity: a = z; return;
    }
  }

  // Sets the last layer's delta = scale * d(mean loss)/d(output) and returns the mean loss.
  double output_delta(const Batch& batch, float scale) {
    const RowMatrix& z = z_.back();
    const auto n = z.rows(), d = z.cols();
    RowMatrix& delta = delta_.back();
    delta.resize(n, d);
    if (plugin(KernelOp::loss_forward_backward)) {
      const void* target = model_.loss == Loss::mse ? static_cast<const void*>(batch.y.data()) : batch.labels.data();
      return kernels_->loss_forward_backward(model_.loss, z.data(), target, delta.data(), n, d, scale);
    }
    double loss = 0.0;
    if (model_.loss == Loss::mse) {
      const ConstMap y(batch.y.data(), n, d);
      const auto c = static_cast<float>(2.0 * scale / (static_cast<double>(n) * static_cast<double>(d)));
      delta = (z - y) * c;
      for (Eigen::Index i = 0; i < z.size(); ++i) {
        const double e = static_cast<double>(z.data()[i]) - static_cast<double>(y.data()[i]);
        loss += e * e;
      }
      return loss / (static_cast<double>(n) * static_cast<double>(d));
    }
    // Softmax cross-entropy: p = exp(z - max) / sum, delta = (p - onehot) * scale / n.
    const auto c = static_cast<float>(scale / static_cast<double>(n));
    for (Eigen::Index k = 0; k < n; ++k) {
      const float m = z.row(k).maxCoeff();
      float s = 0.0f;
      double s64 = 0.0;
      for (Eigen::Index j = 0; j < d; ++j) {
        delta(k, j) = std::exp(z(k, j) - m);
        s += delta(k, j);
        s64 += std::exp(static_cast<double>(z(k, j)) - m);
      }
      const auto label = static_cast<Eigen::Index>(batch.labels[static_cast<std::size_t>(k)]);
      for (Eigen::Index j = 0; j < d; ++j) delta(k, j) = (delta(k, j) / s - (j == label ? 1.0f : 0.0f)) * c;
      loss += std::log(s64) + m - static_cast<double>(z(k, label));
    }
    return loss / static_cast<double>(n);
  }

  ModelConfig model_;
  std::shared_ptr<const Kernels> kernels_;  // null: the engine's own kernels throughout
  EngineSpec spec_;
  ParamLayout layout_;
  std::vector<float> params_, grads_;
  cpu::Isa isa_;  // the products' code path, fixed for the engine's life
  // Per layer: pre-activations, activations (a_ unused for the last), the product delta W that goes
  // back through the activation below (h_ unused for the first), and the delta of the layer's output.
  std::vector<RowMatrix> z_, a_, h_, delta_;
  // With a low precision: per layer, the product's rounded weights, input and delta.
  std::vector<RowMatrix> low_w_, low_in_, low_delta_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& model, std::shared_ptr<const Kernels> kernels,
                                        const EngineSpec& spec) {
  return std::make_unique<CpuEngine>(model, std::move(kernels), spec);
}

}  // namespace dpcheck
