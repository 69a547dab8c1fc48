// Tensor: a non-owning view of contiguous, row-major data on one device. Ownership lives in the
// backend that allocated it (or in the mmap of a checkpoint).
#pragma once

#include <array>
#include <cassert>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tensor/dtype.h"

namespace sy {

enum class Device : uint8_t { kCpu, kCuda };

struct Tensor {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};

  Tensor() = default;
  Tensor(void* data_ptr, DType type, std::initializer_list<int64_t> dims, Device where = Device::kCpu)
      : data(data_ptr), dtype(type), device(where) {
    assert(dims.size() <= kMaxRank);
    for (int64_t d : dims) shape[static_cast<size_t>(rank++)] = d;
  }

  bool defined() const { return data != nullptr || numel() == 0; }
  int64_t dim(int axis) const { return shape[static_cast<size_t>(axis < 0 ? rank + axis : axis)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[static_cast<size_t>(i)];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Number of rows when viewed as [rows, last_dim].
  int64_t rows() const { return rank == 0 ? 1 : numel() / dim(-1); }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Same data, new shape (numel must match).
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor view(data, dtype, dims, device);
    assert(view.numel() == numel());
    return view;
  }
  // Rows [begin, begin + count) of the leading axis.
  Tensor slice_rows(int64_t begin, int64_t count) const {
    Tensor view = *this;
    int64_t row_elems = rank ? numel() / shape[0] : 1;
    view.data = static_cast<char*>(data) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype);
    view.shape[0] = count;
    return view;
  }
  std::string shape_string() const;
};

}  // namespace sy
