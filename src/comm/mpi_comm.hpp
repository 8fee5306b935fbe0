// The "mpi" backend: one process per rank, launched by mpirun (Open MPI) or any launcher MPI supports.
// MPI errors return (MPI_ERRORS_RETURN) and become dpcheck::Error; every collective is built from
// non-blocking point-to-point messages polled against the communicator's timeout, so a dead or stuck
// peer ends the call with a TimeoutError that names the collective and the ranks that did not answer,
// instead of a hang. After a TimeoutError the communicator refuses every later call at once; a peer
// that was late rather than dead may still read or fill the buffers of the call that timed out, so
// the usual next step is MpiSession::abort. Reductions run in the same fixed order as the local
// backend (rank r reduces the r-th slice from every rank in rank order), so every rank receives
// bitwise identical results, the same bits as the local backend's.
//
// Without MPI at build time (DPCHECK_MPI=OFF), MpiSession throws UsageError("this build has no MPI").
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/comm.hpp"

namespace dpcheck {

// True when this build has the MPI backend.
bool mpi_available();

// The MPI library's own name and version ("Open MPI v4.1.4"); "" without MPI. Callable before
// MPI_Init.
std::string mpi_library_version();

// How this build's ranks are started and what its program is called, for the command lines dpcheck
// prints: "mpirun -np" and "dpcheck" with Open MPI (and without MPI), "mpiexec.mpich -n" and
// "dpcheck-mpich" in the program built against MPICH (Debian names MPICH's launcher so, beside Open MPI's).
std::string mpi_launcher();
std::string dpcheck_program();

// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment).
bool launched_by_mpi();

// Initializes MPI on construction and finalizes it on destruction. One per process.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // The communicator over all ranks (MPI_COMM_WORLD).
  Communicator& world();

  // Ends every rank of the job with this exit code (MPI_Abort): after a timeout the stuck peers too,
  // so that the launcher returns instead of waiting for them.
  [[noreturn]] void abort(int code);

  // Called by each rank that ends with bad input, with its reason: when every rank of the world calls
  // it within `seconds` (they met the same bad input, or each its own), every rank's reason, by rank;
  // std::nullopt when some rank did not come (this rank met its bad input alone: a file missing on its
  // host, a plugin it cannot load), while the others go on to a collective that this rank will never
  // join. On a communicator of its own, so that no collective of world() is disturbed.
  std::optional<std::vector<std::string>> gather_bad_input(const std::string& reason, double seconds);

 private:
  struct BadInput;  // the bad-input communicator (a duplicate of MPI_COMM_WORLD)
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<BadInput> bad_input_;
};

// Both of these need a live MpiSession in this process (Error otherwise), and are collective: every
// rank calls them, in the same order. Destroy what they return before the session ends.

// A new "mpi" communicator over the same ranks as world(), on a duplicate of MPI_COMM_WORLD, with its
// own messages, sequence and timeout: a timeout on it leaves world() usable.
std::unique_ptr<Communicator> make_mpi_communicator();

// A communicator over the same ranks whose collectives are MPI's own (MPI_Allreduce, MPI_Bcast,
// MPI_Allgather, MPI_Barrier; avg is MPI_SUM divided by size() afterwards, int64's toward zero): the
// "mpi-native" backend, and the baseline rows of `dpcheck bench allreduce`. Its collectives neither time
// out nor check that the ranks' calls agree; its host() is `host` when given (dpcheck's control
// messages then time out), else itself. Open MPI's MCA parameters choose its all-reduce algorithm
// (coll_tuned_use_dynamic_rules, coll_tuned_allreduce_algorithm).
std::unique_ptr<Communicator> make_mpi_native_communicator(Communicator* host = nullptr);

}  // namespace dpcheck
