#include "src/train/bucketing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

std::size_t bucket_elements(double mb) {
  if (!std::isfinite(mb) || mb < 0) throw UsageError("--bucket-mb must be a size in MiB of at least 0");
  if (mb > 1024.0 * 1024.0) throw UsageError("--bucket-mb " + std::to_string(mb) + ": at most 1048576 (1 TiB)");
  const double elements = std::floor(mb * 1024.0 * 1024.0 / sizeof(float));
  return std::max<std::size_t>(1, static_cast<std::size_t>(elements));
}

int layer_of(const ParamLayout& layout, std::size_t i) {
  const Slice& s = layout.slice_at(i);
  const auto& slices = layout.slices();
  const auto index = static_cast<std::size_t>(&s - slices.data());
  return static_cast<int>(index / 2);
}

std::vector<GradientBucket> plan_buckets(const ParamLayout& layout, std::size_t cap) {
  DPCHECK_ASSERT(cap >= 1);
  std::vector<GradientBucket> buckets;
  for (std::size_t hi = layout.size(); hi > 0;) {
    const std::size_t lo = hi > cap ? hi - cap : 0;
    buckets.push_back({lo, hi, layer_of(layout, lo)});
    hi = lo;
  }
  return buckets;
}

BucketReducer::BucketReducer(Communicator& comm, std::vector<GradientBucket> buckets, DType dtype, bool threaded,
                             std::unique_ptr<BucketStaging> staging)
    : comm_(comm),
      buckets_(std::move(buckets)),
      dtype_(dtype),
      threaded_(threaded),
      staging_(std::move(staging)),
      launched_(buckets_.size()) {
  DPCHECK_ASSERT(dtype == DType::f32 || dtype == DType::bf16);
  DPCHECK_ASSERT(!threaded || comm.callable_from_any_thread());
  DPCHECK_ASSERT(!staging_ || (threaded && dtype == DType::f32));
  std::size_t total = 0;
  for (const GradientBucket& b : buckets_) {
    DPCHECK_ASSERT(b.lo <= b.hi);
    total = std::max(total, b.hi);
  }
  // Each bucket's buffer sits at the bucket's own place, so the copies in and out are plain slices.
  // Unthreaded, a float32 bucket is reduced in the gradient itself.
  if (dtype_ == DType::bf16) low_.resize(total);
  else if (threaded_ && !staging_) f32_.resize(total);
  if (threaded_) thread_ = std::thread([this] { run(); });
}

BucketReducer::~BucketReducer() {
  if (!threaded_) return;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // A step abandoned after its first launch left the communicator on the staging's stream, which goes
  // with this reducer; the communicator outlives it.
  if (staging_ && in_step_) comm_.set_stream(staging_->engine_stream());
}

void BucketReducer::begin(float* grads) {
  if (in_step_)
    throw Error(
        "the gradient's buckets of an abandoned step may still be in flight: this trainer cannot take "
        "another step");
  in_step_ = true;
  grads_ = grads;
  std::fill(launched_.begin(), launched_.end(), false);
  next_launch_ = 0;
  launched_early_ = 0;
  last_wait_ = 0;
  const std::lock_guard<std::mutex> lock(mu_);
  queued_ = done_ = 0;
}

void BucketReducer::launch(std::size_t k) {
  DPCHECK_ASSERT(k == next_launch_ && k < buckets_.size() && !launched_[k]);
  // The step's buckets go to the staging's stream from the first launch on, not from begin(): until
  // then the rank's thread may still use the communicator (an observer at the whole local gradient).
  // The communication thread is idle (finish() waited for it), and the mutex below orders this before
  // its first call.
  if (staging_ && k == 0) comm_.set_stream(staging_->comm_stream());
  launched_[k] = true;
  ++next_launch_;
  if (!threaded_) return;
  const GradientBucket& b = buckets_[k];
  if (staging_) staging_->mark(k);
  else if (dtype_ == DType::f32)
    std::copy(grads_ + b.lo, grads_ + b.hi, f32_.begin() + static_cast<std::ptrdiff_t>(b.lo));
  else
    for (std::size_t i = b.lo; i < b.hi; ++i) low_[i] = float_to_bf16_bits(grads_[i]);
  {
    const std::lock_guard<std::mutex> lock(mu_);
    ++queued_;
  }
  cv_.notify_all();
}

void BucketReducer::reduce(std::size_t k) {
  const GradientBucket& b = buckets_[k];
  const std::size_t n = b.hi - b.lo;
  if (n == 0) return;
  if (!threaded_ && dtype_ == DType::bf16) {
    for (std::size_t i = b.lo; i < b.hi; ++i) low_[i] = float_to_bf16_bits(grads_[i]);
    comm_.allreduce(low_.data() + b.lo, n, DType::bf16, ReduceOp::avg);
    for (std::size_t i = b.lo; i < b.hi; ++i) grads_[i] = bf16_bits_to_float(low_[i]);
  } else if (!threaded_) {
    comm_.allreduce(grads_ + b.lo, n, DType::f32, ReduceOp::avg);
  } else if (staging_) {
    staging_->stage(k, grads_, b.lo, b.hi);
    comm_.allreduce(staging_->buffer() + b.lo, n, DType::f32, ReduceOp::avg);
  } else if (dtype_ == DType::f32) {
    comm_.allreduce(f32_.data() + b.lo, n, DType::f32, ReduceOp::avg);
  } else {
    comm_.allreduce(low_.data() + b.lo, n, DType::bf16, ReduceOp::avg);
  }
}

void BucketReducer::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || done_ < queued_; });
    if (stop_) return;
    const std::size_t k = done_;
    // After a failed call the step's other buckets are passed over: the world is broken, and each
    // call would only wait out its timeout.
    const bool failed = static_cast<bool>(error_);
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {
      try {
        reduce(k);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error) error_ = error;
    ++done_;
    cv_.notify_all();
  }
}

void BucketReducer::finish() {
  launched_early_ = next_launch_;
  while (next_launch_ < buckets_.size()) launch(next_launch_);
  const auto start = std::chrono::steady_clock::now();
  if (!threaded_) {
    for (std::size_t k = 0; k < buckets_.size(); ++k) reduce(k);
    last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    in_step_ = false;
    return;
  }
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ == queued_; });
    error = error_;
    error_ = nullptr;
  }
  last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  in_step_ = false;
  if (staging_) comm_.set_stream(staging_->engine_stream());
  if (error) std::rethrow_exception(error);
  for (const GradientBucket& b : buckets_) {
    if (staging_) staging_->unstage(grads_, b.lo, b.hi);
    else if (dtype_ == DType::f32)
      std::copy(f32_.begin() + static_cast<std::ptrdiff_t>(b.lo), f32_.begin() + static_cast<std::ptrdiff_t>(b.hi),
                grads_ + b.lo);
    else
      for (std::size_t i = b.lo; i < b.hi; ++i) grads_[i] = bf16_bits_to_float(low_[i]);
  }
}

}  // namespace dpcheck
