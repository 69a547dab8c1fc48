#include "dist/mpi_communicator.h"

#include <climits>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#if SWITCHYARD_HAVE_MPI
#include <mpi.h>
#endif

namespace sy::dist {

bool have_mpi() {
  return SWITCHYARD_HAVE_MPI != 0;
}

MpiWorld mpi_init(int* argc, char*** argv) {
  // The device notes require NVLink multicast (NVLS) off on these machines: forced here so no
  // launch (mpirun, a script, a bare run) can forget it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  MpiWorld world;
#if SWITCHYARD_HAVE_MPI
  // Only when started by a launcher: a plain `switchyard generate` stays a one-process program.
  const bool launched =
      std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  if (!launched) return world;
  // Serialized: rank 0's collectives come from the engine thread, the others' from main.
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "MPI provides thread level %d; Switchyard needs MPI_THREAD_SERIALIZED\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &world.local_rank);
  MPI_Comm_free(&local);
  world.initialised = true;
#else
  (void)argc, (void)argv;
#endif
  return world;
}

void mpi_finalize(const MpiWorld& world) {
#if SWITCHYARD_HAVE_MPI
  if (world.initialised) MPI_Finalize();
#else
  (void)world;
#endif
}

void mpi_abort(const MpiWorld& world, int exit_code) {
#if SWITCHYARD_HAVE_MPI
  if (world.initialised) MPI_Abort(MPI_COMM_WORLD, exit_code);
#else
  (void)world;
#endif
  std::exit(exit_code);
}

#if SWITCHYARD_HAVE_MPI

namespace {

Status mpi_status(int code, const char* op) {
  if (code == MPI_SUCCESS) return Status::ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return Status::error(ErrorCode::kInternal,
                       fmt::format("MPI {}: {}", op, std::string(text, length)));
}

// MPI counts are int: a buffer beyond 2 GiB is refused rather than truncated.
Result<int> mpi_count(int64_t bytes, const char* op) {
  if (bytes < 0 || bytes > INT_MAX)
    return Status::error(ErrorCode::kInternal,
                         fmt::format("MPI {}: {} bytes is beyond MPI's int count", op, bytes));
  return static_cast<int>(bytes);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    SY_TRY(check_sum_dtype(dtype, "all_reduce_sum"));
    const int64_t bytes = collective_bytes(dtype, count);
    gathered_.resize(static_cast<size_t>(bytes * size_));
    SY_TRY(all_gather(data, gathered_.data(), count, dtype));
    sum_in_rank_order(parts(bytes), 0, count, dtype, data);
    return Status::ok();
  }

  Status all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    SY_ASSIGN(int bytes, bytes_of(dtype, count, "all_gather"));
    return mpi_status(MPI_Allgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, MPI_COMM_WORLD),
                      "all_gather");
  }

  Status reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype) override {
    SY_TRY(check_sum_dtype(dtype, "reduce_scatter_sum"));
    // Rank r needs block r of every rank: an all-to-all of equal blocks, then a local sum.
    const int64_t bytes = collective_bytes(dtype, count);
    gathered_.resize(static_cast<size_t>(bytes * size_));
    SY_ASSIGN(int block, mpi_count(bytes, "reduce_scatter_sum"));
    SY_TRY(mpi_status(
        MPI_Alltoall(in, block, MPI_BYTE, gathered_.data(), block, MPI_BYTE, MPI_COMM_WORLD),
        "reduce_scatter_sum"));
    sum_in_rank_order(parts(bytes), 0, count, dtype, out);
    return Status::ok();
  }

  Status all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dtype) override {
    if (static_cast<int>(send_counts.size()) != size_ ||
        static_cast<int>(recv_counts.size()) != size_)
      return Status::errorf("all_to_all: counts for {} / {} ranks in a group of {}",
                            send_counts.size(), recv_counts.size(), size_);
    SY_ASSIGN(int element, bytes_of(dtype, 1, "all_to_all"));
    std::vector<int> send_bytes(size_), send_at(size_), recv_bytes(size_), recv_at(size_);
    int64_t sent = 0, received = 0;
    for (int peer = 0; peer < size_; ++peer) {
      SY_ASSIGN(send_bytes[peer], mpi_count(send_counts[peer] * element, "all_to_all"));
      SY_ASSIGN(recv_bytes[peer], mpi_count(recv_counts[peer] * element, "all_to_all"));
      SY_ASSIGN(send_at[peer], mpi_count(sent, "all_to_all"));
      SY_ASSIGN(recv_at[peer], mpi_count(received, "all_to_all"));
      sent += send_bytes[peer];
      received += recv_bytes[peer];
    }
    return mpi_status(MPI_Alltoallv(in, send_bytes.data(), send_at.data(), MPI_BYTE, out,
                                    recv_bytes.data(), recv_at.data(), MPI_BYTE, MPI_COMM_WORLD),
                      "all_to_all");
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    if (root < 0 || root >= size_)
      return Status::errorf("broadcast: root {} outside a group of {}", root, size_);
    SY_ASSIGN(int count, mpi_count(bytes, "broadcast"));
    return mpi_status(MPI_Bcast(data, count, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
  }

  Status barrier() override { return mpi_status(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }

 private:
  static Status check_sum_dtype(DType dtype, const char* op) {
    if (dtype == DType::kF32 || dtype == DType::kBF16) return Status::ok();
    return Status::errorf("{}: dtype {} is not supported for a sum", op, dtype_name(dtype));
  }
  static Result<int> bytes_of(DType dtype, int64_t count, const char* op) {
    const int64_t bytes = collective_bytes(dtype, count);
    if (bytes == 0 && count > 0)
      return Status::errorf("{}: dtype {} is not supported", op, dtype_name(dtype));
    return mpi_count(bytes, op);
  }
  std::vector<const void*> parts(int64_t block_bytes) const {
    std::vector<const void*> p;
    for (int r = 0; r < size_; ++r) p.push_back(gathered_.data() + r * block_bytes);
    return p;
  }

  int rank_, size_;
  std::vector<uint8_t> gathered_;  // every rank's block (kept: steps reuse it)
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const MpiWorld& world) {
  if (!world.initialised)
    return Status::error(
        ErrorCode::kInvalidArgument,
        "a multi-process run needs its ranks started by mpirun (mpirun -np N switchyard ...)");
  return std::unique_ptr<Communicator>(new MpiCommunicator(world.rank, world.size));
}

#else

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const MpiWorld& world) {
  (void)world;
  return Status::error(ErrorCode::kUnsupported,
                       "this build has no MPI: install OpenMPI (libopenmpi-dev) and rebuild to "
                       "run several processes");
}

#endif

}  // namespace sy::dist
