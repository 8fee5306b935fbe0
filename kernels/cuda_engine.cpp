#include "kernels/cuda_engine.hpp"

#include <algorithm>
#include <numeric>

#include "kernels/activation.hpp"
#include "kernels/linear.hpp"
#include "kernels/loss.hpp"
#include "src/error.hpp"

namespace dpcheck::cuda {

CudaEngine::CudaEngine(const ModelConfig& model, const EngineSpec& spec, std::shared_ptr<const Kernels> kernels)
    : model_(model),
      layout_(model),
      spec_(spec),
      kernels_(std::move(kernels)),
      blas_(stream_.get(), spec.tf32),
      memory_(stream_.get()),
      params_(layout_.size()),
      grads_(layout_.size()),
      z_(static_cast<std::size_t>(model.layers())),
      a_(static_cast<std::size_t>(model.layers())) {
  DPCHECK_CUDA_CHECK(cudaGetDevice(&device_));  // the device its stream and buffers were made on
  widest_ = *std::max_element(model.dims.begin(), model.dims.end());
  if (low_precision()) {
    if (kernels_)
      throw UsageError("--precision " + std::string(precision_name(spec_.precision)) +
                       " and a device kernel plugin on the cuda engine do not go together yet");
    low_in_.resize(static_cast<std::size_t>(model.layers()));
    low_w_.resize(static_cast<std::size_t>(model.layers()));
    for (int l = 0; l < model.layers(); ++l) low_w_[static_cast<std::size_t>(l)].resize(layout_.weight(l).size());
  }
  if (kernels_) {
    // The zero bias that dpcheck's activation kernel adds after a plugin's linear_forward added the real one.
    zeros_.resize(static_cast<std::size_t>(widest_));
    DPCHECK_CUDA_CHECK(cudaMemsetAsync(zeros_.get(), 0, zeros_.size() * sizeof(float), stream_.get()));
  }
  DPCHECK_CUDA_CHECK(cudaMemsetAsync(params_.get(), 0, params_.size() * sizeof(float), stream_.get()));
  DPCHECK_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.size() * sizeof(float), stream_.get()));
  stream_.synchronize();
}

CudaEngine::~CudaEngine() { cudaStreamSynchronize(stream_.get()); }

void CudaEngine::load_params(std::span<const float> host) {
  DPCHECK_ASSERT(host.size() == params_.size());
  memory_.copy_from_host(host.data(), params_.get(), host.size());
}

void CudaEngine::store_params(std::span<float> host) const {
  DPCHECK_ASSERT(host.size() == params_.size());
  memory_.copy_to_host(params_.get(), host.data(), host.size());
}

void CudaEngine::store_grads(std::span<float> host) const {
  DPCHECK_ASSERT(host.size() == grads_.size());
  memory_.copy_to_host(grads_.get(), host.data(), host.size());
}

void CudaEngine::zero_grads() {
  DPCHECK_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.size() * sizeof(float), stream_.get()));
}

void CudaEngine::ensure_rows(int rows) {
  if (rows <= capacity_rows_) return;
  const auto r = static_cast<std::size_t>(rows);
  for (int l = 0; l < model_.layers(); ++l) {
    const auto width = static_cast<std::size_t>(model_.dims[static_cast<std::size_t>(l) + 1]);
    z_[static_cast<std::size_t>(l)].resize(r * width);
    if (l + 1 < model_.layers()) a_[static_cast<std::size_t>(l)].resize(r * width);
  }
  const std::size_t widest = r * static_cast<std::size_t>(widest_);
  delta_.resize(widest);
  next_.resize(widest);
  h_.resize(widest);
  x_.resize(r * static_cast<std::size_t>(model_.in_dim()));
  if (model_.loss == Loss::mse) y_.resize(r * static_cast<std::size_t>(model_.out_dim()));
  else labels_.resize(r);
  row_loss_.resize(r);
  bias_workspace_.resize(bias_grad_workspace(rows, widest_));
  if (low_precision()) {
    for (int l = 0; l < model_.layers(); ++l)
      low_in_[static_cast<std::size_t>(l)].resize(r *
                                                  static_cast<std::size_t>(model_.dims[static_cast<std::size_t>(l)]));
    low_delta_.resize(widest);
  }
  capacity_rows_ = rows;
}

void CudaEngine::upload(const Batch& batch) {
  DPCHECK_ASSERT(batch.in_dim == model_.in_dim() && batch.out_dim == model_.out_dim() && batch.loss == model_.loss);
  const int rows = static_cast<int>(batch.size);
  ensure_rows(rows);
  cudaStream_t s = stream_.get();
  if (rows > 0) {
    DPCHECK_CUDA_CHECK(
        cudaMemcpyAsync(x_.get(), batch.x.data(), batch.x.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    if (model_.loss == Loss::mse)
      DPCHECK_CUDA_CHECK(
          cudaMemcpyAsync(y_.get(), batch.y.data(), batch.y.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    else
      DPCHECK_CUDA_CHECK(cudaMemcpyAsync(labels_.get(), batch.labels.data(), batch.labels.size() * sizeof(std::int64_t),
                                         cudaMemcpyHostToDevice, s));
  }
  // The host batch may go away when the caller returns: the copies must be done first.
  stream_.synchronize();
  uploaded_rows_ = rows;
}

void CudaEngine::enqueue_forward_backward(float scale, bool accumulate) {
  enqueue(uploaded_rows_, scale, accumulate, false);
}

double CudaEngine::forward_backward(const Batch& batch, float scale, bool accumulate) {
  upload(batch);
  const int rows = uploaded_rows_;
  if (rows == 0) {
    if (!accumulate) zero_grads();
    return 0.0;
  }
  enqueue(rows, scale, accumulate, true);
  if (kernels_ && kernels_->provides(KernelOp::loss_forward_backward)) {
    stream_.synchronize();
    return plugin_loss_;
  }
  std::vector<double> losses(static_cast<std::size_t>(rows));
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(losses.data(), row_loss_.get(), losses.size() * sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_.get()));
  stream_.synchronize();
  const double sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  const double per =
      model_.loss == Loss::mse ? static_cast<double>(rows) * model_.out_dim() : static_cast<double>(rows);
  return sum / per;
}

void CudaEngine::enqueue(int rows, float scale, bool accumulate, bool want_loss) {
  if (rows == 0) {
    if (!accumulate) zero_grads();
    return;
  }
  cudaStream_t s = stream_.get();
  cublasHandle_t h = blas_.get();
  const int layers = model_.layers();
  const auto dim = [&](int i) { return model_.dims[static_cast<std::size_t>(i)]; };
  const auto input_of = [&](int l) { return l == 0 ? x_.get() : a_[static_cast<std::size_t>(l) - 1].get(); };

  // A device kernel plugin's ops replace these where it provides them (identity has no plugin op).
  const Kernels* k = kernels_.get();
  const bool plugin_linear = k && k->provides(KernelOp::linear_forward);
  const bool plugin_activation =
      k && model_.activation != Activation::identity && k->provides(KernelOp::activation_forward);
  for (int l = 0; l < layers; ++l) {
    float* z = z_[static_cast<std::size_t>(l)].get();
    float* a = l + 1 < layers ? a_[static_cast<std::size_t>(l)].get() : nullptr;
    const float* w = params_.get() + layout_.weight(l).offset;
    const float* b = params_.get() + layout_.bias(l).offset;
    if (plugin_linear) {
      k->linear_forward(input_of(l), w, b, z, rows, dim(l), dim(l + 1), s);
    } else if (low_precision()) {
      // The weights and the input rounded once per pass; the backward pass takes the same ones.
      const auto li = static_cast<std::size_t>(l);
      round_to_low(w, low_w_[li].get(), layout_.weight(l).size(), spec_.precision, s);
      round_to_low(input_of(l), low_in_[li].get(), static_cast<std::size_t>(rows) * static_cast<std::size_t>(dim(l)),
                   spec_.precision, s);
      linear_forward_low(h, low_in_[li].get(), low_w_[li].get(), z, rows, dim(l), dim(l + 1), spec_.precision);
    } else {
      linear_forward(h, input_of(l), w, z, rows, dim(l), dim(l + 1));
    }
    // The bias, unless the plugin added it; the activation, unless the plugin applies it.
    bias_activation_forward(z, plugin_activation ? nullptr : a, plugin_linear ? zeros_.get() : b, rows, dim(l + 1),
                            model_.activation, s);
    if (plugin_activation && a)
      k->activation_forward(model_.activation, z, a, static_cast<std::int64_t>(rows) * dim(l + 1), s);
  }

  const int out = model_.out_dim();
  const float* z_out = z_.back().get();
  double* losses = want_loss ? row_loss_.get() : nullptr;
  if (k && k->provides(KernelOp::loss_forward_backward)) {
    const void* target = model_.loss == Loss::mse ? static_cast<const void*>(y_.get()) : labels_.get();
    plugin_loss_ = k->loss_forward_backward(model_.loss, z_out, target, delta_.get(), rows, out, scale, s);
  } else if (model_.loss == Loss::mse) {
    const auto c = static_cast<float>(2.0 * scale / (static_cast<double>(rows) * out));
    mse_delta(z_out, y_.get(), delta_.get(), rows, out, c, losses, s);
  } else {
    const auto c = static_cast<float>(scale / static_cast<double>(rows));
    softmax_xent_delta(z_out, labels_.get(), delta_.get(), rows, out, c, losses, s);
  }

  float* delta = delta_.get();
  float* next = next_.get();
  const bool plugin_backward = k && k->provides(KernelOp::linear_backward);
  const bool plugin_activation_backward =
      k && model_.activation != Activation::identity && k->provides(KernelOp::activation_backward);
  for (int l = layers - 1; l >= 0; --l) {
    const float* w = params_.get() + layout_.weight(l).offset;
    float* gw = grads_.get() + layout_.weight(l).offset;
    float* gb = grads_.get() + layout_.bias(l).offset;
    if (plugin_backward) {
      k->linear_backward(input_of(l), w, delta, l > 0 ? h_.get() : nullptr, gw, gb, rows, dim(l), dim(l + 1),
                         accumulate, s);
      layer_ready(l);
    } else if (low_precision()) {
      // The products take delta rounded; the bias gradient sums it in float32.
      const auto li = static_cast<std::size_t>(l);
      round_to_low(delta, low_delta_.get(), static_cast<std::size_t>(rows) * static_cast<std::size_t>(dim(l + 1)),
                   spec_.precision, s);
      linear_weight_grad_low(h, low_delta_.get(), low_in_[li].get(), gw, rows, dim(l), dim(l + 1), accumulate,
                             spec_.precision);
      bias_grad(delta, gb, rows, dim(l + 1), accumulate, bias_workspace_.get(), s, spec_.bias_grad);
      layer_ready(l);
      if (l > 0)
        linear_input_grad_low(h, low_delta_.get(), low_w_[li].get(), h_.get(), rows, dim(l), dim(l + 1),
                              spec_.precision);
    } else {
      linear_weight_grad(h, delta, input_of(l), gw, rows, dim(l), dim(l + 1), accumulate);
      bias_grad(delta, gb, rows, dim(l + 1), accumulate, bias_workspace_.get(), s, spec_.bias_grad);
      layer_ready(l);  // queued, not run: the staging's event orders the bucket's copy after these kernels
      if (l > 0) linear_input_grad(h, delta, w, h_.get(), rows, dim(l), dim(l + 1));
    }
    if (l > 0) {
      const float* z = z_[static_cast<std::size_t>(l) - 1].get();
      const float* a = a_[static_cast<std::size_t>(l) - 1].get();
      if (plugin_activation_backward)
        k->activation_backward(model_.activation, z, a, h_.get(), next, static_cast<std::int64_t>(rows) * dim(l), s);
      else activation_backward(h_.get(), z, a, next, rows, dim(l), model_.activation, s);
      std::swap(delta, next);
    }
  }
}

namespace {

// The buckets' buffer on the engine's device, a stream for their copies and all-reduces, and one event
// per bucket recorded on the engine's stream when the hook fires.
class CudaBucketStaging final : public BucketStaging {
 public:
  CudaBucketStaging(int device, cudaStream_t engine, std::size_t elements, std::size_t buckets)
      : engine_(engine), device_(device), buffer_(std::max<std::size_t>(elements, 1)), events_(buckets + 1) {
    try {
      for (cudaEvent_t& e : events_) DPCHECK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } catch (...) {
      destroy_events();
      throw;
    }
  }
  ~CudaBucketStaging() override {
    // The copies back (engine stream) and the buckets' (comm stream) read and write the buffer.
    cudaStreamSynchronize(comm_.get());
    cudaStreamSynchronize(engine_);
    destroy_events();
  }
  void* comm_stream() override { return comm_.get(); }
  void* engine_stream() override { return engine_; }
  float* buffer() override { return buffer_.get(); }
  void mark(std::size_t k) override {
    DPCHECK_ASSERT(k + 1 < events_.size());
    if (k == 0) waited_ = false;  // a new step: its copies back wait for its all-reduces
    DPCHECK_CUDA_CHECK(cudaEventRecord(events_[k], engine_));
  }
  void stage(std::size_t k, const float* grads, std::size_t lo, std::size_t hi) override {
    DPCHECK_ASSERT(k + 1 < events_.size() && lo <= hi && hi <= buffer_.size());
    DPCHECK_CUDA_CHECK(cudaSetDevice(device_));  // the communication thread's first CUDA call may be this one
    DPCHECK_CUDA_CHECK(cudaStreamWaitEvent(comm_.get(), events_[k], 0));
    if (hi > lo)
      DPCHECK_CUDA_CHECK(cudaMemcpyAsync(buffer_.get() + lo, grads + lo, (hi - lo) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, comm_.get()));
  }
  void unstage(float* grads, std::size_t lo, std::size_t hi) override {
    DPCHECK_ASSERT(lo <= hi && hi <= buffer_.size());
    if (!waited_) {  // once a step: the engine's stream waits for everything the buckets queued
      DPCHECK_CUDA_CHECK(cudaEventRecord(events_.back(), comm_.get()));
      DPCHECK_CUDA_CHECK(cudaStreamWaitEvent(engine_, events_.back(), 0));
      waited_ = true;
    }
    if (hi > lo)
      DPCHECK_CUDA_CHECK(cudaMemcpyAsync(grads + lo, buffer_.get() + lo, (hi - lo) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, engine_));
  }

 private:
  void destroy_events() {
    for (cudaEvent_t& e : events_)
      if (e) cudaEventDestroy(e);
    events_.clear();
  }

  cudaStream_t engine_;
  int device_;
  Stream comm_;
  DeviceBuffer<float> buffer_;
  std::vector<cudaEvent_t> events_;  // one a bucket, then the one the copies back wait for
  bool waited_ = false;
};

}  // namespace

std::unique_ptr<BucketStaging> CudaEngine::make_bucket_staging(std::size_t buckets) {
  DPCHECK_CUDA_CHECK(cudaSetDevice(device_));  // the staging's stream on the engine's device
  return std::make_unique<CudaBucketStaging>(device_, stream_.get(), layout_.size(), buckets);
}

std::unique_ptr<Engine> make_engine(const ModelConfig& model, const EngineSpec& spec,
                                    std::shared_ptr<const Kernels> kernels) {
  require_device();
  model.validate();
  return std::make_unique<CudaEngine>(model, spec, std::move(kernels));
}

}  // namespace dpcheck::cuda
