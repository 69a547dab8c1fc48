#include "backend/cuda/moe_route.cuh"

namespace sy::backend::cuda {
namespace {

__global__ void __launch_bounds__(128) route_kernel(RouteLaunch a) {
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
  route_kernel<<<static_cast<unsigned>(launch.tokens), 128, 0, stream>>>(launch);
  SY_CUDA_LAUNCH_CHECK("route_kernel");
}

}  // namespace sy::backend::cuda
