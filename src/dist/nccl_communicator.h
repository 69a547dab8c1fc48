// NcclCommunicator: one process per GPU, launched by MPI (mpirun -np N). MPI gives the rank,
// carries rank 0's ncclUniqueId to the others, and carries the host-side collectives (broadcast
// of the step plan, barrier); NCCL carries the device collectives on the caller's CUDA stream.
// Compiled when CMake finds both NCCL and MPI (SWITCHYARD_HAVE_NCCL); otherwise
// make_nccl_communicator says what is missing.
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
// MPI_Init where this build has MPI (every rank calls it first, before parsing arguments into
// a server); a no-op world of size 1 otherwise. Sets NCCL_NVLS_ENABLE=0 (NVLink multicast off)
// for every launch path.
MpiWorld mpi_init(int* argc, char*** argv);
void mpi_finalize(const MpiWorld& world);
// True where this build has MPI / NCCL.
bool have_mpi();
bool have_nccl();

// The NCCL communicator of all MPI ranks, on GPU world.local_rank, its collectives issued on
// `cuda_stream` (a cudaStream_t; nullptr: the legacy default stream). Device pointers for the
// data collectives; host memory for broadcast (through MPI). kUnsupported in builds without
// NCCL or MPI.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(const MpiWorld& world,
                                                             void* cuda_stream);

}  // namespace sy::dist
