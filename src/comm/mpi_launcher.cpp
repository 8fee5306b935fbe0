// Whether an MPI launcher started this process. It reads the launcher's environment only, so it is
// built with or without MPI: a build without MPI can then say so to a user who runs it under mpirun.
#include <cstdlib>

#include "src/comm/mpi_comm.hpp"

namespace dpcheck {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace dpcheck
