#include "util/allocator.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace sy::util {

void tune_allocator() {
#if defined(__GLIBC__)
  const char* keep_defaults = std::getenv("SY_MALLOC_DEFAULTS");
  if (keep_defaults && std::strcmp(keep_defaults, "0") != 0) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // never hand the heap's top back while it is in use
#endif
}

}  // namespace sy::util
