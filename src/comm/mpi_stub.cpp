// The MPI backend's entry points in a build without MPI (DPCHECK_MPI=OFF, or AUTO where no MPI is
// found): CMake builds this file in place of mpi_world.cpp, mpi_comm.cpp and mpi_native_comm.cpp, and
// every entry point that would need MPI refuses with a UsageError that says how to get it.
#include "src/comm/mpi_comm.hpp"

#include "src/error.hpp"

namespace dpcheck {

namespace {

[[noreturn]] void refuse_without_mpi() {
  throw UsageError("this build has no MPI backend (configure with -DDPCHECK_MPI=ON)");
}

}  // namespace

bool mpi_available() { return false; }
std::string mpi_launcher() { return "mpirun -np"; }
std::string dpcheck_program() { return "dpcheck"; }
std::string mpi_library_version() { return ""; }

struct MpiSession::BadInput {};

MpiSession::MpiSession(int*, char***) { refuse_without_mpi(); }

MpiSession::~MpiSession() = default;

// No session can exist without MPI (the constructor throws), so these are never reached.
Communicator& MpiSession::world() { return *world_; }
void MpiSession::abort(int) {
  throw_call_error("MpiSession::abort", 0, "this build has no MPI backend", __FILE__, __LINE__);
}
std::optional<std::vector<std::string>> MpiSession::gather_bad_input(const std::string&, double) {
  refuse_without_mpi();
}

std::unique_ptr<Communicator> make_mpi_communicator() { refuse_without_mpi(); }
std::unique_ptr<Communicator> make_mpi_native_communicator(Communicator*) { refuse_without_mpi(); }

}  // namespace dpcheck
