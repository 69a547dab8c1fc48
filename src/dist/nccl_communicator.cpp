#include "dist/nccl_communicator.h"

#include <fmt/format.h>

#if SWITCHYARD_HAVE_MPI
#include <mpi.h>
#endif
#if SWITCHYARD_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace sy::dist {

bool have_nccl() {
  return SWITCHYARD_HAVE_NCCL != 0;
}

#if SWITCHYARD_HAVE_NCCL && SWITCHYARD_HAVE_MPI

namespace {

Status nccl_status(ncclResult_t result, const char* op) {
  if (result == ncclSuccess) return Status::ok();
  return Status::error(ErrorCode::kInternal,
                       fmt::format("NCCL {}: {}", op, ncclGetErrorString(result)));
}

Result<ncclDataType_t> nccl_type(DType dtype, bool sum) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      if (!sum) return ncclInt32;
      break;
    case DType::kU8:
      if (!sum) return ncclUint8;
      break;
    default:
      break;
  }
  return Status::error(ErrorCode::kInvalidArgument,
                       fmt::format("NCCL collective: dtype {} is not supported{}",
                                   dtype_name(dtype), sum ? " for a sum" : ""));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }
  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // NCCL's ring and tree all-reduce reduce each element once and copy the result to every
  // rank, so every rank gets the same bits (check_routes_agree is the debug net for it).
  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    SY_ASSIGN(ncclDataType_t type, nccl_type(dtype, true));
    return nccl_status(
        ncclAllReduce(data, data, static_cast<size_t>(count), type, ncclSum, comm_, stream_),
        "all_reduce");
  }
  Status all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    SY_ASSIGN(ncclDataType_t type, nccl_type(dtype, false));
    return nccl_status(ncclAllGather(in, out, static_cast<size_t>(count), type, comm_, stream_),
                       "all_gather");
  }
  Status reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype) override {
    SY_ASSIGN(ncclDataType_t type, nccl_type(dtype, true));
    return nccl_status(
        ncclReduceScatter(in, out, static_cast<size_t>(count), type, ncclSum, comm_, stream_),
        "reduce_scatter");
  }
  // Point-to-point sends and receives in one group (NCCL's all-to-all idiom).
  Status all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dtype) override {
    SY_ASSIGN(ncclDataType_t type, nccl_type(dtype, false));
    if (static_cast<int>(send_counts.size()) != size_ ||
        static_cast<int>(recv_counts.size()) != size_)
      return Status::errorf("all_to_all: counts for {} / {} ranks in a group of {}",
                            send_counts.size(), recv_counts.size(), size_);
    const int64_t elem = collective_bytes(dtype, 1);
    SY_TRY(nccl_status(ncclGroupStart(), "group start"));
    int64_t sent = 0, received = 0;
    for (int peer = 0; peer < size_; ++peer) {
      ncclSend(static_cast<const uint8_t*>(in) + sent * elem,
               static_cast<size_t>(send_counts[peer]), type, peer, comm_, stream_);
      ncclRecv(static_cast<uint8_t*>(out) + received * elem, static_cast<size_t>(recv_counts[peer]),
               type, peer, comm_, stream_);
      sent += send_counts[peer];
      received += recv_counts[peer];
    }
    return nccl_status(ncclGroupEnd(), "all_to_all");
  }
  // Host memory: the step plan rank 0's scheduler made.
  Status broadcast(void* data, int64_t bytes, int root) override {
    if (MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD) != MPI_SUCCESS)
      return Status::error(ErrorCode::kInternal, "MPI_Bcast of the step plan failed");
    return Status::ok();
  }
  Status barrier() override {
    if (cudaStreamSynchronize(stream_) != cudaSuccess)
      return Status::error(ErrorCode::kInternal, "barrier: cudaStreamSynchronize failed");
    return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS
               ? Status::ok()
               : Status::error(ErrorCode::kInternal, "MPI_Barrier failed");
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(const MpiWorld& world,
                                                             void* cuda_stream) {
  if (!world.initialised)
    return Status::error(
        ErrorCode::kInvalidArgument,
        "an NCCL communicator needs the ranks started by mpirun (mpirun -np N switchyard ...)");
  if (cudaSetDevice(world.local_rank) != cudaSuccess)
    return Status::error(
        ErrorCode::kInvalidArgument,
        fmt::format("rank {}: no CUDA device {} on this host", world.rank, world.local_rank));
  ncclUniqueId id;
  if (world.rank == 0) SY_TRY(nccl_status(ncclGetUniqueId(&id), "get unique id"));
  if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status::error(ErrorCode::kInternal, "MPI_Bcast of the NCCL unique id failed");
  ncclComm_t comm;
  SY_TRY(nccl_status(ncclCommInitRank(&comm, world.size, id, world.rank), "comm init"));
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, world.rank, world.size, static_cast<cudaStream_t>(cuda_stream)));
}

#else

Result<std::unique_ptr<Communicator>> make_nccl_communicator(const MpiWorld& world,
                                                             void* cuda_stream) {
  (void)world, (void)cuda_stream;
  return Status::error(
      ErrorCode::kUnsupported,
      fmt::format("this build has no NCCL communicator (NCCL {}, MPI {}): configure with CUDA "
                  "(NCCL under /usr/local/cuda) and OpenMPI (libopenmpi-dev)",
                  have_nccl() ? "found" : "not found", have_mpi() ? "found" : "not found"));
}

#endif

}  // namespace sy::dist
