// The MPI backend's process world: MPI's start and end around a process (MpiSession), and what every
// MPI communicator is made on (src/comm/mpi_world.hpp). Built only with MPI (src/comm/mpi_stub.cpp
// stands in without it).
#include "src/comm/mpi_world.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"

namespace dpcheck {

void throw_mpi_error(const char* call, int code, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw_call_error(call, code, len > 0 ? std::string_view(text, static_cast<std::size_t>(len)) : "unknown MPI error",
                   file, line);
}

bool mpi_calls_from_any_thread() {
  int level = MPI_THREAD_SINGLE;
  return MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_SERIALIZED;
}

MPI_Comm duplicate_world(std::string_view what) {
  int initialized = 0, finalized = 0;
  DPCHECK_MPI_CHECK(MPI_Initialized(&initialized));
  DPCHECK_MPI_CHECK(MPI_Finalized(&finalized));
  if (!initialized || finalized) throw Error(std::string(what) + " needs a live MpiSession in this process");
  MPI_Comm comm = MPI_COMM_NULL;
  DPCHECK_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return comm;
}

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
  // while the rank's thread runs the backward pass (src/bucketing.hpp). The local backend's threads
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
