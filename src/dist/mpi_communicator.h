// The MPI world a multi-process run lives in (mpirun -np N switchyard ...), and MpiCommunicator:
// the collectives over host memory between those processes, for the CPU backend (the NCCL
// communicator carries them between GPUs). Compiled with MPI where CMake finds it
// (SWITCHYARD_HAVE_MPI); without it the world is one process and make_mpi_communicator says why.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace sy::dist {

// The MPI world this process runs in. Without MPI, or when not started by mpirun, size is 1.
struct MpiWorld {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this host (the GPU to use)
  bool initialised = false;
};
// MPI_Init where this build has MPI and a launcher started the process (every rank calls it
// first, before parsing arguments); a world of size 1 otherwise. Collectives may then be issued
// from any one thread at a time (the engine thread on rank 0, the main thread elsewhere). Sets
// NCCL_NVLS_ENABLE=0 (NVLink multicast off) for every launch path.
MpiWorld mpi_init(int* argc, char*** argv);
void mpi_finalize(const MpiWorld& world);
// Ends every rank of the job (a rank that failed while the others wait in a collective).
[[noreturn]] void mpi_abort(const MpiWorld& world, int exit_code);
// True where this build has MPI.
bool have_mpi();

// Collectives between the world's processes over host memory. Sums gather every rank's buffer
// and add in rank order on each rank, so every rank gets the same bits whatever MPI's own
// reduction order would be. kUnsupported in builds without MPI; kInvalidArgument when the
// world was not started by a launcher.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(const MpiWorld& world);

}  // namespace sy::dist
