#include "dist/local_communicator.h"

#include <cstring>
#include <thread>

#include "tensor/dtype.h"

namespace sy::dist {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& group, int rank) : group_(group), rank_(rank) {}
  std::string name() const override { return "local"; }
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    post({data, data, count, dtype});
    Status status = agree("all_reduce_sum", /*sum=*/true);
    std::vector<uint8_t> result;
    if (status.is_ok()) {
      result.resize(collective_bytes(dtype, count));
      sum_in_rank_order(inputs(), 0, count, dtype, result.data());
    }
    group_.barrier_.arrive_and_wait();
    if (status.is_ok()) std::memcpy(data, result.data(), result.size());
    return status;
  }

  Status all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    post({in, out, count, dtype});
    Status status = agree("all_gather", false);
    if (status.is_ok()) {
      const int64_t bytes = collective_bytes(dtype, count);
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<uint8_t*>(out) + r * bytes, group_.slots_[r].in, bytes);
    }
    group_.barrier_.arrive_and_wait();
    return status;
  }

  Status reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype) override {
    post({in, out, count, dtype});
    Status status = agree("reduce_scatter_sum", true);
    if (status.is_ok()) sum_in_rank_order(inputs(), rank_ * count, count, dtype, out);
    group_.barrier_.arrive_and_wait();
    return status;
  }

  Status all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dtype) override {
    LocalGroup::Slot slot{in, out, 0, dtype};
    slot.send_counts = &send_counts;
    slot.recv_counts = &recv_counts;
    post(slot);
    Status status = agree("all_to_all", false);
    const int n = size();
    for (int s = 0; s < n && status.is_ok(); ++s) {
      const auto* sent = group_.slots_[s].send_counts;
      if (static_cast<int>(sent->size()) != n || static_cast<int>(recv_counts.size()) != n)
        status = Status::errorf("all_to_all: {} counts for a group of {}", sent->size(), n);
      else if ((*sent)[rank_] != recv_counts[s])
        status =
            Status::errorf("all_to_all: rank {} sends {} elements to rank {}, which expects {}", s,
                           (*sent)[rank_], rank_, recv_counts[s]);
    }
    // Every rank learns whether any rank found a mismatch before anyone copies.
    group_.flags_[rank_] = !status.is_ok();
    group_.barrier_.arrive_and_wait();
    for (int r = 0; r < n; ++r)
      if (group_.flags_[r] && status.is_ok())
        status = Status::errorf("all_to_all: counts disagree (seen by rank {})", r);
    if (status.is_ok()) {
      uint8_t* dst = static_cast<uint8_t*>(out);
      for (int s = 0; s < n; ++s) {
        const LocalGroup::Slot& from = group_.slots_[s];
        int64_t offset = 0;
        for (int d = 0; d < rank_; ++d) offset += (*from.send_counts)[d];
        const int64_t bytes = collective_bytes(dtype, recv_counts[s]);
        std::memcpy(dst, static_cast<const uint8_t*>(from.in) + collective_bytes(dtype, offset),
                    bytes);
        dst += bytes;
      }
    }
    group_.barrier_.arrive_and_wait();
    return status;
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    LocalGroup::Slot slot{data, data, bytes, DType::kU8};
    slot.root = root;
    post(slot);
    Status status = agree("broadcast", false);
    if (status.is_ok() && (root < 0 || root >= size()))
      status = Status::errorf("broadcast: root {} outside a group of {}", root, size());
    if (status.is_ok() && rank_ != root) std::memcpy(data, group_.slots_[root].in, bytes);
    group_.barrier_.arrive_and_wait();
    return status;
  }

  Status barrier() override {
    group_.barrier_.arrive_and_wait();
    return Status::ok();
  }

 private:
  void post(const LocalGroup::Slot& slot) {
    group_.slots_[rank_] = slot;
    group_.barrier_.arrive_and_wait();
  }
  std::vector<const void*> inputs() const {
    std::vector<const void*> in;
    for (const LocalGroup::Slot& s : group_.slots_) in.push_back(s.in);
    return in;
  }
  // The same verdict on every rank: every rank compares every slot with rank 0's.
  Status agree(const char* op, bool sum) const {
    const LocalGroup::Slot& first = group_.slots_[0];
    if (collective_bytes(first.dtype, 1) == 0 ||
        (sum && first.dtype != DType::kF32 && first.dtype != DType::kBF16))
      return Status::errorf("{}: dtype {} is not supported", op, dtype_name(first.dtype));
    for (int r = 1; r < size(); ++r) {
      const LocalGroup::Slot& s = group_.slots_[r];
      if (s.count != first.count || s.dtype != first.dtype || s.root != first.root)
        return Status::errorf("{}: rank {} passed {} x {} (root {}), rank 0 {} x {} (root {})", op,
                              r, s.count, dtype_name(s.dtype), s.root, first.count,
                              dtype_name(first.dtype), first.root);
    }
    return Status::ok();
  }

  LocalGroup& group_;
  int rank_;
};

LocalGroup::LocalGroup(int size) : size_(size), barrier_(size), slots_(size), flags_(size, 0) {
  for (int r = 0; r < size; ++r) {
    auto comm = std::make_unique<LocalCommunicator>(*this, r);
    ranks_.push_back(std::move(comm));
  }
}

LocalGroup::~LocalGroup() = default;

Status LocalGroup::run(const std::function<Status(Communicator&)>& body) {
  std::vector<Status> results(size_);
  std::vector<std::thread> threads;
  for (int r = 0; r < size_; ++r) threads.emplace_back([&, r] { results[r] = body(*ranks_[r]); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size_; ++r)
    if (!results[r].is_ok()) return results[r].with_context(fmt::format("rank {}: ", r));
  return Status::ok();
}

}  // namespace sy::dist
