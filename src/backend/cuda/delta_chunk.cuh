// The in-chunk math of the chunked gated delta rule (delta_net_chunk_kernel's steps 3 to 7) as
// functions of one thread, callable on the host too. The kernel runs each phase on its kThreads
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
constexpr int kThreads = 256;
constexpr int kRow = kDim + 4;        // padded rows of q, k, v, u and the state
constexpr int kSquare = kTokens + 1;  // padded rows of the chunk x chunk matrices
// Thread tid has column tid % kDim of the (token, column) outputs, kRowsPerThread rows of them,
// and kStateRows rows of the state's column.
constexpr int kRowsPerThread = kTokens * kDim / kThreads;
constexpr int kStateRows = kDim * kDim / kThreads;
static_assert(kThreads % kDim == 0 && kThreads >= kTokens, "thread layout");

struct View {
  float* q;      // [kTokens][kRow]; after outputs_and_state, the outputs o
  float* k;      // [kTokens][kRow]
  float* v;      // [kTokens][kRow]; after r_and_qs, R
  float* u;      // [kTokens][kRow]
  float* state;  // [kDim][kRow]
  float* a;      // [kTokens][kSquare]
  float* t;      // [kTokens][kSquare]
  float* pm;     // [kTokens][kSquare]: e^(b_i - b_j) q_i.k_j for j <= i, else 0
  float* b;      // [kTokens]
  float* beta;   // [kTokens]
};

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

// Phase 4, row i (rows 0 .. n-1 in order, a barrier after each): T = (I + A)^-1, lower triangular
// with a unit diagonal, T_ic = [i == c] - sum_{c <= j < i} A_ij T_jc. Thread c < n writes T_ic.
SY_HOST_DEVICE inline void t_row(const View& s, int n, int i, int tid) {
  if (tid >= n) return;
  float x = 0.0f;
  if (tid <= i) {
    x = tid == i ? 1.0f : 0.0f;
    for (int j = tid; j < i; ++j) x -= s.a[i * kSquare + j] * s.t[j * kSquare + tid];
  }
  s.t[i * kSquare + tid] = x;
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

}  // namespace sy::backend::cuda::delta_chunk
