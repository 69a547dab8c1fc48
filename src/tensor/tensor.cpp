#include "tensor/tensor.h"

namespace sy {

std::string Tensor::shape_string() const {
  std::string text = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return text + "]";
}

}  // namespace sy
