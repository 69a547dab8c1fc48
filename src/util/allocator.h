// Process-wide heap settings for the long-running jobs (serve, generate, bench programs).
#pragma once

namespace sy::util {

// glibc's defaults give freed memory back to the kernel (heap trimming; chunks of 128 KB and up
// mapped and unmapped one by one), so every step's route rows, route logs and event payloads land
// on fresh pages: a page fault per 4 KB, on the engine thread, while the device waits (measured:
// 8 ms per 2 MB on this project's VM against 0.1 ms once the pages stay mapped). Keeps freed
// memory in the heap for reuse (chunks under 32 MB from the heap, no trimming): resident memory
// stays at its peak, as in any server that pools. SY_MALLOC_DEFAULTS=1 leaves glibc's defaults
// (for A/B measurements). No-op on non-glibc systems.
void tune_allocator();

}  // namespace sy::util
