// The MPI backend's process world (src/comm/mpi_comm.hpp): MPI's start and end around a process
// (MpiSession), and what this build's MPI library is. Built only with MPI (src/comm/mpi_stub.cpp stands in
// without it).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "src/comm/mpi_comm.hpp"
#include "src/comm/mpi_world.hpp"
#include "src/error.hpp"

namespace dpcheck {

bool mpi_available() { return true; }

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
  } catch (...) {
    MPI_Finalize();
    throw;
  }
}

MpiSession::~MpiSession() {
  world_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Communicator& MpiSession::world() { return *world_; }

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; should an implementation let it, end this process at least
}

}  // namespace dpcheck
