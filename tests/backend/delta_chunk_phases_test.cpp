// delta_net_chunk_kernel's phases (backend/cuda/delta_chunk.cuh, the same functions the kernel
// calls) run on the CPU: every thread of a phase in turn, phase by phase, as the kernel's barriers
// order them, over several chunks (the state carried), with the rows and entries a phase must not
// read poisoned with NaN. The in-chunk math against the recurrence in double; the whole chunk
// pipeline (conv, norms, outputs, states) against the CPU backend's gated_delta_net.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/delta_chunk.cuh"
#include "delta_rule_reference.h"

namespace {

namespace dc = sy::backend::cuda::delta_chunk;

struct Tokens {
  int count = 0;
  std::vector<double> q, k, v, log_decay,
      beta;  // q, k normalised (q scaled), as the kernel gets them
};

Tokens make_tokens(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Tokens t;
  t.count = count;
  auto unit = [&](std::vector<double>& x, double scale) {
    std::vector<double> row(dc::kDim);
    double norm = 0.0;
    for (double& e : row) {
      e = normal(rng);
      norm += e * e;
    }
    for (double e : row) x.push_back(e * scale / std::sqrt(norm));
  };
  for (int i = 0; i < count; ++i) {
    unit(t.q, 1.0 / std::sqrt(static_cast<double>(dc::kDim)));
    unit(t.k, 1.0);
    for (int c = 0; c < dc::kDim; ++c) t.v.push_back(2.0 * normal(rng));
    t.log_decay.push_back(std::log(0.05 + 0.95 * uniform(rng)));
    t.beta.push_back(uniform(rng));
  }
  return t;
}

// The recurrence: o [count, kDim] before the output norm; state updated in place.
void recurrent(const Tokens& t, std::vector<double>& state, std::vector<double>& out) {
  std::vector<double> decay;
  for (double log_decay : t.log_decay) decay.push_back(std::exp(log_decay));
  sy::test::delta_rule_recurrence(t.count, dc::kDim, dc::kDim, t.q, t.k, t.v, decay, t.beta, state,
                                  out);
}

// Shared memory of one block, the kernel's layout, with every float NaN until written.
struct Block {
  std::vector<float> q, k, v, u, state, a, t, pm, b, beta, partial, grow;
  Block() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (auto* x : {&q, &k, &v, &u}) x->assign(dc::kTokens * dc::kRow, nan);
    state.assign(dc::kDim * dc::kRow, nan);
    for (auto* x : {&a, &t, &pm}) x->assign(dc::kTokens * dc::kSquare, nan);
    for (auto* x : {&b, &beta, &grow}) x->assign(dc::kTokens, nan);
    partial.assign(dc::kTokens * 2 * dc::kParts, nan);
  }
  dc::View view() {
    return {q.data(), k.data(),  v.data(), u.data(),    state.data(),   a.data(),
            t.data(), pm.data(), b.data(), beta.data(), partial.data(), grow.data()};
  }
};

// The order in which a phase's threads run, one after another: both tests run with threads
// ascending and descending, so a phase in which a thread read what another writes (a missing
// barrier) would give two results.
std::vector<int> g_threads;
void set_thread_order(bool descending) {
  g_threads.resize(dc::kThreads);
  for (int i = 0; i < dc::kThreads; ++i) g_threads[i] = descending ? dc::kThreads - 1 - i : i;
}

// Phases 4 to 7 (the chunk's math) for every thread in turn, each phase after the previous one
// as the kernel's barriers order them; a thread's registers between phases 5 and 7 kept aside.
// tensor_cores: the _tc phases (a lane's mma entries computed from shared memory, as on the
// device), as the kernel runs them with SY_DELTA_TC=1.
void run_math_phases(const dc::View& view, int n, bool tensor_cores) {
  for (int tid : g_threads) (tensor_cores ? dc::a_and_pm_tc : dc::a_and_pm)(view, n, tid);
  using Tile = float[dc::kTile][dc::kTile];
  std::vector<std::array<float, dc::kTile * dc::kTile>> kept(dc::kThreads);
  for (int tid : g_threads) {
    Tile o;
    dc::t_matrix(view, tid);
    (tensor_cores ? dc::r_and_qs_tc : dc::r_and_qs)(view, n, tid, o);
    std::memcpy(kept[tid].data(), o, sizeof(o));
  }
  for (int tid : g_threads) (tensor_cores ? dc::u_of_tc : dc::u_of)(view, n, tid);
  for (int tid : g_threads) {
    Tile o;
    std::memcpy(o, kept[tid].data(), sizeof(o));
    (tensor_cores ? dc::outputs_and_state_tc : dc::outputs_and_state)(view, n, tid, o);
  }
}

// The chunks of `sizes` through the phases; o [count, kDim] and the final state.
void emulate(const Tokens& t, const std::vector<int>& sizes, const std::vector<double>& state0,
             bool tensor_cores, std::vector<double>& out, std::vector<double>& state) {
  const int D = dc::kDim;
  Block blk;
  const dc::View view = blk.view();
  for (int r = 0; r < D; ++r)
    for (int c = 0; c < D; ++c) blk.state[r * dc::kRow + c] = static_cast<float>(state0[r * D + c]);
  out.assign(static_cast<size_t>(t.count) * D, 0.0);
  int first = 0;
  for (int n : sizes) {
    // Rows past n keep what the previous chunk left (NaN on the first): never read as data.
    float running = 0.0f;
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < D; ++c) {
        blk.q[i * dc::kRow + c] = static_cast<float>(t.q[(first + i) * D + c]);
        blk.k[i * dc::kRow + c] = static_cast<float>(t.k[(first + i) * D + c]);
        blk.v[i * dc::kRow + c] = static_cast<float>(t.v[(first + i) * D + c]);
      }
      running += static_cast<float>(t.log_decay[first + i]);
      blk.b[i] = running;
      blk.beta[i] = static_cast<float>(t.beta[first + i]);
    }
    run_math_phases(view, n, tensor_cores);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < D; ++c) out[(first + i) * D + c] = blk.q[i * dc::kRow + c];
    first += n;
  }
  state.assign(static_cast<size_t>(D) * D, 0.0);
  for (int r = 0; r < D; ++r)
    for (int c = 0; c < D; ++c) state[r * D + c] = blk.state[r * dc::kRow + c];
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(
        diff, std::isnan(a[i]) ? std::numeric_limits<double>::infinity() : std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

TEST(DeltaChunkPhases, TheKernelsInChunkMathMatchesTheRecurrence) {
  // A short first chunk, full chunks, a short one between them (rows past n left from a full
  // chunk), a 1-token chunk.
  // The first chunk short: its rows past n are NaN, never read.
  const std::vector<int> sizes = {20, dc::kTokens, 7, dc::kTokens, 1};
  int count = 0;
  for (int n : sizes) count += n;
  const Tokens t = make_tokens(7u, count);
  std::mt19937 rng(11u);
  std::normal_distribution<double> normal;
  std::vector<double> state0(static_cast<size_t>(dc::kDim) * dc::kDim);
  for (double& x : state0) x = 0.3 * normal(rng);
  std::vector<double> want_state = state0, want;
  recurrent(t, want_state, want);
  for (bool tensor_cores : {false, true})
    for (bool descending : {false, true}) {
      SCOPED_TRACE(descending ? "threads descending" : "threads ascending");
      SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
      set_thread_order(descending);
      std::vector<double> got, got_state;
      emulate(t, sizes, state0, tensor_cores, got, got_state);
      EXPECT_LT(relative_error(got, want), 1e-5);
      EXPECT_LT(relative_error(got_state, want_state), 1e-5);
    }
}

// A step of three sequences on the CPU backend and through the chunk phases, block by block as the
// kernel runs them: sequence 0 fresh (75 tokens: chunks of 32, 32, 11), sequence 1 continuing
// from state buffer 2 (40 tokens), sequence 2 fresh and shorter than a chunk (9 tokens: its
// block's rows past 9 are NaN), their tokens interleaved in the step.
TEST(DeltaChunkPhases, TheChunkPipelineMatchesTheCpuBackend) {
  constexpr int kHistory = 3, kKernel = kHistory + 1, kKeyHeads = 2, kValueHeads = 4, D = dc::kDim;
  constexpr int64_t key_dim = int64_t{kKeyHeads} * D, value_dim = int64_t{kValueHeads} * D;
  constexpr int64_t conv_dim = 2 * key_dim + value_dim, buffers = 6;
  const std::vector<int> lengths = {75, 40, 9}, starts = {0, 230, 0}, read = {0, 2, 4},
                         write = {1, 3, 5};
  constexpr int kSeqs = 3;
  std::vector<int32_t> positions, token_seq;
  std::vector<int> next(kSeqs, 0);
  while (next[0] < lengths[0] || next[1] < lengths[1] || next[2] < lengths[2])
    for (int s = 0; s < kSeqs; ++s)
      if (next[s] < lengths[s]) {
        positions.push_back(starts[s] + next[s]++);
        token_seq.push_back(s);
      }
  const int64_t T = static_cast<int64_t>(positions.size());
  std::mt19937 rng(5u);
  std::normal_distribution<float> normal;
  auto randoms = [&](int64_t count, float scale) {
    std::vector<float> x(static_cast<size_t>(count));
    for (float& e : x) e = scale * normal(rng);
    return x;
  };
  std::vector<float> qkv = randoms(T * conv_dim, 1.5f), z = randoms(T * value_dim, 2.0f);
  std::vector<float> b = randoms(T * kValueHeads, 2.0f), a = randoms(T * kValueHeads, 2.0f);
  std::vector<float> a_log = randoms(kValueHeads, 1.0f), dt_bias = randoms(kValueHeads, 1.0f);
  std::vector<float> norm = randoms(D, 0.3f);
  for (float& e : norm) e += 1.0f;
  std::vector<uint16_t> conv_w(static_cast<size_t>(conv_dim * kKernel));
  for (uint16_t& w : conv_w) {
    const float value = 0.6f * normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    w = static_cast<uint16_t>(bits >> 16);  // truncated to bf16: any bf16 values do
  }
  const std::vector<float> conv0 = randoms(buffers * conv_dim * kHistory, 1.0f);
  const std::vector<float> recurrent0 = randoms(buffers * kValueHeads * D * D, 0.3f);

  // The CPU backend.
  std::unique_ptr<sy::backend::Backend> cpu = sy::backend::make_cpu_backend({2});
  using sy::DType;
  using sy::Tensor;
  std::vector<float> conv_cpu = conv0, recurrent_cpu = recurrent0,
                     out_cpu(static_cast<size_t>(T * value_dim), 0.0f);
  std::vector<int32_t> read32(read.begin(), read.end()), write32(write.begin(), write.end());
  Tensor t_qkv(qkv.data(), DType::kF32, {T, conv_dim}), t_z(z.data(), DType::kF32, {T, value_dim});
  Tensor t_b(b.data(), DType::kF32, {T, kValueHeads}), t_a(a.data(), DType::kF32, {T, kValueHeads});
  Tensor t_conv_w(conv_w.data(), DType::kBF16, {conv_dim, 1, kKernel});
  Tensor t_a_log(a_log.data(), DType::kF32, {kValueHeads}),
      t_dt(dt_bias.data(), DType::kF32, {kValueHeads});
  Tensor t_norm(norm.data(), DType::kF32, {D});
  Tensor t_conv(conv_cpu.data(), DType::kF32, {buffers, conv_dim, kHistory});
  Tensor t_recurrent(recurrent_cpu.data(), DType::kF32, {buffers, kValueHeads, D, D});
  Tensor t_out(out_cpu.data(), DType::kF32, {T, value_dim});
  sy::backend::AttentionBatch batch;
  batch.positions = Tensor(positions.data(), DType::kI32, {T});
  batch.token_seq = Tensor(token_seq.data(), DType::kI32, {T});
  batch.max_query_len = lengths[0];
  const sy::backend::Backend::LinearState state{Tensor(read32.data(), DType::kI32, {kSeqs}),
                                                Tensor(write32.data(), DType::kI32, {kSeqs}),
                                                &t_conv, &t_recurrent};
  cpu->gated_delta_net(t_qkv, t_z, t_b, t_a, {&t_conv_w, &t_a_log, &t_dt, &t_norm},
                       {kKeyHeads, kValueHeads, D, D, kKernel}, 1e-6f, batch, state, t_out);

  for (bool tensor_cores : {false, true})
    for (bool descending : {false, true}) {
      SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
      SCOPED_TRACE(descending ? "threads descending" : "threads ascending");
      set_thread_order(descending);
      // The phases, a block per (sequence, value head) as delta_net_chunk_kernel runs them.
      std::vector<float> conv_dev = conv0, recurrent_dev = recurrent0;
      std::vector<float> out_dev(static_cast<size_t>(T * value_dim),
                                 std::numeric_limits<float>::quiet_NaN());
      std::vector<float> conv_out(static_cast<size_t>(T * conv_dim),
                                  std::numeric_limits<float>::quiet_NaN());
      for (int s = 0; s < kSeqs; ++s) {
        std::vector<int32_t> list;
        for (int64_t t = 0; t < T; ++t)
          if (token_seq[t] == s) list.push_back(static_cast<int32_t>(t));
        const bool fresh = positions[list[0]] == 0;
        // Phase 0 (delta_conv_kernel): a thread per channel, descending or ascending.
        for (int64_t i = 0; i < conv_dim; ++i) {
          const int64_t col = descending ? conv_dim - 1 - i : i;
          dc::ConvWindow<kHistory> conv;
          conv.load_weights(conv_w.data(), col);
          for (int m = 0; m < kHistory; ++m)
            conv.window[m] = fresh ? 0.0f : conv0[(read[s] * conv_dim + col) * kHistory + m];
          dc::conv_walk<kHistory>(qkv.data(), conv_dim, col, list.data(),
                                  static_cast<int>(list.size()), conv, conv_out.data());
          for (int m = 0; m < kHistory; ++m)
            conv_dev[(write[s] * conv_dim + col) * kHistory + m] = conv.window[m];
        }
        for (int h = 0; h < kValueHeads; ++h) {
          Block blk;
          const dc::View view = blk.view();
          dc::Inputs in{conv_out.data(),
                        z.data(),
                        b.data(),
                        a.data(),
                        norm.data(),
                        list.data(),
                        key_dim,
                        conv_dim,
                        value_dim,
                        h / (kValueHeads / kKeyHeads),
                        h,
                        kValueHeads,
                        std::exp(a_log[h]),
                        dt_bias[h],
                        1e-6f};
          for (int i = 0; i < D * D; ++i)
            blk.state[(i / D) * dc::kRow + i % D] =
                fresh ? 0.0f : recurrent0[(read[s] * kValueHeads + h) * D * D + i];
          const int count = static_cast<int>(list.size());
          for (int c0 = 0; c0 < count; c0 += dc::kTokens) {
            const int n = std::min(dc::kTokens, count - c0);
            in.tok = list.data() + c0;
            for (int tid : g_threads) dc::load_chunk(in, n, tid, view);
            for (int tid : g_threads) dc::norm_partials(view, n, tid);
            for (int tid : g_threads) dc::normalize(view, n, tid);
            run_math_phases(view, n, tensor_cores);
            for (int tid : g_threads) dc::output_partials(view, n, tid);
            for (int tid : g_threads) dc::write_outputs(in, view, n, tid, out_dev.data());
          }
          for (int i = 0; i < D * D; ++i)
            recurrent_dev[(write[s] * kValueHeads + h) * D * D + i] =
                blk.state[(i / D) * dc::kRow + i % D];
        }
      }
      auto as_double = [](const std::vector<float>& x) {
        return std::vector<double>(x.begin(), x.end());
      };
      EXPECT_LT(relative_error(as_double(out_dev), as_double(out_cpu)), 1e-4);
      EXPECT_LT(relative_error(as_double(conv_dev), as_double(conv_cpu)), 1e-6);
      EXPECT_LT(relative_error(as_double(recurrent_dev), as_double(recurrent_cpu)), 1e-4);
    }
}

}  // namespace
