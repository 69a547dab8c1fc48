// Communicator: the collectives tensor and expert parallelism need, over buffers of one dtype,
// issued by every rank of a group in the same order. Three implementations: LocalGroup (N ranks
// as N threads of one process, host memory; CPU tests of the sharding and the step plan),
// MpiCommunicator (one process per rank launched by mpirun, host memory: the CPU backend) and
// NcclCommunicator (one process per GPU, device memory, ranks found through MPI).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "util/status.h"

namespace sy::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = sum over ranks of data[i] (f32 or bf16), in place. Every rank receives the same
  // bits: ranks that go on to route from the sum must not disagree by a rounding.
  virtual Status all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // out = the ranks' `count` elements of `in`, concatenated in rank order (size() * count).
  virtual Status all_gather(const void* in, void* out, int64_t count, DType dtype) = 0;
  // in holds size() blocks of `count`; out = the sum over ranks of block rank().
  virtual Status reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype) = 0;
  // Expert-parallel dispatch and combine: rank r sends send_counts[d] elements to each rank d
  // (blocks of `in` in rank order) and receives recv_counts[s] from each rank s (blocks of
  // `out` in rank order). Counts must agree pairwise (what s sends to r is what r expects).
  virtual Status all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                            const std::vector<int64_t>& recv_counts, DType dtype) = 0;
  // `bytes` of data copied from rank `root` to every rank (the step plan).
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  virtual Status barrier() = 0;
};

// Bytes of `count` elements of the dtypes the collectives carry (f32, bf16, i32, u8); 0 for
// other dtypes, which the collectives refuse.
int64_t collective_bytes(DType dtype, int64_t count);

// dst[i] = sum over parts of part[offset + i], in part (rank) order, f32 accumulation (bf16
// rounded once at the end): host-memory communicators sum this way so that every rank gets the
// same bits. dtype f32 or bf16.
void sum_in_rank_order(const std::vector<const void*>& parts, int64_t offset, int64_t count,
                       DType dtype, void* dst);

// Debug check of the routing contract: every rank computed the same routes for the step. Gathers
// each rank's routes to every rank and compares them with rank 0's; a difference is kInternal
// naming the rank, the token row, the layer and the slot (`row_ints` = layers * top_k).
Status check_routes_agree(Communicator& comm, const std::vector<int32_t>& routes, int64_t layers,
                          int64_t top_k);

}  // namespace sy::dist
