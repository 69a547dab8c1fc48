// The gated delta rule token by token in double, the recurrence the backends run, for the tests
// of its chunked form. Per token (state S [kd, vd]): S <- decay S; delta = beta (v - S^T k);
// S <- S + k delta^T; o = S^T q.
#pragma once

#include <cstddef>
#include <vector>

namespace sy::test {

// q, k [tokens, kd]; v [tokens, vd]; decay, beta [tokens]; out [tokens, vd]; state updated in
// place.
inline void delta_rule_recurrence(int tokens, int kd, int vd, const std::vector<double>& q,
                                  const std::vector<double>& k, const std::vector<double>& v,
                                  const std::vector<double>& decay, const std::vector<double>& beta,
                                  std::vector<double>& state, std::vector<double>& out) {
  out.assign(static_cast<size_t>(tokens) * vd, 0.0);
  for (int t = 0; t < tokens; ++t) {
    for (double& x : state) x *= decay[t];
    for (int c = 0; c < vd; ++c) {
      double read = 0.0;
      for (int i = 0; i < kd; ++i) read += state[i * vd + c] * k[t * kd + i];
      const double delta = beta[t] * (v[t * vd + c] - read);
      double o = 0.0;
      for (int i = 0; i < kd; ++i) {
        state[i * vd + c] += k[t * kd + i] * delta;
        o += state[i * vd + c] * q[t * kd + i];
      }
      out[t * vd + c] = o;
    }
  }
}

}  // namespace sy::test
