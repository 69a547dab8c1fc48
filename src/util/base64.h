// Base64 (RFC 4648 standard alphabet, '=' padding), for routes and replay inputs on the wire.
// Decoding is strict: wrong length, characters outside the alphabet or misplaced '=' are errors.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace sy {

std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text);

}  // namespace sy
