#include "dist/communicator.h"

#include <algorithm>

#include "tensor/dtype.h"

namespace sy::dist {

int64_t collective_bytes(DType dtype, int64_t count) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4 * count;
    case DType::kBF16:
      return 2 * count;
    case DType::kU8:
      return count;
    default:
      return 0;
  }
}

void sum_in_rank_order(const std::vector<const void*>& parts, int64_t offset, int64_t count,
                       DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (const void* p : parts) acc += static_cast<const float*>(p)[offset + i];
      out[i] = acc;
    }
  } else {
    uint16_t* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (const void* p : parts) acc += bf16_to_f32(static_cast<const uint16_t*>(p)[offset + i]);
      out[i] = f32_to_bf16(acc);
    }
  }
}

Status check_routes_agree(Communicator& comm, const std::vector<int32_t>& routes, int64_t layers,
                          int64_t top_k) {
  const int n = comm.size();
  int32_t mine = static_cast<int32_t>(routes.size());
  std::vector<int32_t> sizes(n);
  if (Status s = comm.all_gather(&mine, sizes.data(), 1, DType::kI32); !s.is_ok()) return s;
  for (int r = 1; r < n; ++r)
    if (sizes[r] != sizes[0])
      return Status::error(ErrorCode::kInternal,
                           fmt::format("routes disagree across ranks: rank {} has {} route "
                                       "entries, rank 0 has {}",
                                       r, sizes[r], sizes[0]));
  std::vector<int32_t> all(static_cast<size_t>(n) * routes.size());
  if (Status s = comm.all_gather(routes.data(), all.data(), mine, DType::kI32); !s.is_ok())
    return s;
  const int64_t row = std::max<int64_t>(1, layers * top_k);
  for (int r = 1; r < n; ++r)
    for (size_t i = 0; i < routes.size(); ++i) {
      const int32_t theirs = all[r * routes.size() + i], first = all[i];
      if (theirs != first) {
        const int64_t token = static_cast<int64_t>(i) / row, in_row = static_cast<int64_t>(i) % row;
        return Status::error(
            ErrorCode::kInternal,
            fmt::format("routes disagree across ranks: token row {}, layer {}, slot {}: rank {} "
                        "chose expert {}, rank 0 expert {}",
                        token, in_row / std::max<int64_t>(1, top_k),
                        in_row % std::max<int64_t>(1, top_k), r, theirs, first));
      }
    }
  return Status::ok();
}

}  // namespace sy::dist
