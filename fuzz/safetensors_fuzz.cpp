// libFuzzer: SafetensorsFile::parse on arbitrary bytes must return a value (never crash), and on
// success every tensor's span must lie inside the input (ASan checks the reads below).
#include <cstdint>
#include <cstdlib>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = sy::model::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!file.is_ok()) {
    if (file.message().empty()) std::abort();  // every error says what is wrong
    return 0;
  }
  volatile uint8_t sink = 0;
  for (const auto& tensor : file->tensors()) {
    if (tensor.nbytes > 0) sink = sink + tensor.data[0] + tensor.data[tensor.nbytes - 1];
    if (file->find(tensor.name) != &tensor) std::abort();
  }
  return 0;
}
