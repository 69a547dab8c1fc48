// PTX wrappers for Hopper's warpgroup matrix multiply (wgmma, sm_90a only): shared-memory matrix
// descriptors for K-major tiles in the 128-byte swizzle, the m64n128k16 bf16 product with f32
// accumulators, and the fences around it. Callers compile their wgmma code only where
// SY_HAS_WGMMA is 1 (the sm_90a pass; the portable compute_80 PTX has no wgmma).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SY_HAS_WGMMA 1
#else
#define SY_HAS_WGMMA 0
#endif

namespace sy::backend::cuda::wgmma {

// A K-major tile of bf16 rows, 64 values (128 bytes) a row, in the 128-byte swizzle: the
// 16-byte chunk c of row r sits at r * 128 + ((c ^ (r % 8)) * 16), the tile starting on a
// 1024-byte boundary (8 rows, one swizzle atom). Where chunk c of row r goes.
__host__ __device__ constexpr uint32_t swizzled_chunk(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The descriptor of such a tile, starting `k` values into its rows (k a multiple of 16: the
// hardware applies the swizzle to the absolute address, so a k step moves the start by 2k bytes).
// Fields: start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29; unused by swizzled
// K-major tiles, 1 by convention), stride byte offset >> 4 (32-45: 1024 bytes from one 8-row
// group to the next), swizzle mode (62-63: 1 = 128 bytes).
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t smem_address, int k) {
  const uint32_t start = smem_address + static_cast<uint32_t>(k) * 2;
  return static_cast<uint64_t>((start & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

#if SY_HAS_WGMMA
// Orders this thread's earlier shared-memory writes (st.shared, cp.async landed) before later
// reads by the async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Before the first wgmma of a batch: earlier register and shared-memory accesses are done.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// d[64 x 128] += A[64 x 16] * B[128 x 16]^T, both K-major in shared memory (descriptors), f32
// accumulators. Register layout of d (per warp w of the warpgroup, lane l): d[4j + c] is row
// 16w + l / 4 + 8 * (c / 2), column 8j + 2 * (l % 4) + c % 2 (mma.sync's m16n8 layout, 16 n8
// blocks side by side).
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b));
}
#endif

}  // namespace sy::backend::cuda::wgmma
