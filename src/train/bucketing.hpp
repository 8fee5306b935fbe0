// The gradient all-reduce in buckets, overlapped with the backward pass, as PyTorch's DDP does it
// (train --bucket-mb M).
//
// The flat gradient (src/train/model.hpp: layer by layer, weight then bias) is cut into buckets of at most M
// MiB of float32, from its end: the backward pass produces the last layer first, so the first bucket
// holds the last layer's gradient and is the first to be ready. A bucket may split a tensor. A bucket
// is ready once every layer it touches is final, which is when the lowest of them is (the backward
// pass goes down the layers). As soon as it is, the rank's thread copies it into the bucket's own
// buffer (in the all-reduce's dtype) and hands it to a communication thread, which all-reduces the
// buckets one after the other, in the same order on every rank; when the backward pass has returned
// and every bucket is done, the reduced buckets are copied back into the gradient. So the engine's
// gradient stays the rank's own until then (the loss scaler and the trace see it whole), and the
// copies are taken from final values only: on the CPU a bucket started too early is reduced from
// stale ones, every time, not by chance of timing (on a GPU its copy would race the kernels that
// write it, so there it would show only by chance).
//
// Each element is reduced by one call of the communicator either way, so with a backend whose
// reduction of an element depends on nothing but the inputs, in rank order (local, mpi, cuda-local),
// bucketed training gives the bits of one all-reduce: the property bucketing_preserves_bits. A ring's
// order depends on where in the call an element falls (nccl's chunks), so there the bits may differ.
//
// On a GPU (an engine with BucketStaging, src/train/engine.hpp) the hook fires as a layer's kernels are
// queued: launching a bucket records an event on the engine's stream, and the communication thread
// queues the bucket's copy after that event on a stream of its own and all-reduces it there, so the
// device runs the all-reduce beside the rest of the backward pass; the reduced buckets are copied
// back on the engine's stream after the communication stream's work.
//
// Where the communicator cannot be called from another thread (src/comm.hpp), or the gradient lives
// on a device whose engine has no staging, the buckets are reduced in place on the rank's thread after
// the backward pass, in the same order: bucketed, not overlapped.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/comm.hpp"
#include "src/dtype.hpp"
#include "src/train/engine.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

struct GradientBucket {
  std::size_t lo = 0, hi = 0;  // the elements [lo, hi) of the flat gradient
  int ready_layer = 0;         // the layer whose gradient completes it: the lowest one it touches
};

// The elements in `mb` MiB of float32, at least one; UsageError for a negative or non-finite size, or
// one beyond 1 TiB.
std::size_t bucket_elements(double mb);

// The buckets of at most `cap` elements, in the order they are reduced: from the gradient's end.
std::vector<GradientBucket> plan_buckets(const ParamLayout& layout, std::size_t cap);

// The layer holding flat element i.
int layer_of(const ParamLayout& layout, std::size_t i);

// One rank's bucketed all-reduce (avg) of the gradient. Owns its communication thread when
// `threaded`; the communicator must then be callable_from_any_thread(). With `staging` (threaded and
// float32 only) the copies and the all-reduces are queued on the staging's stream, after its marks.
class BucketReducer {
 public:
  BucketReducer(Communicator& comm, std::vector<GradientBucket> buckets, DType dtype, bool threaded,
                std::unique_ptr<BucketStaging> staging = nullptr);
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  bool threaded() const { return threaded_; }
  bool staged() const { return staging_ != nullptr; }

  // A step begins: nothing launched yet; grads is the gradient's first element. Error when the last
  // step was left before finish() (an exception between the two): its buckets may still be in flight
  // on this rank while the other ranks are elsewhere, so no later step could pair its calls with theirs.
  void begin(float* grads);
  // The next bucket to launch (buckets().size() once all are).
  std::size_t next() const { return next_launch_; }
  // Bucket k is ready: copies it from the gradient (staged: marks the engine's stream) and queues it
  // (in order; a bucket launched twice in a step is an error). Unthreaded, it only marks it.
  void launch(std::size_t k);
  // Launches every bucket not yet launched, waits for all, rethrows the error that stopped the
  // communication thread if one did, and writes the reduced buckets back into the gradient.
  // Unthreaded: reduces each bucket in place, in order.
  void finish();
  // The buckets launched before finish() was called: those the backward pass overlapped.
  std::size_t launched_early() const { return launched_early_; }
  // The seconds finish() last waited for the communication thread: the communication the backward
  // pass did not hide.
  double last_wait_seconds() const { return last_wait_; }

 private:
  void run();
  void reduce(std::size_t k);

  Communicator& comm_;
  std::vector<GradientBucket> buckets_;
  DType dtype_;
  bool threaded_;
  std::unique_ptr<BucketStaging> staging_;
  float* grads_ = nullptr;
  std::vector<float> f32_;          // the buckets' buffers, one after the other, for a float32 all-reduce
  std::vector<std::uint16_t> low_;  // the same in bf16
  std::vector<bool> launched_;
  std::size_t next_launch_ = 0;
  std::size_t launched_early_ = 0;
  bool in_step_ = false;
  double last_wait_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t queued_ = 0, done_ = 0;  // buckets queued and reduced in this step
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dpcheck
