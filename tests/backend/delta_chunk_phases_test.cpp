// delta_net_chunk_kernel's in-chunk math (backend/cuda/delta_chunk.cuh, the same functions the
// kernel calls) run on the CPU: every thread of a phase in turn, phase by phase, as the kernel's
// barriers order them, over several chunks (the state carried), with the rows and entries a
// phase must not read poisoned with NaN. Checked against the recurrence in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/delta_chunk.cuh"

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
  const int D = dc::kDim;
  out.assign(static_cast<size_t>(t.count) * D, 0.0);
  for (int i = 0; i < t.count; ++i) {
    const double decay = std::exp(t.log_decay[i]);
    for (double& x : state) x *= decay;
    for (int c = 0; c < D; ++c) {
      double read = 0.0;
      for (int r = 0; r < D; ++r) read += state[r * D + c] * t.k[i * D + r];
      const double delta = t.beta[i] * (t.v[i * D + c] - read);
      double o = 0.0;
      for (int r = 0; r < D; ++r) {
        state[r * D + c] += t.k[i * D + r] * delta;
        o += state[r * D + c] * t.q[i * D + r];
      }
      out[i * D + c] = o;
    }
  }
}

// Shared memory of one block, the kernel's layout, with every float NaN until written.
struct Block {
  std::vector<float> q, k, v, u, state, a, t, pm, b, beta;
  Block() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (auto* x : {&q, &k, &v, &u}) x->assign(dc::kTokens * dc::kRow, nan);
    state.assign(dc::kDim * dc::kRow, nan);
    for (auto* x : {&a, &t, &pm}) x->assign(dc::kTokens * dc::kSquare, nan);
    b.assign(dc::kTokens, nan);
    beta.assign(dc::kTokens, nan);
  }
  dc::View view() {
    return {q.data(), k.data(), v.data(),  u.data(), state.data(),
            a.data(), t.data(), pm.data(), b.data(), beta.data()};
  }
};

// The chunks of `sizes` through the phases; o [count, kDim] and the final state.
void emulate(const Tokens& t, const std::vector<int>& sizes, const std::vector<double>& state0,
             std::vector<double>& out, std::vector<double>& state) {
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
    for (int tid = 0; tid < dc::kThreads; ++tid) dc::a_and_pm(view, n, tid);
    for (int i = 0; i < n; ++i)
      for (int tid = 0; tid < dc::kThreads; ++tid) dc::t_row(view, n, i, tid);
    std::vector<std::array<float, dc::kRowsPerThread>> kept(dc::kThreads);
    for (int tid = 0; tid < dc::kThreads; ++tid) {
      float o[dc::kRowsPerThread];
      dc::r_and_qs(view, n, tid, o);
      std::copy(o, o + dc::kRowsPerThread, kept[tid].begin());
    }
    for (int tid = 0; tid < dc::kThreads; ++tid) dc::u_of(view, n, tid);
    for (int tid = 0; tid < dc::kThreads; ++tid) {
      float o[dc::kRowsPerThread];
      std::copy(kept[tid].begin(), kept[tid].end(), o);
      dc::outputs_and_state(view, n, tid, o);
    }
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
  // Full chunks, a short one between them (rows past n left from a full chunk), a 1-token chunk.
  const std::vector<int> sizes = {dc::kTokens, 7, dc::kTokens, 1, 20};
  int count = 0;
  for (int n : sizes) count += n;
  const Tokens t = make_tokens(7u, count);
  std::mt19937 rng(11u);
  std::normal_distribution<double> normal;
  std::vector<double> state0(static_cast<size_t>(dc::kDim) * dc::kDim);
  for (double& x : state0) x = 0.3 * normal(rng);
  std::vector<double> want_state = state0, want, got, got_state;
  recurrent(t, want_state, want);
  emulate(t, sizes, state0, got, got_state);
  EXPECT_LT(relative_error(got, want), 1e-5);
  EXPECT_LT(relative_error(got_state, want_state), 1e-5);
}

}  // namespace
