#include "backend/cuda/moe_route.cuh"

namespace sy::backend::cuda {
namespace {

// One block per token; its warps share the E router rows (router_logits_block). THREADS: 128 for
// steps with enough tokens to fill the GPU; up to 1024 for a few-token step, where one block's
// four warps walking E rows one after another were a chain of dependent DRAM latencies (gpt-oss
// batch-1 decode, ncu: 57 us per layer for 184 KB of router weights).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) route_kernel(RouteLaunch a) {
  __shared__ float logits[kMaxRouteExperts];
  __shared__ int32_t ids[kMaxRouteTopK];
  __shared__ float weights[kMaxRouteTopK];
  const int64_t t = blockIdx.x;
  router_logits_block(a.hidden + t * a.params.hidden, a.router, a.params, logits);
  __syncthreads();
  if (threadIdx.x < 32) {
    const bool is_forced = a.forced && a.forced[t];
    const int32_t* forced = is_forced ? a.source + t * a.route_row_stride : nullptr;
    route_select_warp(logits, a.params, forced, ids, weights);
    const int K = a.params.top_k;
    if (threadIdx.x < K) {
      a.ids[t * K + threadIdx.x] = ids[threadIdx.x];
      a.weights[t * K + threadIdx.x] = weights[threadIdx.x];
      if (a.sink) a.sink[t * a.route_row_stride + threadIdx.x] = ids[threadIdx.x];
      if (a.weight_sink) a.weight_sink[t * a.route_row_stride + threadIdx.x] = weights[threadIdx.x];
    }
  }
}

}  // namespace

void launch_route(const RouteLaunch& launch, cudaStream_t stream) {
  if (launch.tokens == 0) return;
  const unsigned grid = static_cast<unsigned>(launch.tokens);
  if (launch.tokens <= 16)
    route_kernel<1024><<<grid, 1024, 0, stream>>>(launch);
  else if (launch.tokens <= 128)
    route_kernel<512><<<grid, 512, 0, stream>>>(launch);
  else
    route_kernel<128><<<grid, 128, 0, stream>>>(launch);
  SY_CUDA_LAUNCH_CHECK("route_kernel");
}

}  // namespace sy::backend::cuda
