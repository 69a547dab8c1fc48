// The phases of one chunk of the chunked gated delta rule (delta_net_chunk_kernel) as functions of
// one thread, callable on the host too. The kernel runs each phase on its kThreads
// threads with a barrier between phases; within a phase no thread reads what another writes, so
// tests/backend/delta_chunk_phases_test.cpp can run the same functions for tid = 0, 1, ... in
// turn, phase by phase, on the CPU, and check them against the recurrence.
//
// A chunk of n <= kTokens tokens, in shared memory (rows padded to kRow / kSquare floats): q and
// k l2-normalised (q scaled), v, b the running sum of log(decay), beta, S0 the state
// [key dim][value dim]. With them (tests/backend/delta_rule_chunked_test.cpp derives and checks
// these in double):
//   A_ij = beta_i e^(b_i - b_j) k_i.k_j (j < i),  T = (I + A)^-1,  R_i = beta_i (v_i - e^(b_i) S0^T
//   k_i), U = T R,  o_i = e^(b_i) S0^T q_i + sum_{j <= i} e^(b_i - b_j) q_i.k_j U_j, S = e^(b_last)
//   S0 + sum_j e^(b_last - b_j) k_j U_j^T.
// Rows of q, k, v, u at or past n are never read as data (they may hold anything).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SY_HOST_DEVICE __host__ __device__
#else
#define SY_HOST_DEVICE
#endif
#ifdef __CUDA_ARCH__
#define SY_UNROLL _Pragma("unroll")  // (device code only: host compilers warn on it)
#else
#define SY_UNROLL
#endif

namespace sy::backend::cuda::delta_chunk {

constexpr int kTokens = 32;  // tokens a chunk
constexpr int kDim = 128;    // key and value head width
// (SY_DELTA_CHUNK_THREADS: a build-time experiment, 256 or 512.)
#ifndef SY_DELTA_CHUNK_THREADS
#define SY_DELTA_CHUNK_THREADS 256
#endif
constexpr int kThreads = SY_DELTA_CHUNK_THREADS;
// Rows of q, k, v, u and the state padded by one float: a warp reading one column of 32 rows
// (a_and_pm's k_j, normalize's and output_scales' per-token loops) hits 32 banks.
constexpr int kRow = kDim + 1;
constexpr int kSquare = kTokens + 1;  // padded rows of the chunk x chunk matrices
// Thread tid has column tid % kDim of the (token, column) outputs, kRowsPerThread rows of them,
// and kStateRows rows of the state's column.
constexpr int kRowsPerThread = kTokens * kDim / kThreads;
constexpr int kStateRows = kDim * kDim / kThreads;
static_assert(kThreads % kDim == 0 && kThreads >= kTokens, "thread layout");

constexpr int kChannels = 3 * kDim;  // a head's conv channels: q and k of its key head, v
static_assert(2 * kThreads >= kChannels, "two history channels a thread");

struct View {
  float* q;      // [kTokens][kRow]; after outputs_and_state, the outputs o
  float* k;      // [kTokens][kRow]
  float* v;      // [kTokens][kRow]; after r_and_qs, R
  float* u;      // [kTokens][kRow]
  float* state;  // [kDim][kRow]
  float* a;      // [kTokens][kSquare]
  float* t;      // [kTokens][kSquare]
  float* pm;     // [kTokens][kSquare]: e^(b_i - b_j) q_i.k_j for j <= i, else 0
  float* b;      // [kTokens]: log(decay), then its running sum
  float* beta;   // [kTokens]
  float* scale;  // [kTokens]: the output norm's scale of each token
};

// What a block reads of the step for its (sequence, value head): the chunk's tokens (step
// indices) and the rows of the op's inputs (DeltaNetParams), conv weights as raw bf16 bits.
struct Inputs {
  const float* qkv;        // [tokens, conv_dim]
  const float* z;          // [tokens, value_heads * kDim]
  const float* b;          // [tokens, value_heads]
  const float* a;          // [tokens, value_heads]
  const uint16_t* conv_w;  // [conv_dim, history + 1], bf16
  const float* norm;       // [kDim]
  const int32_t* tok;      // the chunk's tokens
  int64_t key_dim, conv_dim, value_dim;
  int key_head, head, value_heads;
  float A, dt_bias, eps;
};

SY_HOST_DEVICE inline float silu(float x) {
  return x / (1.0f + expf(-x));
}
SY_HOST_DEVICE inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
SY_HOST_DEVICE inline float softplus(float x) {  // torch's threshold
  return x > 20.0f ? x : log1pf(expf(x));
}
SY_HOST_DEVICE inline float bf16_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(word);
#else
  float value;
  memcpy(&value, &word, sizeof(value));
  return value;
#endif
}
// The head's conv channel ch (q and k of its key head, then v of its value head) in qkv.
SY_HOST_DEVICE inline int64_t channel_of(const Inputs& in, int ch) {
  return ch < kDim       ? int64_t{in.key_head} * kDim + ch
         : ch < 2 * kDim ? in.key_dim + int64_t{in.key_head} * kDim + (ch - kDim)
                         : 2 * in.key_dim + int64_t{in.head} * kDim + (ch - 2 * kDim);
}
// Token t's raw input on channel ch, t < 0 reaching back into history ([HISTORY][kChannels],
// oldest first: the raw inputs of the tokens before the chunk).
template <int HISTORY>
SY_HOST_DEVICE inline float raw_input(const Inputs& in, const float* history, int t, int ch) {
  return t >= 0 ? in.qkv[int64_t{in.tok[t]} * in.conv_dim + channel_of(in, ch)]
                : history[(HISTORY + t) * kChannels + ch];
}

// Phase 1: conv1d + SiLU of every channel of the n tokens into q, k, v (ConvChannel's order:
// the oldest input first); beta and log(decay) of each token.
template <int HISTORY>
SY_HOST_DEVICE inline void conv_and_gates(const Inputs& in, const float* history, int n, int tid,
                                          const View& s) {
  for (int i = tid; i < n * kChannels; i += kThreads) {
    const int t = i / kChannels, ch = i % kChannels;
    const uint16_t* w = in.conv_w + channel_of(in, ch) * (HISTORY + 1);
    float acc = 0.0f;
    SY_UNROLL
    for (int m = 0; m < HISTORY; ++m)
      acc += bf16_to_float(w[m]) * raw_input<HISTORY>(in, history, t - HISTORY + m, ch);
    acc += bf16_to_float(w[HISTORY]) * raw_input<HISTORY>(in, history, t, ch);
    float* row = ch < kDim       ? s.q + t * kRow + ch
                 : ch < 2 * kDim ? s.k + t * kRow + ch - kDim
                                 : s.v + t * kRow + ch - 2 * kDim;
    *row = silu(acc);
  }
  if (tid < n) {
    const int64_t at = int64_t{in.tok[tid]} * in.value_heads + in.head;
    s.beta[tid] = sigmoid(in.b[at]);
    s.b[tid] = -in.A * softplus(in.a[at] + in.dt_bias);
  }
}

// Phase 1 too (reads history before the barrier): the raw inputs the next chunk looks back at,
// for this thread's channels tid and tid + kThreads. history_store writes them after it.
template <int HISTORY>
SY_HOST_DEVICE inline void history_next(const Inputs& in, const float* history, int n, int tid,
                                        float (&next)[HISTORY > 0 ? HISTORY : 1][2]) {
  SY_UNROLL
  for (int j = 0; j < 2; ++j) {
    const int ch = tid + j * kThreads;
    if (ch >= kChannels) continue;
    SY_UNROLL
    for (int m = 0; m < HISTORY; ++m)
      next[m][j] = raw_input<HISTORY>(in, history, n - HISTORY + m, ch);
  }
}
template <int HISTORY>
SY_HOST_DEVICE inline void history_store(float* history, int tid,
                                         const float (&next)[HISTORY > 0 ? HISTORY : 1][2]) {
  SY_UNROLL
  for (int j = 0; j < 2; ++j) {
    const int ch = tid + j * kThreads;
    if (ch >= kChannels) continue;
    SY_UNROLL
    for (int m = 0; m < HISTORY; ++m) history[m * kChannels + ch] = next[m][j];
  }
}

// Phase 2: thread t < n l2-normalises q and k of token t (x / sqrt(sum x^2 + 1e-6), as
// transformers' l2norm; q also by 1/sqrt(kDim)); thread 0 also sums b over the chunk.
SY_HOST_DEVICE inline void normalize(const View& s, int n, int tid) {
  if (tid >= n) return;
  float sq = 0.0f, sk = 0.0f;
  for (int c = 0; c < kDim; ++c) {
    sq += s.q[tid * kRow + c] * s.q[tid * kRow + c];
    sk += s.k[tid * kRow + c] * s.k[tid * kRow + c];
  }
  const float q_scale = 1.0f / sqrtf(sq + 1e-6f) * (1.0f / sqrtf(static_cast<float>(kDim)));
  const float k_scale = 1.0f / sqrtf(sk + 1e-6f);
  for (int c = 0; c < kDim; ++c) {
    s.q[tid * kRow + c] *= q_scale;
    s.k[tid * kRow + c] *= k_scale;
  }
  if (tid == 0)
    for (int t = 1; t < n; ++t) s.b[t] += s.b[t - 1];
}

// Phase 3: A and pm, every entry of the kTokens x kTokens (zeros outside their triangles).
SY_HOST_DEVICE inline void a_and_pm(const View& s, int n, int tid) {
  for (int e = tid; e < kTokens * kTokens; e += kThreads) {
    const int i = e / kTokens, j = e % kTokens;
    float kk = 0.0f, qk = 0.0f;
    if (i < n && j <= i)
      for (int r = 0; r < kDim; ++r) {
        const float kj = s.k[j * kRow + r];
        kk += s.k[i * kRow + r] * kj;
        qk += s.q[i * kRow + r] * kj;
      }
    const float decay = i < n && j <= i ? expf(s.b[i] - s.b[j]) : 0.0f;
    s.a[i * kSquare + j] = j < i ? s.beta[i] * decay * kk : 0.0f;
    s.pm[i * kSquare + j] = decay * qk;
  }
}

// Phase 4 (beside phase 5: it reads only A and writes only T): T = (I + A)^-1, lower triangular
// with a unit diagonal, T_ic = [i == c] - sum_{c <= j < i} A_ij T_jc, by forward substitution.
// Thread c < kTokens (one warp) keeps column c in registers and writes it; no barriers. Terms
// with j < c are A_ij * 0 (A is finite), so the sum is the one from j = c on.
SY_HOST_DEVICE inline void t_matrix(const View& s, int tid) {
  if (tid >= kTokens) return;
  const int c = tid;
  float column[kTokens];
  SY_UNROLL
  for (int i = 0; i < kTokens; ++i) {
    float x = i == c ? 1.0f : 0.0f;
    SY_UNROLL
    for (int j = 0; j < i; ++j) x -= s.a[i * kSquare + j] * column[j];
    column[i] = x;
    s.t[i * kSquare + c] = x;
  }
}

// Phase 5: R = beta (v - e^b k S0) in place of v; out = e^b q S0 (kept by the thread for phase 7).
SY_HOST_DEVICE inline void r_and_qs(const View& s, int n, int tid, float (&out)[kRowsPerThread]) {
  const int col = tid % kDim, row0 = (tid / kDim) * kRowsPerThread;
  float k_s[kRowsPerThread];
  SY_UNROLL
  for (int m = 0; m < kRowsPerThread; ++m) k_s[m] = out[m] = 0.0f;
  for (int r = 0; r < kDim; ++r) {
    const float sv = s.state[r * kRow + col];
    SY_UNROLL
    for (int m = 0; m < kRowsPerThread; ++m) {
      k_s[m] += s.k[(row0 + m) * kRow + r] * sv;
      out[m] += s.q[(row0 + m) * kRow + r] * sv;
    }
  }
  SY_UNROLL
  for (int m = 0; m < kRowsPerThread; ++m) {
    const int i = row0 + m;
    if (i >= n) continue;
    const float grow = expf(s.b[i]);
    s.v[i * kRow + col] = s.beta[i] * (s.v[i * kRow + col] - grow * k_s[m]);
    out[m] *= grow;
  }
}

// Phase 6: U = T R.
SY_HOST_DEVICE inline void u_of(const View& s, int n, int tid) {
  const int col = tid % kDim, row0 = (tid / kDim) * kRowsPerThread;
  SY_UNROLL
  for (int m = 0; m < kRowsPerThread; ++m) {
    const int i = row0 + m;
    if (i >= n) continue;
    float x = 0.0f;
    for (int j = 0; j <= i; ++j) x += s.t[i * kSquare + j] * s.v[j * kRow + col];
    s.u[i * kRow + col] = x;
  }
}

// Phase 7: o = out + pm U into q; the state carried to the next chunk, in place.
SY_HOST_DEVICE inline void outputs_and_state(const View& s, int n, int tid,
                                             float (&out)[kRowsPerThread]) {
  const int col = tid % kDim, row0 = (tid / kDim) * kRowsPerThread;
  SY_UNROLL
  for (int m = 0; m < kRowsPerThread; ++m) {
    const int i = row0 + m;
    if (i >= n) continue;
    for (int j = 0; j <= i; ++j) out[m] += s.pm[i * kSquare + j] * s.u[j * kRow + col];
    s.q[i * kRow + col] = out[m];
  }
  const float b_last = s.b[n - 1];
  float carried[kTokens];  // e^(b_last - b_j) U_j, this column
  SY_UNROLL
  for (int j = 0; j < kTokens; ++j)
    carried[j] = j < n ? expf(b_last - s.b[j]) * s.u[j * kRow + col] : 0.0f;
  const float keep = expf(b_last);
  const int state_row0 = (tid / kDim) * kStateRows;
  for (int rr = 0; rr < kStateRows; ++rr) {
    const int r = state_row0 + rr;
    float x = keep * s.state[r * kRow + col];
    SY_UNROLL
    for (int j = 0; j < kTokens; ++j)
      if (j < n) x += s.k[j * kRow + r] * carried[j];
    s.state[r * kRow + col] = x;
  }
}

// Phase 8: thread t < n finds token t's output norm scale (RMSNorm over the head's outputs).
SY_HOST_DEVICE inline void output_scales(const Inputs& in, const View& s, int n, int tid) {
  if (tid >= n) return;
  float sum = 0.0f;
  for (int c = 0; c < kDim; ++c) sum += s.q[tid * kRow + c] * s.q[tid * kRow + c];
  s.scale[tid] = 1.0f / sqrtf(sum / static_cast<float>(kDim) + in.eps);
}
// Phase 9: the outputs, normed, times the norm weight and silu(z).
SY_HOST_DEVICE inline void write_outputs(const Inputs& in, const View& s, int n, int tid,
                                         float* out) {
  for (int i = tid; i < n * kDim; i += kThreads) {
    const int t = i / kDim, c = i % kDim;
    const int64_t at = int64_t{in.tok[t]} * in.value_dim + int64_t{in.head} * kDim + c;
    out[at] = in.norm[c] * (s.q[t * kRow + c] * s.scale[t]) * silu(in.z[at]);
  }
}

}  // namespace sy::backend::cuda::delta_chunk
