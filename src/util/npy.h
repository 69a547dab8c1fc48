// NumPy .npy files (format 1.0/2.0/3.0 read, 1.0 written; little-endian, C order), the wire format
// of routed-expert arrays (vLLM's `routed_experts`) and of replay inputs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "util/status.h"

namespace sy {

struct NpyArray {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, C order, product(shape) * dtype_size(dtype) bytes
  int64_t numel() const;
};

// The bytes of a .npy file holding `data` (product(shape) elements of `dtype`, C order).
// Supported dtypes: U8 U16 U32 U64 I8 I16 I32 I64 F16 F32 F64 BOOL.
std::string npy_encode(DType dtype, const std::vector<int64_t>& shape, const void* data);
// Validates magic, version, header dict (descr, fortran_order False, shape) and sizes.
Result<NpyArray> npy_decode(std::string_view bytes);
Status npy_write_file(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                      const void* data);
Result<NpyArray> npy_read_file(const std::string& path);
// Integer array (any integer dtype, or bool) -> int64 values, e.g. for route replay input.
Result<std::vector<int64_t>> npy_to_int64(const NpyArray& array);

}  // namespace sy
