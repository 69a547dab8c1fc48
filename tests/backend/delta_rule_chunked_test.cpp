// The chunked form of the gated delta rule: what a DeltaNet prefill kernel on tensor cores would
// compute (a chunk's tokens as small matmuls, the state carried from chunk to chunk), checked
// against the recurrent form that the CPU and CUDA backends run token by token. Nothing in src/
// uses the chunked form yet (Qwen3.5 prefill on CUDA is still the recurrent kernel; docs/cuda.md):
// this pins the equations, and how close f32 stays, before a kernel is written on them.
//
// Per token (S: [kd, vd]; q, k: kd; v: vd; decay d and beta in (0, 1)):
//   S <- d S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q.
// Per chunk of n tokens, with b_i = sum_{j <= i} log d_j (so d_j..d_i multiply to exp(b_i -
// b_j-1)):
//   A_ij = beta_i exp(b_i - b_j) (k_i . k_j) for j < i;  T = (I + A)^-1 (forward substitution);
//   U = T R, R_i = beta_i (v_i - exp(b_i) S0^T k_i)   (U_i is token i's delta);
//   o_i = exp(b_i) S0^T q_i + sum_{j <= i} exp(b_i - b_j) (q_i . k_j) U_j;
//   S_n = exp(b_n-1) S0 + sum_j exp(b_n-1 - b_j) k_j U_j^T.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "delta_rule_reference.h"

namespace {

struct Problem {
  int tokens = 0, kd = 0, vd = 0;
  std::vector<double> q, k, v, decay, beta,
      state;  // [tokens, kd], [tokens, kd], [tokens, vd], [tokens], [tokens], [kd, vd]
};

Problem make_problem(uint32_t seed, int tokens, int kd, int vd, double min_decay) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Problem p{tokens, kd, vd, {}, {}, {}, {}, {}, {}};
  auto unit_rows = [&](std::vector<double>& x, int width, double scale) {
    x.resize(static_cast<size_t>(tokens) * width);
    for (int t = 0; t < tokens; ++t) {
      double norm = 0.0;
      for (int i = 0; i < width; ++i) norm += std::pow(x[t * width + i] = normal(rng), 2);
      for (int i = 0; i < width; ++i) x[t * width + i] *= scale / std::sqrt(norm);
    }
  };
  unit_rows(p.q, kd, 1.0 / std::sqrt(static_cast<double>(kd)));  // as the kernels scale q
  unit_rows(p.k, kd, 1.0);                                       // l2-normalised, as the model's
  p.v.resize(static_cast<size_t>(tokens) * vd);
  for (double& x : p.v) x = 2.0 * normal(rng);
  for (int t = 0; t < tokens; ++t) {
    p.decay.push_back(min_decay + (1.0 - min_decay) * uniform(rng));
    p.beta.push_back(uniform(rng));
  }
  p.state.resize(static_cast<size_t>(kd) * vd);
  for (double& x : p.state) x = 0.3 * normal(rng);
  return p;
}

// out [tokens, vd]; state updated in place.
void recurrent(const Problem& p, std::vector<double>& state, std::vector<double>& out) {
  sy::test::delta_rule_recurrence(p.tokens, p.kd, p.vd, p.q, p.k, p.v, p.decay, p.beta, state, out);
}

// The chunked form in precision F, chunks of `chunk` tokens (the last one shorter).
template <typename F>
void chunked(const Problem& p, int chunk, std::vector<double>& state_out,
             std::vector<double>& out) {
  const int kd = p.kd, vd = p.vd;
  std::vector<F> S(p.state.begin(), p.state.end());
  out.assign(static_cast<size_t>(p.tokens) * vd, 0.0);
  for (int t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int n = std::min(chunk, p.tokens - t0);
    auto q = [&](int i, int d) { return static_cast<F>(p.q[(t0 + i) * kd + d]); };
    auto k = [&](int i, int d) { return static_cast<F>(p.k[(t0 + i) * kd + d]); };
    auto v = [&](int i, int c) { return static_cast<F>(p.v[(t0 + i) * vd + c]); };
    std::vector<F> b(n), beta(n);
    F sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += std::log(static_cast<F>(p.decay[t0 + i]));
      b[i] = sum;
      beta[i] = static_cast<F>(p.beta[t0 + i]);
    }
    auto dot_kk = [&](int i, int j) {
      F s = 0;
      for (int d = 0; d < kd; ++d) s += k(i, d) * k(j, d);
      return s;
    };
    // T = (I + A)^-1, lower triangular with a unit diagonal: row i = e_i - sum_{j<i} A_ij T_j.
    std::vector<F> A(static_cast<size_t>(n) * n, 0), T(static_cast<size_t>(n) * n, 0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) A[i * n + j] = beta[i] * std::exp(b[i] - b[j]) * dot_kk(i, j);
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c <= i; ++c) {
        F x = i == c ? F{1} : F{0};
        for (int j = c; j < i; ++j) x -= A[i * n + j] * T[j * n + c];
        T[i * n + c] = x;
      }
    }
    // R_i = beta_i (v_i - exp(b_i) S0^T k_i), U = T R.
    std::vector<F> R(static_cast<size_t>(n) * vd), U(static_cast<size_t>(n) * vd, 0);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < vd; ++c) {
        F read = 0;
        for (int d = 0; d < kd; ++d) read += S[d * vd + c] * k(i, d);
        R[i * vd + c] = beta[i] * (v(i, c) - std::exp(b[i]) * read);
      }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j)
        for (int c = 0; c < vd; ++c) U[i * vd + c] += T[i * n + j] * R[j * vd + c];
    // o_i = exp(b_i) S0^T q_i + sum_{j <= i} exp(b_i - b_j) (q_i . k_j) U_j.
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < vd; ++c) {
        F o = 0;
        for (int d = 0; d < kd; ++d) o += S[d * vd + c] * q(i, d);
        o *= std::exp(b[i]);
        for (int j = 0; j <= i; ++j) {
          F qk = 0;
          for (int d = 0; d < kd; ++d) qk += q(i, d) * k(j, d);
          o += std::exp(b[i] - b[j]) * qk * U[j * vd + c];
        }
        out[(t0 + i) * vd + c] = static_cast<double>(o);
      }
    // S_n = exp(b_n-1) S0 + sum_j exp(b_n-1 - b_j) k_j U_j^T.
    for (int d = 0; d < kd; ++d)
      for (int c = 0; c < vd; ++c) {
        F x = std::exp(b[n - 1]) * S[d * vd + c];
        for (int j = 0; j < n; ++j) x += std::exp(b[n - 1] - b[j]) * k(j, d) * U[j * vd + c];
        S[d * vd + c] = x;
      }
  }
  state_out.assign(S.begin(), S.end());
}

// max |a - b| / max |b|.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

struct Case {
  int tokens, kd, vd, chunk;
  double min_decay;
};

TEST(DeltaRuleChunked, EqualsRecurrentInDouble) {
  // Chunks of 1 (the recurrent form itself), several whole chunks, a short last chunk, decays
  // near 1 and strong ones (exp(b_i - b_j) far below 1 within a chunk).
  for (const Case& c :
       {Case{40, 8, 12, 1, 0.5}, Case{150, 16, 24, 64, 0.5}, Case{150, 16, 24, 16, 0.9},
        Case{97, 12, 8, 32, 0.01}, Case{64, 32, 32, 64, 0.999}}) {
    const Problem p = make_problem(1234u + static_cast<uint32_t>(c.tokens * c.chunk), c.tokens,
                                   c.kd, c.vd, c.min_decay);
    std::vector<double> state = p.state, out, chunk_state, chunk_out;
    recurrent(p, state, out);
    chunked<double>(p, c.chunk, chunk_state, chunk_out);
    SCOPED_TRACE(testing::Message() << "tokens " << c.tokens << " kd " << c.kd << " vd " << c.vd
                                    << " chunk " << c.chunk << " min decay " << c.min_decay);
    EXPECT_LT(relative_error(chunk_out, out), 1e-12);
    EXPECT_LT(relative_error(chunk_state, state), 1e-12);
  }
}

TEST(DeltaRuleChunked, FloatStaysCloseToTheExactRecurrence) {
  // Qwen3.5's head shape, chunks of 64 as a kernel would take them: the f32 chunked form against
  // the double recurrence, within the op harness's DeltaNet tolerance (1e-4) with room to spare.
  const Problem p = make_problem(99u, 200, 128, 128, 0.05);
  std::vector<double> state = p.state, out, chunk_state, chunk_out;
  recurrent(p, state, out);
  chunked<float>(p, 64, chunk_state, chunk_out);
  EXPECT_LT(relative_error(chunk_out, out), 1e-5);
  EXPECT_LT(relative_error(chunk_state, state), 1e-5);
}

}  // namespace
