// libFuzzer: npy_decode on arbitrary bytes never crashes; whatever it accepts re-encodes to an
// array that decodes to the same dtype, shape and data.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "util/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto array = sy::npy_decode(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!array.is_ok()) return 0;
  (void)sy::npy_to_int64(*array);
  auto again = sy::npy_decode(sy::npy_encode(array->dtype, array->shape, array->data.data()));
  if (!again.is_ok() || again->dtype != array->dtype || again->shape != array->shape || again->data != array->data)
    std::abort();
  return 0;
}
