// The "cuda" engine: the MLP's forward and backward on one GPU, through cuBLAS SGEMM (pedantic FP32 by
// default, TF32 as an option) and the kernels in this folder, into a flat gradient buffer on the device
// laid out like the CPU engine's. Its float64 counterpart is reference/mlp.cpp, as for the CPU engine.
#pragma once

#include <memory>
#include <vector>

#include "kernels/bias_grad.hpp"
#include "kernels/cuda_memory.hpp"
#include "kernels/device.hpp"
#include "kernels/hash.hpp"
#include "src/builtin_names.hpp"
#include "src/target/cuda_api.hpp"
#include "src/train/engine.hpp"

namespace dpcheck::cuda {

class CudaEngine final : public Engine {
 public:
  CudaEngine(const ModelConfig& model, const EngineSpec& spec, std::shared_ptr<const Kernels> kernels = nullptr);
  ~CudaEngine() override;

  std::string_view name() const override { return builtin::cuda; }
  const MemoryService& memory() const override { return memory_; }
  const ModelConfig& model() const override { return model_; }
  std::size_t param_count() const override { return layout_.size(); }
  float* params() override { return params_.get(); }
  float* grads() override { return grads_.get(); }
  void* stream() override { return stream_.get(); }

  void load_params(std::span<const float> host) override;
  void store_params(std::span<float> host) const override;
  void store_grads(std::span<float> host) const override;
  double forward_backward(const Batch& batch, float scale, bool accumulate) override;
  void zero_grads() override;
  void synchronize() override { stream_.synchronize(); }
  // train --bucket-mb: a stream and a buffer for the buckets, ordered after the hook's point by events.
  std::unique_ptr<BucketStaging> make_bucket_staging(std::size_t buckets) override;

  // For the benchmark: the batch stays on the device, and a step can be captured in a CUDA graph.
  void upload(const Batch& batch);
  // forward_backward over the uploaded batch, enqueued only: no host synchronization, no loss.
  void enqueue_forward_backward(float scale, bool accumulate);

 private:
  void ensure_rows(int rows);
  bool low_precision() const { return spec_.precision != Precision::fp32; }
  void enqueue(int rows, float scale, bool accumulate, bool want_loss);

  ModelConfig model_;
  ParamLayout layout_;
  EngineSpec spec_;
  std::shared_ptr<const Kernels> kernels_;  // a device kernel plugin's ops; nullptr: dpcheck's own
  Stream stream_;
  Blas blas_;
  CudaMemory memory_;
  DeviceBuffer<float> params_, grads_;
  std::vector<DeviceBuffer<float>> z_, a_;  // per layer, rows x width
  DeviceBuffer<float> delta_, next_, h_;    // rows x widest
  DeviceBuffer<float> x_, y_;
  DeviceBuffer<std::int64_t> labels_;
  DeviceBuffer<double> row_loss_;
  DeviceBuffer<float> bias_workspace_;
  DeviceBuffer<float> zeros_;  // widest zeros: the bias already added by a plugin's linear_forward
  // --precision: per layer, the product's input and weights rounded to the format; the rounded delta.
  std::vector<DeviceBuffer<std::uint16_t>> low_in_, low_w_;
  DeviceBuffer<std::uint16_t> low_delta_;
  double plugin_loss_ = 0;  // the mean loss a plugin's loss_forward_backward returned
  int capacity_rows_ = 0;
  int uploaded_rows_ = 0;
  int widest_ = 0;
  int device_ = 0;
};

std::unique_ptr<Engine> make_engine(const ModelConfig& model, const EngineSpec& spec,
                                    std::shared_ptr<const Kernels> kernels = nullptr);

}  // namespace dpcheck::cuda
