// The MPI backend's process world (src/comm/mpi_comm.hpp): MPI's start and end around a process
// (MpiSession), and what this build's MPI library is. Built only with MPI (src/comm/mpi_stub.cpp stands in
// without it).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/mpi_comm.hpp"
#include "src/comm/mpi_world.hpp"
#include "src/error.hpp"

namespace dpcheck {

bool mpi_available() { return true; }

#ifdef MPICH_VERSION
std::string mpi_launcher() { return "mpiexec.mpich -n"; }
std::string dpcheck_program() { return "dpcheck-mpich"; }
#else
std::string mpi_launcher() { return "mpirun -np"; }
std::string dpcheck_program() { return "dpcheck"; }
#endif

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "";
  std::string v(text, static_cast<std::size_t>(std::max(length, 0)));
  // The first line ("Open MPI v4.1.4, package: ..."), up to its first comma.
  v = v.substr(0, v.find_first_of(",\n"));
  while (!v.empty() && (v.back() == ' ' || v.back() == '\0')) v.pop_back();
  return v;
}

struct MpiSession::BadInput {
  MPI_Comm comm = MPI_COMM_NULL;
};

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  DPCHECK_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) throw Error("MpiSession: MPI is already initialized in this process (one session per process)");
  // One thread calls MPI at a time: the rank's own, or a bucketed all-reduce's communication thread
  // while the rank's thread runs the backward pass (src/train/bucketing.hpp). The local backend's threads
  // never call it.
  int provided = 0;
  DPCHECK_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  try {
    DPCHECK_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    world_ = make_mpi_communicator();
    bad_input_ = std::make_unique<BadInput>();
    DPCHECK_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &bad_input_->comm));
  } catch (...) {
    MPI_Finalize();
    throw;
  }
}

MpiSession::~MpiSession() {
  world_.reset();
  if (bad_input_ && bad_input_->comm != MPI_COMM_NULL) MPI_Comm_free(&bad_input_->comm);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Communicator& MpiSession::world() { return *world_; }

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; should an implementation let it, end this process at least
}

std::optional<std::vector<std::string>> MpiSession::gather_bad_input(const std::string& reason, double seconds) {
  const MPI_Comm comm = bad_input_->comm;
  // Who came: a barrier that this rank waits on for `seconds` at most. A rank that never comes leaves it
  // pending, and this rank then ends the job (abort), so the request is never completed.
  MPI_Request came = MPI_REQUEST_NULL;
  DPCHECK_MPI_CHECK(MPI_Ibarrier(comm, &came));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (int done = 0;;) {
    DPCHECK_MPI_CHECK(MPI_Test(&came, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Every rank is here: their reasons, whose lengths differ.
  int size = 0;
  DPCHECK_MPI_CHECK(MPI_Comm_size(comm, &size));
  const int mine = static_cast<int>(std::min<std::size_t>(reason.size(), 1 << 16));
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  DPCHECK_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[static_cast<std::size_t>(r)] = total;
    total += lengths[static_cast<std::size_t>(r)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  DPCHECK_MPI_CHECK(
      MPI_Allgatherv(reason.data(), mine, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm));
  std::vector<std::string> reasons;
  for (int r = 0; r < size; ++r)
    reasons.push_back(all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]),
                                 static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
  return reasons;
}

}  // namespace dpcheck
