// The "local" backend: N ranks as threads of one process. Ranks share nothing but the hub behind
// these communicators. Reductions run in a fixed order (rank 0 + rank 1 + ... + rank N-1, element
// by element), so every rank receives bitwise identical results; the work is split so that rank r
// reduces the r-th slice of the buffer for everyone.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "src/comm.hpp"

namespace dpcheck {

class LocalHub;

// Owns the hub and one Communicator per rank. Communicators must only be used from one thread each.
class LocalWorld {
 public:
  explicit LocalWorld(int size, std::chrono::milliseconds timeout = Communicator::default_timeout);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const;
  Communicator& comm(int rank);

  // Marks the world as failed: every rank blocked in, or later entering, a collective throws an Error
  // that names the failed rank and reason, instead of waiting for the timeout.
  void abort(int rank, const std::string& reason);

 private:
  std::shared_ptr<LocalHub> hub_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// Runs fn on `size` threads, one per rank, and joins them all. If a rank throws, the world is aborted
// so that the others end promptly; afterwards the exception that started the failure is rethrown.
void run_local(int size, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = Communicator::default_timeout);

}  // namespace dpcheck
