// LocalGroup: a communicator group of N ranks inside one process, one thread per rank, over host
// memory. Every collective meets at a barrier, so each rank's thread must issue the same
// collectives in the same order (as NCCL requires). Sums run in rank order 0..N-1 on every rank,
// so every rank gets the same bits.
#pragma once

#include <barrier>
#include <functional>
#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace sy::dist {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  ~LocalGroup();
  int size() const { return size_; }
  Communicator& rank(int r) { return *ranks_[r]; }
  // Runs body(rank) on `size` threads (rank 0 on a new thread too) and returns the first error
  // by rank order. A body that stops issuing collectives early leaves the others waiting: bodies
  // must issue the same collectives even on error paths.
  Status run(const std::function<Status(Communicator&)>& body);

 private:
  friend class LocalCommunicator;
  struct Slot {
    const void* in = nullptr;
    void* out = nullptr;
    int64_t count = 0;
    DType dtype = DType::kF32;
    const std::vector<int64_t>* send_counts = nullptr;
    const std::vector<int64_t>* recv_counts = nullptr;
    int root = 0;
  };
  int size_;
  std::barrier<> barrier_;
  std::vector<Slot> slots_;
  std::vector<uint8_t> flags_;  // per rank: a collective's arguments were wrong there
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace sy::dist
