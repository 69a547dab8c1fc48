// The phases of one chunk of the chunked gated delta rule (delta_net_chunk_kernel) as functions of
// one thread, callable on the host too. The kernel runs each phase on its kThreads
// threads with a barrier between phases; within a phase no thread reads what another writes, so
// tests/backend/delta_chunk_phases_test.cpp can run the same functions one thread after another
// (ascending, and again descending), phase by phase, on the CPU, and check them against the
// recurrence. Threads own register tiles of the outputs and the state (kTile, kStateRows).
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
#include "backend/cuda/mma_ptx.cuh"
#endif

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
constexpr int kWarps = kThreads / 32;
// Rows of q, k, v, u and the state padded by 4 floats: 16-byte aligned for 4-wide loads, and 8
// lanes loading 4 floats each of 8 consecutive rows hit 32 different banks.
constexpr int kRow = kDim + 4;
constexpr int kSquare = kTokens + 4;  // padded rows of the chunk x chunk matrices
// Register tiles. The (token, column) outputs [kTokens][kDim]: thread tid has rows
// 4 (tid / 32) .. + 3 and columns 4 (tid % 32) .. + 3 (a warp shares its rows). The state
// [kDim][kDim]: rows kStateRows (tid / 32) .. and the same 4 columns.
constexpr int kTile = 4;
constexpr int kStateRows = kDim / kWarps;
static_assert(kTokens == kTile * kWarps && kDim == kTile * 32, "output tile layout");
// Per-token sums over a row (the l2 norms, the output norm): kParts threads a token, their
// partial sums in View::partial.
constexpr int kParts = kThreads / kTokens;
static_assert(kDim % (4 * kParts) == 0, "4-column groups a part");

constexpr int kChannels = 3 * kDim;  // a head's conv channels: q and k of its key head, v

struct View {
  float* q;        // [kTokens][kRow]; after outputs_and_state, the outputs o
  float* k;        // [kTokens][kRow]
  float* v;        // [kTokens][kRow]; after r_and_qs, R
  float* u;        // [kTokens][kRow]
  float* state;    // [kDim][kRow]
  float* a;        // [kTokens][kSquare]
  float* t;        // [kTokens][kSquare]
  float* pm;       // [kTokens][kSquare]: e^(b_i - b_j) q_i.k_j for j <= i, else 0
  float* b;        // [kTokens]: log(decay), then its running sum
  float* beta;     // [kTokens]
  float* partial;  // [kTokens][2 kParts]: partial sums of squares (q then k; later o)
  float* grow;     // [kTokens]: e^(b_last - b_j) for j < n, else 0 (tensor-core phases)
};

// What a block reads of the step for its (sequence, value head): the chunk's tokens (step
// indices) and the rows of the op's inputs (DeltaNetParams) and of phase 0's conv outputs.
struct Inputs {
  const float* conv;       // [tokens, conv_dim]: conv1d + SiLU of qkv (conv_walk)
  const float* z;          // [tokens, value_heads * kDim]
  const float* b;          // [tokens, value_heads]
  const float* a;          // [tokens, value_heads]
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
// Four consecutive floats (16-byte aligned on the device).
struct Vec4 {
  float x, y, z, w;
  SY_HOST_DEVICE float operator[](int i) const { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
};
SY_HOST_DEVICE inline Vec4 load4(const float* p) {
#ifdef __CUDA_ARCH__
  const float4 v = *reinterpret_cast<const float4*>(p);
  return {v.x, v.y, v.z, v.w};
#else
  return {p[0], p[1], p[2], p[3]};
#endif
}
SY_HOST_DEVICE inline void store4(float* p, const float (&v)[4]) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
#else
  for (int i = 0; i < 4; ++i) p[i] = v[i];
#endif
}
// One channel's causal conv1d + SiLU over its last HISTORY raw inputs and the new one: the sum
// oldest input first (the CPU's order), then the window slides by one. Both DeltaNet kernels
// step their channels through it.
template <int HISTORY>
struct ConvWindow {
  float w[HISTORY + 1];
  float window[HISTORY > 0 ? HISTORY : 1];  // the last HISTORY raw inputs, oldest first
  SY_HOST_DEVICE void load_weights(const uint16_t* conv_w, int64_t channel) {
    for (int m = 0; m <= HISTORY; ++m) w[m] = bf16_to_float(conv_w[channel * (HISTORY + 1) + m]);
  }
  SY_HOST_DEVICE float step(float x) {
    float acc = 0.0f;
    for (int m = 0; m < HISTORY; ++m) acc += w[m] * window[m];
    acc += w[HISTORY] * x;
    for (int m = 0; m + 1 < HISTORY; ++m) window[m] = window[m + 1];
    if (HISTORY > 0) window[HISTORY - 1] = x;
    return silu(acc);
  }
};

// The head's conv channel ch (q and k of its key head, then v of its value head) in qkv.
SY_HOST_DEVICE inline int64_t channel_of(const Inputs& in, int ch) {
  return ch < kDim       ? int64_t{in.key_head} * kDim + ch
         : ch < 2 * kDim ? in.key_dim + int64_t{in.key_head} * kDim + (ch - kDim)
                         : 2 * in.key_dim + int64_t{in.head} * kDim + (ch - 2 * kDim);
}

// Phase 0, a kernel of its own before the chunks (delta_conv_kernel): channel col of qkv's
// conv_dim over one sequence's tokens tok[0, count) (step order), conv1d + SiLU into conv_out
// ([tokens, conv_dim]), the window carried in `conv` from the sequence's conv state on. A chunk's
// raw inputs are loaded at once (one batch of loads in flight, not one a token). One thread owns
// a channel for the whole sequence, so the conv state has one writer and the value heads of a key
// head share its q and k.
template <int HISTORY>
SY_HOST_DEVICE inline void conv_walk(const float* qkv, int64_t conv_dim, int64_t col,
                                     const int32_t* tok, int count, ConvWindow<HISTORY>& conv,
                                     float* conv_out) {
  for (int t0 = 0; t0 < count; t0 += kTokens) {
    const int n = count - t0 < kTokens ? count - t0 : kTokens;
    float raw[kTokens];
    SY_UNROLL
    for (int t = 0; t < kTokens; ++t)
      raw[t] = t < n ? qkv[int64_t{tok[t0 + t]} * conv_dim + col] : 0.0f;
    SY_UNROLL
    for (int t = 0; t < kTokens; ++t)
      if (t < n) conv_out[int64_t{tok[t0 + t]} * conv_dim + col] = conv.step(raw[t]);
  }
}

// Phase 1: the chunk's q, k and v rows (phase 0's outputs) into shared memory, 4 floats a load,
// kLoadBatch loads a thread in flight at once (all 12 at once took the kernel from 216 registers
// to 255 and spills); beta and log(decay) of each token.
constexpr int kLoadBatch = 6;
SY_HOST_DEVICE inline void load_chunk(const Inputs& in, int n, int tid, const View& s) {
  constexpr int kGroups = kChannels / 4;  // 4-float groups of a token
  constexpr int kRounds = kTokens * kGroups / kThreads;
  static_assert(kTokens * kGroups % kThreads == 0 && kRounds % kLoadBatch == 0,
                "whole rounds of loads");
  for (int j0 = 0; j0 < kRounds; j0 += kLoadBatch) {
    Vec4 x[kLoadBatch];
    SY_UNROLL
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = tid + (j0 + j) * kThreads, t = i / kGroups;
      if (t < n)
        x[j] =
            load4(in.conv + int64_t{in.tok[t]} * in.conv_dim + channel_of(in, 4 * (i % kGroups)));
    }
    SY_UNROLL
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = tid + (j0 + j) * kThreads, t = i / kGroups, ch = 4 * (i % kGroups);
      if (t >= n) continue;
      float* row = ch < kDim ? s.q + ch : ch < 2 * kDim ? s.k + ch - kDim : s.v + ch - 2 * kDim;
      const float v[4] = {x[j].x, x[j].y, x[j].z, x[j].w};
      store4(row + t * kRow, v);
    }
  }
  if (tid < n) {
    const int64_t at = int64_t{in.tok[tid]} * in.value_heads + in.head;
    s.beta[tid] = sigmoid(in.b[at]);
    s.b[tid] = -in.A * softplus(in.a[at] + in.dt_bias);
  }
}

// Phase 2: partial sums of squares of q and k, thread (token
// tid / kParts, part tid % kParts) over the 4-column groups 4 part + 32 m (a warp's 8 parts of
// a token read 32 consecutive floats); thread 0 also sums b over the chunk.
SY_HOST_DEVICE inline void norm_partials(const View& s, int n, int tid) {
  if (tid == 0)
    for (int t = 1; t < n; ++t) s.b[t] += s.b[t - 1];
  const int t = tid / kParts, part = tid % kParts;
  if (t >= n) return;
  float sq = 0.0f, sk = 0.0f;
  SY_UNROLL
  for (int c = 4 * part; c < kDim; c += 4 * kParts) {
    const Vec4 q = load4(s.q + t * kRow + c), k = load4(s.k + t * kRow + c);
    SY_UNROLL
    for (int e = 0; e < 4; ++e) {
      sq += q[e] * q[e];
      sk += k[e] * k[e];
    }
  }
  s.partial[t * 2 * kParts + part] = sq;
  s.partial[t * 2 * kParts + kParts + part] = sk;
}

// Phase 3: q and k of each token l2-normalised (x / sqrt(sum x^2 + 1e-6), as transformers'
// l2norm; q also by 1/sqrt(kDim)), each thread its columns of phase 2.
SY_HOST_DEVICE inline void normalize(const View& s, int n, int tid) {
  const int t = tid / kParts, part = tid % kParts;
  if (t >= n) return;
  float sq = 0.0f, sk = 0.0f;
  for (int p = 0; p < kParts; ++p) {
    sq += s.partial[t * 2 * kParts + p];
    sk += s.partial[t * 2 * kParts + kParts + p];
  }
  const float q_scale = 1.0f / sqrtf(sq + 1e-6f) * (1.0f / sqrtf(static_cast<float>(kDim)));
  const float k_scale = 1.0f / sqrtf(sk + 1e-6f);
  SY_UNROLL
  for (int c = 4 * part; c < kDim; c += 4 * kParts) {
    const Vec4 q = load4(s.q + t * kRow + c), k = load4(s.k + t * kRow + c);
    float qs[4], ks[4];
    SY_UNROLL
    for (int e = 0; e < 4; ++e) {
      qs[e] = q[e] * q_scale;
      ks[e] = k[e] * k_scale;
    }
    store4(s.q + t * kRow + c, qs);
    store4(s.k + t * kRow + c, ks);
  }
}

// Entry (i, j) of A and pm from k_i.k_j and q_i.k_j (zero outside their triangles; rows past n
// hold no data: selected away, not multiplied).
SY_HOST_DEVICE inline void store_a_pm(const View& s, int n, int i, int j, float kk, float qk) {
  const bool lower = i < n && j <= i;
  const float decay = lower ? expf(s.b[i] - s.b[j]) : 0.0f;
  s.a[i * kSquare + j] = lower && j < i ? s.beta[i] * decay * kk : 0.0f;
  s.pm[i * kSquare + j] = lower ? decay * qk : 0.0f;
}

// Phase 4: A and pm, every entry of the kTokens x kTokens (zeros outside their triangles).
// Thread tid: rows i0, i0 + kTokens/2 and columns j0, j0 + kTokens/2 (i0 = tid / 16, j0 = tid
// % 16), the dot products over r in order, 4 floats a load.
constexpr int kHalf = kTokens / 2;
static_assert(kHalf * kHalf == kThreads, "a 2 x 2 tile of A and pm a thread");
SY_HOST_DEVICE inline void a_and_pm(const View& s, int n, int tid) {
  const int i0 = tid / kHalf, j0 = tid % kHalf;
  float kk[2][2] = {}, qk[2][2] = {};
  // (Both rows past n, as in a short chunk's idle threads: zeros, no dot products.)
  for (int r = 0; r < (i0 < n ? kDim : 0); r += 4) {
    Vec4 ki[2], qi[2], kj[2];
    SY_UNROLL
    for (int x = 0; x < 2; ++x) {
      ki[x] = load4(s.k + (i0 + x * kHalf) * kRow + r);
      qi[x] = load4(s.q + (i0 + x * kHalf) * kRow + r);
      kj[x] = load4(s.k + (j0 + x * kHalf) * kRow + r);
    }
    SY_UNROLL
    for (int e = 0; e < 4; ++e)
      for (int x = 0; x < 2; ++x)
        for (int y = 0; y < 2; ++y) {
          kk[x][y] += ki[x][e] * kj[y][e];
          qk[x][y] += qi[x][e] * kj[y][e];
        }
  }
  SY_UNROLL
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 2; ++y)
      store_a_pm(s, n, i0 + x * kHalf, j0 + y * kHalf, kk[x][y], qk[x][y]);
}

// Phase 5a (beside 5b: it reads only A and writes only T): T = (I + A)^-1, lower triangular
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

// Phase 5b: R = beta (v - e^b k S0) in place of v; out = e^b q S0 (kept by the thread for phase
// 7). The thread's output tile; S0 read 4 rows at a time.
SY_HOST_DEVICE inline void r_and_qs(const View& s, int n, int tid, float (&out)[kTile][kTile]) {
  const int row0 = kTile * (tid / 32), col0 = kTile * (tid % 32);
  float ks[kTile][kTile];
  SY_UNROLL
  for (int m = 0; m < kTile; ++m)
    for (int e = 0; e < kTile; ++e) ks[m][e] = out[m][e] = 0.0f;
  if (row0 >= n) return;  // (a short chunk: the warp's rows hold no tokens)
  for (int r = 0; r < kDim; r += 4) {
    Vec4 state[4], k[kTile], q[kTile];
    SY_UNROLL
    for (int x = 0; x < 4; ++x) state[x] = load4(s.state + (r + x) * kRow + col0);
    SY_UNROLL
    for (int m = 0; m < kTile; ++m) {
      k[m] = load4(s.k + (row0 + m) * kRow + r);
      q[m] = load4(s.q + (row0 + m) * kRow + r);
    }
    SY_UNROLL
    for (int x = 0; x < 4; ++x)
      for (int m = 0; m < kTile; ++m)
        for (int e = 0; e < kTile; ++e) {
          ks[m][e] += k[m][x] * state[x][e];
          out[m][e] += q[m][x] * state[x][e];
        }
  }
  SY_UNROLL
  for (int m = 0; m < kTile; ++m) {
    const int i = row0 + m;
    if (i >= n) continue;
    const float grow = expf(s.b[i]);
    const Vec4 v = load4(s.v + i * kRow + col0);
    float r_row[kTile];
    SY_UNROLL
    for (int e = 0; e < kTile; ++e) {
      r_row[e] = s.beta[i] * (v[e] - grow * ks[m][e]);
      out[m][e] *= grow;
    }
    store4(s.v + i * kRow + col0, r_row);
  }
}

// Rows j < this bound feed the thread's output rows (T and pm are zero above the diagonal;
// rows past n hold no data).
SY_HOST_DEVICE inline int rows_feeding(int row0, int n) {
  return row0 + kTile < n ? row0 + kTile : n;
}

// acc[m][e] += sum_{j < last} square[row0 + m][j] rows[j][col0 + e], j in order: the thread's
// tile of a chunk x chunk matrix (kSquare rows) times rows of the chunk (kRow rows).
SY_HOST_DEVICE inline void add_square_times_rows(const float* square, const float* rows, int row0,
                                                 int col0, int last, float (&acc)[kTile][kTile]) {
  for (int j = 0; j < last; ++j) {
    const Vec4 r = load4(rows + j * kRow + col0);
    SY_UNROLL
    for (int m = 0; m < kTile; ++m) {
      const float x = square[(row0 + m) * kSquare + j];
      SY_UNROLL
      for (int e = 0; e < kTile; ++e) acc[m][e] += x * r[e];
    }
  }
}

// Phase 6: U = T R, the thread's tile.
SY_HOST_DEVICE inline void u_of(const View& s, int n, int tid) {
  const int row0 = kTile * (tid / 32), col0 = kTile * (tid % 32);
  if (row0 >= n) return;
  float u[kTile][kTile] = {};
  add_square_times_rows(s.t, s.v, row0, col0, rows_feeding(row0, n), u);
  SY_UNROLL
  for (int m = 0; m < kTile; ++m)
    if (row0 + m < n) store4(s.u + (row0 + m) * kRow + col0, u[m]);
}

// Phase 7: o = out + pm U into q (the thread's tile); the state carried to the next chunk, in
// place (the thread's kStateRows x 4 of it), k read 4 rows at a time.
SY_HOST_DEVICE inline void outputs_and_state(const View& s, int n, int tid,
                                             float (&out)[kTile][kTile]) {
  const int warp = tid / 32, row0 = kTile * warp, col0 = kTile * (tid % 32);
  if (row0 < n) add_square_times_rows(s.pm, s.u, row0, col0, rows_feeding(row0, n), out);
  SY_UNROLL
  for (int m = 0; m < kTile; ++m)
    if (row0 + m < n) store4(s.q + (row0 + m) * kRow + col0, out[m]);

  const float b_last = s.b[n - 1], keep = expf(b_last);
  const int state0 = kStateRows * warp;
  float state[kStateRows][kTile];
  SY_UNROLL
  for (int r = 0; r < kStateRows; ++r) {
    const Vec4 x = load4(s.state + (state0 + r) * kRow + col0);
    SY_UNROLL
    for (int e = 0; e < kTile; ++e) state[r][e] = keep * x[e];
  }
  for (int j = 0; j < n; ++j) {
    const float grow = expf(b_last - s.b[j]);
    const Vec4 u = load4(s.u + j * kRow + col0);
    float carried[kTile];  // e^(b_last - b_j) U_j, the thread's columns
    SY_UNROLL
    for (int e = 0; e < kTile; ++e) carried[e] = grow * u[e];
    SY_UNROLL
    for (int r = 0; r < kStateRows; r += 4) {
      const Vec4 k = load4(s.k + j * kRow + state0 + r);
      SY_UNROLL
      for (int x = 0; x < 4; ++x)
        for (int e = 0; e < kTile; ++e) state[r + x][e] += k[x] * carried[e];
    }
  }
  SY_UNROLL
  for (int r = 0; r < kStateRows; ++r) store4(s.state + (state0 + r) * kRow + col0, state[r]);
}

// Phase 8: partial sums of squares of the outputs o (the output norm), as phase 2's.
SY_HOST_DEVICE inline void output_partials(const View& s, int n, int tid) {
  const int t = tid / kParts, part = tid % kParts;
  if (t >= n) return;
  float sum = 0.0f;
  SY_UNROLL
  for (int c = 4 * part; c < kDim; c += 4 * kParts) {
    const Vec4 o = load4(s.q + t * kRow + c);
    SY_UNROLL
    for (int e = 0; e < 4; ++e) sum += o[e] * o[e];
  }
  s.partial[t * 2 * kParts + part] = sum;
}

// Phase 9: the outputs, normed (RMSNorm over the head's outputs), times the norm weight and
// silu(z); each thread its columns of phase 8, z, the norm weights and the outputs 4 floats a
// load or store (value_dim and the head's offset are multiples of 4).
SY_HOST_DEVICE inline void write_outputs(const Inputs& in, const View& s, int n, int tid,
                                         float* out) {
  const int t = tid / kParts, part = tid % kParts;
  if (t >= n) return;
  float sum = 0.0f;
  for (int p = 0; p < kParts; ++p) sum += s.partial[t * 2 * kParts + p];
  const float scale = 1.0f / sqrtf(sum / static_cast<float>(kDim) + in.eps);
  const int64_t row = int64_t{in.tok[t]} * in.value_dim + int64_t{in.head} * kDim;
  constexpr int kGroups = kDim / (4 * kParts);  // a thread's 4-float groups
  Vec4 z[kGroups];                              // every group's z requested before any is used
  SY_UNROLL
  for (int g = 0; g < kGroups; ++g) z[g] = load4(in.z + row + 4 * part + 4 * kParts * g);
  SY_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    const int c = 4 * part + 4 * kParts * g;
    const Vec4 o = load4(s.q + t * kRow + c), w = load4(in.norm + c);
    float v[4];
    SY_UNROLL
    for (int e = 0; e < 4; ++e) v[e] = w[e] * (o[e] * scale) * silu(z[g][e]);
    store4(out + row + c, v);
  }
}

// ---- The chunk's matmuls on tensor cores (SY_DELTA_TC=1; phases 4, 5b, 6 and 7 above, same
// inputs and outputs) ----
//
// mma.sync m16n8k16 (bf16 in, f32 accumulate) with every f32 operand split into a bf16 high part
// and a bf16 low part (x - high, rounded): a product is hi.hi + hi.lo + lo.hi, three mmas, ~2^-16
// of it left out (lo.lo and the low parts' rounding) where plain bf16 would leave ~2^-8; the op
// harness holds DeltaNet to 1e-4. A warp computes 16 x 8 output tiles; its lane (g = lane / 4,
// t = lane % 4) holds entries (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of each, in that
// order. Operands are read from shared memory by strides, so one function serves row- and
// column-major views; k indices at or past a bound read as zero (rows past n never enter a sum).
// On the host (tests) a fragment is its tile's address and mma3 computes the lane's entries from
// shared memory with the same split, so each lane stays a function of shared memory alone.
SY_HOST_DEVICE inline float bf16_round(float x) {  // to nearest, ties to even (finite x)
#ifdef __CUDA_ARCH__
  return __bfloat162float(__float2bfloat16_rn(x));
#else
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float rounded;
  memcpy(&rounded, &bits, sizeof(rounded));
  return rounded;
#endif
}
SY_HOST_DEVICE inline int lane_row(int lane, int entry) {
  return lane / 4 + 8 * (entry / 2);
}
SY_HOST_DEVICE inline int lane_col(int lane, int entry) {
  return 2 * (lane % 4) + entry % 2;
}

#ifdef __CUDA_ARCH__
struct FragA {  // 16 x 16
  uint32_t hi[4], lo[4];
};
struct FragB {  // 16 x 8
  uint32_t hi[2], lo[2];
};
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const float h0 = bf16_round(x0), h1 = bf16_round(x1);
  hi = pack_bf16(h0, h1);
  lo = pack_bf16(x0 - h0, x1 - h1);
}
#else
struct FragA {
  const float* p;
  int sm, sk, k_valid;
};
struct FragB {
  const float* p;
  int sk, sn, k_valid;
  const float* scale;
};
#endif

// A(m, k) = p[m sm + k sk] for m, k < 16; zero for k >= k_valid.
SY_HOST_DEVICE inline FragA load_a(const float* p, int sm, int sk, int k_valid, int lane) {
#ifdef __CUDA_ARCH__
  FragA f;
  const int g = lane / 4, t = lane % 4;
  SY_UNROLL
  for (int r = 0; r < 4; ++r) {
    const int m = g + 8 * (r % 2), k = 2 * t + 8 * (r / 2);
    const float x0 = k < k_valid ? p[m * sm + k * sk] : 0.0f;
    const float x1 = k + 1 < k_valid ? p[m * sm + (k + 1) * sk] : 0.0f;
    split_pair(x0, x1, f.hi[r], f.lo[r]);
  }
  return f;
#else
  (void)lane;
  return {p, sm, sk, k_valid};
#endif
}
// B(k, n) = scale[k] p[k sk + n sn] for k < 16, n < 8 (scale: nullptr for 1); zero for k >=
// k_valid.
SY_HOST_DEVICE inline FragB load_b(const float* p, int sk, int sn, int k_valid, int lane,
                                   const float* scale = nullptr) {
#ifdef __CUDA_ARCH__
  FragB f;
  const int g = lane / 4, t = lane % 4;
  SY_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int k = 2 * t + 8 * r;
    float x0 = k < k_valid ? p[k * sk + g * sn] : 0.0f;
    float x1 = k + 1 < k_valid ? p[(k + 1) * sk + g * sn] : 0.0f;
    if (scale) {
      x0 = k < k_valid ? x0 * scale[k] : 0.0f;
      x1 = k + 1 < k_valid ? x1 * scale[k + 1] : 0.0f;
    }
    split_pair(x0, x1, f.hi[r], f.lo[r]);
  }
  return f;
#else
  (void)lane;
  return {p, sk, sn, k_valid, scale};
#endif
}
// c += A B, the lane's four entries.
SY_HOST_DEVICE inline void mma3(float (&c)[4], const FragA& a, const FragB& b, int lane) {
#ifdef __CUDA_ARCH__
  (void)lane;
  mma_bf16(c, a.lo, b.hi[0], b.hi[1]);
  mma_bf16(c, a.hi, b.lo[0], b.lo[1]);
  mma_bf16(c, a.hi, b.hi[0], b.hi[1]);
#else
  for (int e = 0; e < 4; ++e) {
    const int m = lane_row(lane, e), n = lane_col(lane, e);
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) {
      const float x = k < a.k_valid ? a.p[m * a.sm + k * a.sk] : 0.0f;
      float y = k < b.k_valid ? b.p[k * b.sk + n * b.sn] : 0.0f;
      if (b.scale) y = k < b.k_valid ? y * b.scale[k] : 0.0f;
      const float xh = bf16_round(x), yh = bf16_round(y);
      const float xl = bf16_round(x - xh), yl = bf16_round(y - yh);
      sum += xl * yh + xh * yl + xh * yh;
    }
    c[e] += sum;
  }
#endif
}

// The 32 x 128 outputs (R, U, o) as the warps hold them: warp w has rows 16 (w % 2) .. + 15 and
// the four 8-column tiles from column 32 (w / 2).
SY_HOST_DEVICE inline int tc_row0(int tid) {
  return 16 * ((tid / 32) % 2);
}
SY_HOST_DEVICE inline int tc_col0(int tid) {
  return 32 * (tid / 64);
}
static_assert(kTokens == 32 && kDim == 128 && kWarps == 8, "the warps' tiles");

// Phase 4 on tensor cores: warp w the 16 x 8 tile at rows 16 (w / 4), columns 8 (w % 4) of both
// k k^T and q k^T, then A and pm as a_and_pm writes them; threads < kTokens also write grow.
SY_HOST_DEVICE inline void a_and_pm_tc(const View& s, int n, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const int m0 = 16 * (warp / 4), n0 = 8 * (warp % 4);
  float kk[4] = {}, qk[4] = {};
  if (n0 <= m0 + 15 && m0 < n)  // (tiles above the diagonal or past n are zero)
    for (int d = 0; d < kDim; d += 16) {
      const FragB kj = load_b(s.k + n0 * kRow + d, 1, kRow, 16, lane);
      mma3(kk, load_a(s.k + m0 * kRow + d, kRow, 1, 16, lane), kj, lane);
      mma3(qk, load_a(s.q + m0 * kRow + d, kRow, 1, 16, lane), kj, lane);
    }
  SY_UNROLL
  for (int e = 0; e < 4; ++e)
    store_a_pm(s, n, m0 + lane_row(lane, e), n0 + lane_col(lane, e), kk[e], qk[e]);
  if (tid < kTokens) s.grow[tid] = tid < n ? expf(s.b[n - 1] - s.b[tid]) : 0.0f;
}

// Phase 5b on tensor cores: R = beta (v - e^b k S0) in place of v and out = e^b q S0 (the
// thread's entries, [column tile][entry], kept for phase 7).
SY_HOST_DEVICE inline void r_and_qs_tc(const View& s, int n, int tid, float (&out)[kTile][kTile]) {
  const int lane = tid % 32, row0 = tc_row0(tid), col0 = tc_col0(tid);
  float ks[kTile][kTile];
  SY_UNROLL
  for (int c = 0; c < kTile; ++c)
    for (int e = 0; e < 4; ++e) ks[c][e] = out[c][e] = 0.0f;
  if (row0 >= n) return;
  for (int d = 0; d < kDim; d += 16) {
    const FragA k = load_a(s.k + row0 * kRow + d, kRow, 1, 16, lane);
    const FragA q = load_a(s.q + row0 * kRow + d, kRow, 1, 16, lane);
    SY_UNROLL
    for (int c = 0; c < kTile; ++c) {
      const FragB state = load_b(s.state + d * kRow + col0 + 8 * c, kRow, 1, 16, lane);
      mma3(ks[c], k, state, lane);
      mma3(out[c], q, state, lane);
    }
  }
  SY_UNROLL
  for (int c = 0; c < kTile; ++c)
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + lane_row(lane, e), col = col0 + 8 * c + lane_col(lane, e);
      if (i >= n) continue;
      const float grow = expf(s.b[i]);
      s.v[i * kRow + col] = s.beta[i] * (s.v[i * kRow + col] - grow * ks[c][e]);
      out[c][e] *= grow;
    }
}

// acc += square rows (chunk x chunk, kSquare rows) times rows [j < n] of the chunk (kRow rows),
// the thread's entries of the 32 x 128 result; then those of rows < n stored to `out` rows.
SY_HOST_DEVICE inline void add_square_times_rows_tc(const float* square, const float* rows, int n,
                                                    int tid, float (&acc)[kTile][4]) {
  const int lane = tid % 32, row0 = tc_row0(tid), col0 = tc_col0(tid);
  for (int j = 0; j < n; j += 16) {
    const FragA a = load_a(square + row0 * kSquare + j, kSquare, 1, 16, lane);
    SY_UNROLL
    for (int c = 0; c < kTile; ++c)
      mma3(acc[c], a, load_b(rows + j * kRow + col0 + 8 * c, kRow, 1, n - j, lane), lane);
  }
}
SY_HOST_DEVICE inline void store_rows_tc(float* out, int n, int tid, const float (&acc)[kTile][4]) {
  const int lane = tid % 32, row0 = tc_row0(tid), col0 = tc_col0(tid);
  SY_UNROLL
  for (int c = 0; c < kTile; ++c)
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + lane_row(lane, e);
      if (i < n) out[i * kRow + col0 + 8 * c + lane_col(lane, e)] = acc[c][e];
    }
}

// Phase 6 on tensor cores: U = T R (rows of R past n read as zero).
SY_HOST_DEVICE inline void u_of_tc(const View& s, int n, int tid) {
  if (tc_row0(tid) >= n) return;
  float u[kTile][4] = {};
  add_square_times_rows_tc(s.t, s.v, n, tid, u);
  store_rows_tc(s.u, n, tid, u);
}

// Phase 7 on tensor cores: o = out + pm U into q; the state carried to the next chunk in place,
// S = e^(b_last) S0 + k^T (grow U), warp w its key rows 16 w .. + 15, every value column.
SY_HOST_DEVICE inline void outputs_and_state_tc(const View& s, int n, int tid,
                                                float (&out)[kTile][kTile]) {
  const int warp = tid / 32, lane = tid % 32;
  if (tc_row0(tid) < n) {
    add_square_times_rows_tc(s.pm, s.u, n, tid, out);
    store_rows_tc(s.q, n, tid, out);
  }
  constexpr int kColTiles = kDim / 8;
  const int key0 = 16 * warp;
  const float keep = expf(s.b[n - 1]);
  float state[kColTiles][4];
  SY_UNROLL
  for (int c = 0; c < kColTiles; ++c)
    for (int e = 0; e < 4; ++e)
      state[c][e] = keep * s.state[(key0 + lane_row(lane, e)) * kRow + 8 * c + lane_col(lane, e)];
  for (int j = 0; j < n; j += 16) {
    const FragA k = load_a(s.k + j * kRow + key0, 1, kRow, n - j, lane);  // k^T
    SY_UNROLL
    for (int c = 0; c < kColTiles; ++c)
      mma3(state[c], k, load_b(s.u + j * kRow + 8 * c, kRow, 1, n - j, lane, s.grow + j), lane);
  }
  SY_UNROLL
  for (int c = 0; c < kColTiles; ++c)
    for (int e = 0; e < 4; ++e)
      s.state[(key0 + lane_row(lane, e)) * kRow + 8 * c + lane_col(lane, e)] = state[c][e];
}

}  // namespace sy::backend::cuda::delta_chunk
