// What every MPI communicator is made on (src/comm/mpi_world.hpp): the check of every MPI call, and
// the duplicate of MPI_COMM_WORLD. Built only with MPI (src/comm/mpi_stub.cpp stands in without it).
#include "src/comm/mpi_world.hpp"

#include <string>

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

}  // namespace dpcheck
