#include "backend/cuda/linear_attention.h"

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/delta_chunk.cuh"

namespace sy::backend::cuda {
namespace {

constexpr int kMaxKernel = 8;
// State rows a thread reads per batch in the delta rule's column loops (shared-memory state).
constexpr int kBatch = 8;
// Step tokens each thread checks per pass when a block gathers its sequence's tokens.
constexpr int kScanPerThread = 4;
// Qwen3.5's key heads: the state column in registers; q and k read kFence rows at a time.
constexpr int kRegisterKeyDim = 128;
constexpr int kFence = 16;

using delta_chunk::sigmoid;  // (shared with the chunked kernel's phases)
using delta_chunk::silu;
using delta_chunk::softplus;

// Sums a and b over the block (every thread gets the same sums, added in the same order).
// `red` holds 64 floats; the block's size is a multiple of 32. No barrier after the reads:
// callers alternate two buffers, with a barrier between two uses of the same one.
__device__ float2 block_sum2(float a, float b, float* red) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) {
    red[warp] = a;
    red[32 + warp] = b;
  }
  __syncthreads();
  a = 0.0f;
  b = 0.0f;
  for (int w = 0; w < warps; ++w) {
    a += red[w];
    b += red[32 + w];
  }
  return make_float2(a, b);
}

// The step's tokens of sequence s among [base, base + blockDim.x * kScanPerThread), in step
// order, into list (step indices); returns their count to every thread. token_seq is read once a
// pass, coalesced (a token at a time, the search was a chain of dependent loads). counts: an int
// a warp.
__device__ int gather_tokens(const int32_t* token_seq, int64_t tokens, int s, int64_t base,
                             int32_t* list, int* counts) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  bool mine[kScanPerThread];
#pragma unroll
  for (int j = 0; j < kScanPerThread; ++j) {
    const int64_t t = base + int64_t{j} * blockDim.x + tid;
    mine[j] = t < tokens && token_seq[t] == s;
  }
  int total = 0;
#pragma unroll
  for (int j = 0; j < kScanPerThread; ++j) {
    const unsigned ballot = __ballot_sync(0xffffffffu, mine[j]);
    if (lane == 0) counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = total;
    for (int w = 0; w < warps; ++w) {
      if (w < warp) offset += counts[w];
      total += counts[w];
    }
    if (mine[j])
      list[offset + __popc(ballot & ((1u << lane) - 1u))] =
          static_cast<int32_t>(base + int64_t{j} * blockDim.x + tid);
    __syncthreads();
  }
  return total;
}

// One channel's conv window (delta_chunk::ConvWindow) loaded from and stored to its conv state
// ([channel][HISTORY]); a fresh sequence starts from zeros.
template <int HISTORY>
struct ConvChannel : delta_chunk::ConvWindow<HISTORY> {
  __device__ void load(const __nv_bfloat16* conv_w, const float* state, int64_t channel,
                       bool fresh) {
    this->load_weights(reinterpret_cast<const uint16_t*>(conv_w), channel);
    for (int m = 0; m < HISTORY; ++m) this->window[m] = fresh ? 0.0f : state[m];
  }
  __device__ void store(float* state) const {
    for (int m = 0; m < HISTORY; ++m) state[m] = this->window[m];
  }
};

// Shared memory of delta_net_kernel: the state [kd, vd] (generic key_head_dim only), q and k,
// two block_sum2 buffers, the warps' counts, a pass's token list.
size_t delta_net_smem(int kd, int vd, bool state_in_registers) {
  const int widest = kd > vd ? kd : vd;
  const size_t threads = static_cast<size_t>((widest + 31) / 32 * 32);
  const size_t floats =
      (state_in_registers ? 0 : static_cast<size_t>(kd) * vd) + 2 * static_cast<size_t>(kd) + 128;
  return (floats + 32 + threads * kScanPerThread) * sizeof(float);
}

// KD > 0: key_head_dim == KD, each thread's state column in registers (Qwen3.5: 128); 0: any
// key_head_dim, the state in shared memory. The same operations in the same order either way.
template <int HISTORY, int KD>
__global__ void delta_net_kernel(DeltaNetParams p) {
  extern __shared__ __align__(16) float smem[];
  const int kd = KD > 0 ? KD : p.key_head_dim, vd = p.value_head_dim;
  float* S = smem;                         // [kd, vd]: the head's recurrent state (KD == 0)
  float* qs = S + (KD > 0 ? 0 : kd * vd);  // this token's normalised q and k
  float* ks = qs + kd;
  float* red = ks + kd;  // two buffers of 64 floats for block_sum2
  int* counts = reinterpret_cast<int*>(red + 128);
  int32_t* list = reinterpret_cast<int32_t*>(counts + 32);
  const int s = blockIdx.x / p.value_heads, h = blockIdx.x % p.value_heads;
  const int group = p.value_heads / p.key_heads, key_head = h / group;
  const int64_t key_dim = int64_t{p.key_heads} * kd, value_dim = int64_t{p.value_heads} * vd;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  const int tid = threadIdx.x;
  const bool owns_qk = tid < kd, owns_v = tid < vd;
  const int read = p.state_read[s], write = p.state_write[s];

  const int64_t q_channel = int64_t{key_head} * kd + tid, k_channel = key_dim + q_channel;
  const int64_t v_channel = 2 * key_dim + int64_t{h} * vd + tid;
  const int64_t state_values = int64_t{kd} * vd;
  ConvChannel<HISTORY> conv_q, conv_k, conv_v;
  float column[KD > 0 ? KD : 1];  // KD: column tid of the state
  const float A = expf(p.a_log[h]), dt_bias = p.dt_bias[h];
  const float inv_sqrt_kd = 1.0f / sqrtf(static_cast<float>(kd));
  struct Inputs {
    float q = 0.0f, k = 0.0f, v = 0.0f, z = 0.0f, b = 0.0f, a = 0.0f;
  };
  // A token's global inputs, requested one token ahead: the token loop is a serial chain, and
  // no DRAM latency should sit on it.
  auto load_inputs = [&](int64_t t) {
    Inputs in;
    const float* row = p.qkv + t * conv_dim;
    if (owns_qk) {
      in.q = row[q_channel];
      in.k = row[k_channel];
    }
    if (owns_v) {
      in.v = row[v_channel];
      in.z = p.z[t * value_dim + int64_t{h} * vd + tid];
    }
    in.b = p.b[t * p.value_heads + h];
    in.a = p.a[t * p.value_heads + h];
    return in;
  };

  bool started = false;  // the states are loaded (the sequence has tokens, not padding)
  const int pass = static_cast<int>(blockDim.x) * kScanPerThread;
  for (int64_t base = 0; base < p.tokens; base += pass) {
    const int count = gather_tokens(p.token_seq, p.tokens, s, base, list, counts);  // (uniform)
    if (count == 0) continue;
    if (read < 0) {  // a padding sequence: its rows' output is zero, its states untouched
      for (int i = 0; i < count; ++i)
        if (owns_v) p.out[int64_t{list[i]} * value_dim + int64_t{h} * vd + tid] = 0.0f;
      continue;
    }
    if (!started) {
      started = true;
      const bool fresh = p.positions[list[0]] == 0;  // (tokens come in position order)
      const float* conv_read = p.conv_state + int64_t{read} * conv_dim * HISTORY;
      if (owns_qk) {
        conv_q.load(p.conv_w, conv_read + q_channel * HISTORY, q_channel, fresh);
        conv_k.load(p.conv_w, conv_read + k_channel * HISTORY, k_channel, fresh);
      }
      if (owns_v) conv_v.load(p.conv_w, conv_read + v_channel * HISTORY, v_channel, fresh);
      const float* recurrent_read =
          p.recurrent + (int64_t{read} * p.value_heads + h) * state_values;
      if constexpr (KD > 0) {
#pragma unroll
        for (int i = 0; i < KD; ++i)
          column[i] = fresh || !owns_v ? 0.0f : __ldg(recurrent_read + i * vd + tid);
      } else {
        for (int64_t i = tid; i < state_values; i += blockDim.x)
          S[i] = fresh ? 0.0f : recurrent_read[i];
        __syncthreads();
      }
    }
    Inputs now = load_inputs(list[0]);
    for (int n = 0; n < count; ++n) {
      const int64_t t = list[n];
      const Inputs ahead = n + 1 < count ? load_inputs(list[n + 1]) : Inputs{};
      float q = 0.0f, k = 0.0f, v = 0.0f;
      if (owns_qk) {
        q = conv_q.step(now.q);
        k = conv_k.step(now.k);
      }
      if (owns_v) v = conv_v.step(now.v);
      // q and k l2-normalised (x / sqrt(sum x^2 + 1e-6), as transformers' l2norm), q scaled.
      const float2 squares = block_sum2(q * q, k * k, red);
      if (owns_qk) {
        qs[tid] = q * (1.0f / sqrtf(squares.x + 1e-6f) * inv_sqrt_kd);
        ks[tid] = k * (1.0f / sqrtf(squares.y + 1e-6f));
      }
      __syncthreads();
      const float beta = sigmoid(now.b);
      const float decay = expf(-A * softplus(now.a + dt_bias));
      float o = 0.0f;
      if (owns_v) {
        // Column tid of the state: decay, read with k, the delta, update, read with q; i in
        // order (the CPU's sums).
        float read_k = 0.0f;
        if constexpr (KD > 0) {
          // (The empty asm every kFence rows keeps the compiler from loading all of q and k
          // into registers up front: with the column that spilled.)
#pragma unroll
          for (int i = 0; i < KD; ++i) {
            if (i % kFence == 0) asm volatile("" ::: "memory");
            column[i] = column[i] * decay;
            read_k += column[i] * ks[i];
          }
          const float delta = (v - read_k) * beta;
#pragma unroll
          for (int i = 0; i < KD; ++i) {
            if (i % kFence == 0) asm volatile("" ::: "memory");
            column[i] = column[i] + ks[i] * delta;
            o += column[i] * qs[i];
          }
        } else {
          // Shared-memory loads in batches of kBatch that go out together (one at a time, each
          // waited for behind the previous store, they were most of the kernel's time).
          for (int i0 = 0; i0 < kd; i0 += kBatch) {
            float state[kBatch], key[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              state[u] = i0 + u < kd ? S[(i0 + u) * vd + tid] : 0.0f;
              key[u] = i0 + u < kd ? ks[i0 + u] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              if (i0 + u >= kd) break;
              const float value = state[u] * decay;
              S[(i0 + u) * vd + tid] = value;
              read_k += value * key[u];
            }
          }
          const float delta = (v - read_k) * beta;
          for (int i0 = 0; i0 < kd; i0 += kBatch) {
            float state[kBatch], key[kBatch], query[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              state[u] = i0 + u < kd ? S[(i0 + u) * vd + tid] : 0.0f;
              key[u] = i0 + u < kd ? ks[i0 + u] : 0.0f;
              query[u] = i0 + u < kd ? qs[i0 + u] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              if (i0 + u >= kd) break;
              const float value = state[u] + key[u] * delta;
              S[(i0 + u) * vd + tid] = value;
              o += value * query[u];
            }
          }
        }
      }
      // RMSNorm over the head's outputs, times the norm weight and silu(z).
      const float2 sum =
          block_sum2(o * o, 0.0f, red + 64);  // (also: every thread is past the loop above)
      if (owns_v) {
        const float scale = 1.0f / sqrtf(sum.x / static_cast<float>(vd) + p.eps);
        p.out[t * value_dim + int64_t{h} * vd + tid] = p.norm[tid] * (o * scale) * silu(now.z);
      }
      now = ahead;
    }
  }
  if (!started) return;  // no tokens, or padding: the states stay as they are (the CPU's too)

  float* conv_write = p.conv_state + int64_t{write} * conv_dim * HISTORY;
  if (owns_qk && h % group == 0) {  // the key head's q and k channels: one writer
    conv_q.store(conv_write + q_channel * HISTORY);
    conv_k.store(conv_write + k_channel * HISTORY);
  }
  if (owns_v) conv_v.store(conv_write + v_channel * HISTORY);
  float* recurrent_write = p.recurrent + (int64_t{write} * p.value_heads + h) * state_values;
  if constexpr (KD > 0) {
    if (owns_v)
#pragma unroll
      for (int i = 0; i < KD; ++i) recurrent_write[i * vd + tid] = column[i];
  } else {
    __syncthreads();  // every column's last update
    for (int64_t i = tid; i < state_values; i += blockDim.x) recurrent_write[i] = S[i];
  }
}

// ---- The chunked form, for prefill (steps with dc::kTokens or more tokens of a sequence) ----
// Two kernels. delta_conv_kernel: the conv1d + SiLU of every channel (a thread per (sequence,
// channel) walks the sequence's tokens, dc::conv_walk) into the conv scratch, and the conv states.
// delta_net_chunk_kernel: one block per (sequence, value head) takes its tokens dc::kTokens at a
// time through the phases of delta_chunk.cuh (which states the equations; DeltaChunkPhases runs
// the same phases on the CPU), a barrier between phases: the chunk's conv outputs loaded,
// l2-normalised q and k, the gated delta rule of the whole chunk as small matmuls on the CUDA
// cores in f32, the output norm and gate. Heads of dc::kDim (Qwen3.5's 128) only. The sums run
// in another order than the recurrence's: equal within the op harness's tolerance, not bitwise.
// (The conv was the chunk kernel's first phase, 30% of a chunk on an H100 at c2f818a: a block
// per (sequence, head) runs one block an SM, so its loads and SiLUs were latency. As a kernel of
// its own it runs at full occupancy, and a key head's q and k are convolved once, not once for
// each of its value heads.)
namespace dc = delta_chunk;

constexpr int kConvThreads = 128;  // delta_conv_kernel: channels a block

// Phase 0. Block (sequence s, channels [kConvThreads y, +kConvThreads)). Floor: qkv read and the
// conv outputs written once, 2 x tokens x conv_dim x 4 bytes (H100, 8f3a420: 2.29 TB/s, 76% of
// the copy rate, at 8 x 1,024 tokens of Qwen3.5).
template <int HISTORY>
__global__ void __launch_bounds__(kConvThreads) delta_conv_kernel(DeltaNetParams p) {
  __shared__ int counts[32];
  __shared__ int32_t list[kConvThreads * kScanPerThread];
  const int s = blockIdx.x;
  const int64_t conv_dim = p.conv_dim();
  const int64_t col = int64_t{blockIdx.y} * kConvThreads + threadIdx.x;
  const int read = p.state_read[s];
  if (read < 0) return;  // a padding sequence (uniform): states untouched
  ConvChannel<HISTORY> conv;
  bool started = false;
  const int pass = kConvThreads * kScanPerThread;
  for (int64_t base = 0; base < p.tokens; base += pass) {
    const int count = gather_tokens(p.token_seq, p.tokens, s, base, list, counts);  // (uniform)
    if (count == 0) continue;
    if (!started && col < conv_dim)
      conv.load(p.conv_w, p.conv_state + (int64_t{read} * conv_dim + col) * HISTORY, col,
                p.positions[list[0]] == 0);
    started = true;
    if (col < conv_dim) dc::conv_walk<HISTORY>(p.qkv, conv_dim, col, list, count, conv, p.conv_out);
    __syncthreads();  // (the next pass overwrites the list)
  }
  if (started && col < conv_dim)
    conv.store(p.conv_state + (int64_t{p.state_write[s]} * conv_dim + col) * HISTORY);
}

// Float offsets in the chunked kernel's shared memory; then 32 warp counts and a pass's token
// list.
struct ChunkLayout {
  static constexpr int q = 0;
  static constexpr int k = q + dc::kTokens * dc::kRow;
  static constexpr int v = k + dc::kTokens * dc::kRow;
  static constexpr int u = v + dc::kTokens * dc::kRow;
  static constexpr int state = u + dc::kTokens * dc::kRow;
  static constexpr int a = state + dc::kDim * dc::kRow;
  static constexpr int t = a + dc::kTokens * dc::kSquare;
  static constexpr int pm = t + dc::kTokens * dc::kSquare;
  static constexpr int b = pm + dc::kTokens * dc::kSquare;
  static constexpr int beta = b + dc::kTokens;
  static constexpr int partial = beta + dc::kTokens;
  static constexpr int grow = partial + dc::kTokens * 2 * dc::kParts;
  static constexpr int counts = grow + dc::kTokens;
  static_assert(k % 4 == 0 && state % 4 == 0 && a % 4 == 0 && t % 4 == 0 && pm % 4 == 0,
                "16-byte aligned arrays (4-float loads)");
};
constexpr int kDeltaPhases = 9;
constexpr size_t kChunkSmem =
    (ChunkLayout::counts + 32 + dc::kThreads * kScanPerThread) * sizeof(float);

// Phases 4 to 7 of a chunk (delta_chunk.cuh), on CUDA cores or tensor cores; done(phase) after
// each (the barrier).
template <bool kTensorCores, class Done>
__device__ __forceinline__ void chunk_math(const dc::View& view, int n, int tid, Done& done) {
  float out[dc::kTile][dc::kTile];
  kTensorCores ? dc::a_and_pm_tc(view, n, tid) : dc::a_and_pm(view, n, tid);
  done(3);
  dc::t_matrix(view, tid);
  kTensorCores ? dc::r_and_qs_tc(view, n, tid, out) : dc::r_and_qs(view, n, tid, out);
  done(4);
  kTensorCores ? dc::u_of_tc(view, n, tid) : dc::u_of(view, n, tid);
  done(5);
  kTensorCores ? dc::outputs_and_state_tc(view, n, tid, out)
               : dc::outputs_and_state(view, n, tid, out);
  done(6);
}

__global__ void __launch_bounds__(dc::kThreads, 1) delta_net_chunk_kernel(DeltaNetParams p) {
  extern __shared__ __align__(16) float smem[];
  constexpr int kd = dc::kDim, vd = dc::kDim, R = dc::kRow;
  const dc::View view{
      smem + ChunkLayout::q,    smem + ChunkLayout::k,       smem + ChunkLayout::v,
      smem + ChunkLayout::u,    smem + ChunkLayout::state,   smem + ChunkLayout::a,
      smem + ChunkLayout::t,    smem + ChunkLayout::pm,      smem + ChunkLayout::b,
      smem + ChunkLayout::beta, smem + ChunkLayout::partial, smem + ChunkLayout::grow};
  float* S = view.state;
  int* counts = reinterpret_cast<int*>(smem + ChunkLayout::counts);
  int32_t* list = reinterpret_cast<int32_t*>(counts + 32);
  const int s = blockIdx.x / p.value_heads, h = blockIdx.x % p.value_heads;
  const int group = p.value_heads / p.key_heads;
  const int tid = threadIdx.x;
  const int read = p.state_read[s], write = p.state_write[s];
  dc::Inputs in;
  in.conv = p.conv_out;
  in.z = p.z;
  in.b = p.b;
  in.a = p.a;
  in.norm = p.norm;
  in.tok = list;
  in.key_dim = int64_t{p.key_heads} * kd;
  in.conv_dim = p.conv_dim();
  in.value_dim = int64_t{p.value_heads} * vd;
  in.key_head = h / group;
  in.head = h;
  in.value_heads = p.value_heads;
  in.A = expf(p.a_log[h]);
  in.dt_bias = p.dt_bias[h];
  in.eps = p.eps;

  // SY_DELTA_STAMPS: thread 0's cycles from barrier to barrier, per phase.
  const bool stamping = p.phase_cycles != nullptr && tid == 0;
  unsigned long long cycles[kDeltaPhases] = {}, chunks = 0;
  long long last = 0;
  const auto phase_done = [&](int phase) {
    __syncthreads();
    if (stamping) {
      const long long now = clock64();
      cycles[phase] += static_cast<unsigned long long>(now - last);
      last = now;
    }
  };

  bool started = false;
  const int pass = dc::kThreads * kScanPerThread;
  for (int64_t base = 0; base < p.tokens; base += pass) {
    const int count = gather_tokens(p.token_seq, p.tokens, s, base, list, counts);  // (uniform)
    if (count == 0) continue;
    if (read < 0) {  // a padding sequence: zero outputs, states untouched
      for (int i = tid; i < count * vd; i += dc::kThreads)
        p.out[int64_t{list[i / vd]} * in.value_dim + int64_t{h} * vd + i % vd] = 0.0f;
      continue;
    }
    if (!started) {
      started = true;
      const bool fresh = p.positions[list[0]] == 0;
      const float* recurrent_read = p.recurrent + (int64_t{read} * p.value_heads + h) * kd * vd;
      for (int i = tid; i < kd * vd; i += dc::kThreads)
        S[(i / vd) * R + i % vd] = fresh ? 0.0f : recurrent_read[i];
      __syncthreads();
    }
    for (int c0 = 0; c0 < count; c0 += dc::kTokens) {
      const int n = min(dc::kTokens, count - c0);
      in.tok = list + c0;
      // The phases of delta_chunk.cuh, a barrier between them (each timed when stamping).
      if (stamping) last = clock64();
      dc::load_chunk(in, n, tid, view);
      phase_done(0);
      dc::norm_partials(view, n, tid);
      phase_done(1);
      dc::normalize(view, n, tid);
      phase_done(2);
      if (p.tensor_cores)  // (uniform)
        chunk_math<true>(view, n, tid, phase_done);
      else
        chunk_math<false>(view, n, tid, phase_done);
      dc::output_partials(view, n, tid);
      phase_done(7);
      dc::write_outputs(in, view, n, tid, p.out);
      phase_done(8);  // (the next chunk overwrites the chunk's arrays and the token list's use)
      ++chunks;
    }
  }
  if (stamping) {
    for (int ph = 0; ph < kDeltaPhases; ++ph) atomicAdd(p.phase_cycles + ph, cycles[ph]);
    atomicAdd(p.phase_cycles + kDeltaPhases, chunks);
  }
  if (!started) return;  // no tokens, or padding
  float* recurrent_write = p.recurrent + (int64_t{write} * p.value_heads + h) * kd * vd;
  for (int i = tid; i < kd * vd; i += dc::kThreads) recurrent_write[i] = S[(i / vd) * R + i % vd];
}

// Steps with a sequence of dc::kTokens or more query tokens take the chunked kernel, where the
// heads are dc::kDim wide (H100, c2f818a: Qwen3.5 prefill of 1 x 1,024 tokens 123.7 -> 81.5 ms,
// 8 x 1,024 280.1 -> 260.2 ms; BENCHMARKS.md). SY_DELTA_CHUNKED=0: the recurrent kernel for all.
bool use_chunked(const DeltaNetParams& p) {
  static const bool enabled = !env_off("SY_DELTA_CHUNKED");
  return enabled && p.conv_out && p.key_head_dim == dc::kDim && p.value_head_dim == dc::kDim &&
         p.max_query_len >= dc::kTokens && aligned16(p.conv_out) && aligned16(p.z) &&
         aligned16(p.norm) && aligned16(p.out);  // (4-float loads and stores)
}

// SY_DELTA_STAMPS=1 (experiments): the chunked kernel's phase cycles over every launch outside
// graph capture, printed at exit as cycles and microseconds a chunk (one block's thread 0, from
// barrier to barrier: the phase's slowest thread plus the barrier).
class DeltaStamps {
 public:
  static DeltaStamps* get() {
    static DeltaStamps* instance = env_flag("SY_DELTA_STAMPS") ? new DeltaStamps() : nullptr;
    return instance;
  }
  unsigned long long* begin(cudaStream_t stream) {  // nullptr while capturing
    if (stream_capturing(stream)) return nullptr;
    if (!buffer_ &&
        cudaMalloc(&buffer_, sizeof(unsigned long long) * (kDeltaPhases + 1)) != cudaSuccess)
      return buffer_ = nullptr;
    SY_CUDA_CHECK(
        cudaMemsetAsync(buffer_, 0, sizeof(unsigned long long) * (kDeltaPhases + 1), stream));
    return buffer_;
  }
  void end(cudaStream_t stream) {
    unsigned long long host[kDeltaPhases + 1];
    SY_CUDA_CHECK(cudaMemcpyAsync(host, buffer_, sizeof(host), cudaMemcpyDeviceToHost, stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int ph = 0; ph <= kDeltaPhases; ++ph) total_[ph] += static_cast<double>(host[ph]);
    ++launches_;
  }

 private:
  DeltaStamps() {
    int device = 0, khz = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
    khz_ = khz;
    std::atexit([] {
      DeltaStamps* s = get();
      if (!s || s->total_[kDeltaPhases] == 0) return;
      const double chunks = s->total_[kDeltaPhases];
      std::fprintf(
          stderr,
          "chunked DeltaNet phase cycles over %d launches, %.0f block-chunks (a chunk's mean; "
          "us at the %.0f MHz clock rate):\n",
          s->launches_, chunks, s->khz_ / 1e3);
      const char* names[kDeltaPhases] = {"load+gates", "norm partials", "normalize",
                                         "A, pm",      "T | R, qS",     "U = T R",
                                         "o, state",   "o partials",    "write"};
      double sum = 0;
      for (int ph = 0; ph < kDeltaPhases; ++ph) sum += s->total_[ph];
      for (int ph = 0; ph < kDeltaPhases; ++ph)
        std::fprintf(stderr, "  %-14s %9.0f cycles %7.2f us %5.1f%%\n", names[ph],
                     s->total_[ph] / chunks, s->total_[ph] / chunks / s->khz_ * 1e3,
                     100.0 * s->total_[ph] / sum);
      std::fprintf(stderr, "  %-14s %9.0f cycles %7.2f us\n", "chunk", sum / chunks,
                   sum / chunks / s->khz_ * 1e3);
    });
  }
  unsigned long long* buffer_ = nullptr;
  double total_[kDeltaPhases + 1] = {};
  double khz_ = 1;
  int launches_ = 0;
};

template <int HISTORY>
void launch_history(const DeltaNetParams& p, cudaStream_t stream) {
  if (use_chunked(p)) {
    const unsigned blocks = static_cast<unsigned>(p.seqs) * static_cast<unsigned>(p.value_heads);
    static const bool tensor_cores = env_flag("SY_DELTA_TC");
    DeltaNetParams stamped = p;
    stamped.tensor_cores = tensor_cores;
    DeltaStamps* stamps = DeltaStamps::get();
    if (stamps) stamped.phase_cycles = stamps->begin(stream);
    const unsigned channel_blocks =
        static_cast<unsigned>((p.conv_dim() + kConvThreads - 1) / kConvThreads);
    delta_conv_kernel<HISTORY>
        <<<dim3(static_cast<unsigned>(p.seqs), channel_blocks), kConvThreads, 0, stream>>>(p);
    SY_CUDA_LAUNCH_CHECK("delta_conv_kernel");
    delta_net_chunk_kernel<<<blocks, dc::kThreads, kChunkSmem, stream>>>(stamped);
    SY_CUDA_LAUNCH_CHECK("delta_net_chunk_kernel");
    if (stamped.phase_cycles) stamps->end(stream);
    return;
  }
  const bool registers = p.key_head_dim == kRegisterKeyDim;
  const size_t smem = delta_net_smem(p.key_head_dim, p.value_head_dim, registers);
  const int widest = p.key_head_dim > p.value_head_dim ? p.key_head_dim : p.value_head_dim;
  const unsigned threads = static_cast<unsigned>((widest + 31) / 32 * 32);
  const unsigned blocks = static_cast<unsigned>(p.seqs) * static_cast<unsigned>(p.value_heads);
  if (registers)
    delta_net_kernel<HISTORY, kRegisterKeyDim><<<blocks, threads, smem, stream>>>(p);
  else
    delta_net_kernel<HISTORY, 0><<<blocks, threads, smem, stream>>>(p);
  SY_CUDA_LAUNCH_CHECK("delta_net_kernel");
}

__global__ void split_query_kernel(const float* q_gate, int64_t rows, int64_t head_dim, float* q) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * head_dim) return;
  const int64_t r = i / head_dim, d = i % head_dim;
  q[i] = q_gate[r * 2 * head_dim + d];
}

__global__ void sigmoid_gate_kernel(const float* q_gate, int64_t rows, int64_t head_dim,
                                    float* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * head_dim) return;
  const int64_t r = i / head_dim, d = i % head_dim;
  out[i] *= sigmoid(q_gate[r * 2 * head_dim + head_dim + d]);
}

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>((count + 255) / 256);
}

}  // namespace

template <int HISTORY>
void allow_smem(int bytes) {
  SY_CUDA_CHECK(cudaFuncSetAttribute(delta_net_kernel<HISTORY, 0>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  SY_CUDA_CHECK(cudaFuncSetAttribute(delta_net_kernel<HISTORY, kRegisterKeyDim>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

void prepare_gated_delta_net(int device) {
  int bytes = 0;
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  allow_smem<0>(bytes);
  allow_smem<1>(bytes);
  allow_smem<2>(bytes);
  allow_smem<3>(bytes);
  allow_smem<4>(bytes);
  allow_smem<5>(bytes);
  allow_smem<6>(bytes);
  allow_smem<7>(bytes);
  SY_CUDA_CHECK(cudaFuncSetAttribute(delta_net_chunk_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kChunkSmem)));
}

bool delta_net_supported(int key_head_dim, int value_head_dim, int kernel) {
  return key_head_dim > 0 && value_head_dim > 0 && key_head_dim <= 1024 && value_head_dim <= 1024 &&
         kernel >= 1 && kernel <= kMaxKernel &&
         delta_net_smem(key_head_dim, value_head_dim, false) <= 227 * 1024;
}

void launch_gated_delta_net(const DeltaNetParams& p, cudaStream_t stream) {
  if (p.seqs == 0 || p.tokens == 0) return;
  if (!delta_net_supported(p.key_head_dim, p.value_head_dim, p.kernel) || p.key_heads <= 0 ||
      p.value_heads % p.key_heads != 0)
    cuda_fail("gated_delta_net", "unsupported shape (see delta_net_supported)", __FILE__, __LINE__);
  switch (p.kernel - 1) {
    case 0:
      return launch_history<0>(p, stream);
    case 1:
      return launch_history<1>(p, stream);
    case 2:
      return launch_history<2>(p, stream);
    case 3:
      return launch_history<3>(p, stream);
    case 4:
      return launch_history<4>(p, stream);
    case 5:
      return launch_history<5>(p, stream);
    case 6:
      return launch_history<6>(p, stream);
    default:
      return launch_history<7>(p, stream);
  }
}

void launch_split_query(const float* q_gate, int64_t rows, int64_t head_dim, float* q,
                        cudaStream_t stream) {
  if (rows * head_dim == 0) return;
  split_query_kernel<<<blocks_for(rows * head_dim), 256, 0, stream>>>(q_gate, rows, head_dim, q);
  SY_CUDA_LAUNCH_CHECK("split_query_kernel");
}

void launch_sigmoid_gate(const float* q_gate, int64_t rows, int64_t head_dim, float* out,
                         cudaStream_t stream) {
  if (rows * head_dim == 0) return;
  sigmoid_gate_kernel<<<blocks_for(rows * head_dim), 256, 0, stream>>>(q_gate, rows, head_dim, out);
  SY_CUDA_LAUNCH_CHECK("sigmoid_gate_kernel");
}

}  // namespace sy::backend::cuda
