// What the files of the MPI backend share (mpi_world.cpp, mpi_session.cpp, mpi_comm.cpp, mpi_native_comm.cpp): the
// check every MPI call goes through, and the duplicate of MPI_COMM_WORLD each communicator is made on.
// It includes <mpi.h>, so only files built with MPI include it; the public side is src/comm/mpi_comm.hpp.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>

#include "src/comm.hpp"

namespace dpcheck {

// Throws an Error naming the call, MPI's own text for the code, the file and the line.
[[noreturn]] void throw_mpi_error(const char* call, int code, const char* file, int line);

// Every MPI call in dpcheck goes through this: MPI_ERRORS_RETURN makes failures return codes, and this
// turns them into an Error naming the call, MPI's own text for the code, the file and the line.
#define DPCHECK_MPI_CHECK(call)                                                                                 \
  do {                                                                                                          \
    const int dpcheck_mpi_rc_ = (call);                                                                         \
    if (dpcheck_mpi_rc_ != MPI_SUCCESS) ::dpcheck::throw_mpi_error(#call, dpcheck_mpi_rc_, __FILE__, __LINE__); \
  } while (0)

// Whether MPI was started for calls from any thread, one at a time (MPI_THREAD_SERIALIZED or more).
bool mpi_calls_from_any_thread();

// A new duplicate of MPI_COMM_WORLD, for one communicator to own; an Error naming `what` when no
// MpiSession is live in this process.
MPI_Comm duplicate_world(std::string_view what);

// A Comm (made from an MPI_Comm it then owns) on a new duplicate of MPI_COMM_WORLD; the duplicate is
// freed when the constructor throws.
template <class Comm> std::unique_ptr<Communicator> make_on_world_duplicate(std::string_view what) {
  MPI_Comm comm = duplicate_world(what);
  try {
    return std::make_unique<Comm>(comm);
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
}

}  // namespace dpcheck
