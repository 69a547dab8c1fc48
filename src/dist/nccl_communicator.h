// NcclCommunicator: one process per GPU, launched by MPI (mpirun -np N). MPI gives the rank,
// carries rank 0's ncclUniqueId to the others, and carries the host-side collectives (broadcast
// of the step plan, barrier); NCCL carries the device collectives on the caller's CUDA stream.
// Compiled when CMake finds both NCCL and MPI (SWITCHYARD_HAVE_NCCL); otherwise
// make_nccl_communicator says what is missing.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "dist/mpi_communicator.h"

namespace sy::dist {

// True where this build has NCCL (and MPI, which carries its id).
bool have_nccl();

// The NCCL communicator of all MPI ranks, on GPU world.local_rank, its collectives issued on
// `cuda_stream` (a cudaStream_t; nullptr: the legacy default stream). Device pointers for the
// data collectives; host memory for broadcast (through MPI). kUnsupported in builds without
// NCCL or MPI.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(const MpiWorld& world,
                                                             void* cuda_stream);

}  // namespace sy::dist
