// The op-vs-reference harness (like llama.cpp's test-backend-ops): every op of the CUDA backend
// run against the CPU backend through backend::Backend on the same random inputs, one
// PASS/FAIL line per case. This header is the framework the suites (tests/cuda/*.cpp) share.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "moe/experts_kernel.h"

namespace sy::harness {

using backend::Backend;

struct Options {
  uint64_t seed = 0;
  std::vector<std::string> filters;  // substrings of "op desc"; a case runs if any matches
  std::vector<std::string> excludes;  // ... and none of these does
  bool quick = false;
  std::string json_path;
  int threads = 0;
  // The CPU backend stands in for the device (CUDA kernel names map to the CPU ones): checks
  // the harness itself on a machine without a GPU; every case should pass exactly.
  bool reference_as_device = false;
};

// A counter-free splitmix64 stream: fast enough for hundreds of millions of values.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t x = (state_ += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  float uniform(float lo, float hi) { return lo + static_cast<float>(uniform()) * (hi - lo); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // inclusive
  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  template <typename T>
  void shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[static_cast<size_t>(below(static_cast<int64_t>(i)))]);
  }

 private:
  uint64_t state_;
};

uint64_t hash_text(uint64_t seed, std::string_view text);

// Uniform in [-scale, scale): activations.
std::vector<float> random_floats(Rng& rng, int64_t count, float scale);
// count distinct values from [0, n), in random order.
std::vector<int32_t> distinct_ids(Rng& rng, int64_t count, int64_t n);

// How far `out` is from `ref`, viewed as rows of `width`: relative L2 error (global and worst
// row), max abs error, max |error| / row rms, non-finite values where the reference is finite.
struct Metrics {
  double rel = 0, max_abs = 0, worst_row_rel = 0, worst_elem = 0;
  int64_t worst_row = -1;
  int64_t nonfinite = 0, first_nonfinite = -1;  // out NaN/Inf where ref is finite (poison left)
  int64_t ref_nonfinite = 0;
  int64_t elements = 0;
  int64_t width = 1;
};
// row_mask (optional, one per row): rows to compare.
Metrics compare(const float* out, const float* ref, int64_t n, int64_t width,
                const std::vector<uint8_t>* row_mask = nullptr);
inline Metrics compare(const std::vector<float>& out, const std::vector<float>& ref, int64_t width,
                       const std::vector<uint8_t>* row_mask = nullptr) {
  if (out.size() != ref.size()) throw std::runtime_error("compare: sizes differ");
  return compare(out.data(), ref.data(), static_cast<int64_t>(out.size()), width, row_mask);
}

// One case's findings: compared outputs (each within its tolerance), failures, notes.
class Case {
 public:
  explicit Case(uint64_t seed) : rng(seed) {}
  Rng rng;

  // Passes when rel <= tol, worst row <= 3 tol, worst element <= 20 tol (of its row's rms), and
  // nothing is NaN/Inf that the reference has finite. tol 0: exactly equal.
  void check(std::string_view what, const Metrics& m, double tol);
  // Passes when every |out - ref| <= atol + rtol |ref| (values with their own scale: logprobs).
  void check_close(std::string_view what, const std::vector<float>& out, const std::vector<float>& ref,
                   double atol, double rtol);
  void fail(std::string message);
  void info(std::string message);
  void skip(std::string reason);
  // A failure when !condition; returns condition.
  bool expect(bool condition, const std::string& message) {
    if (!condition) fail(message);
    return condition;
  }

  struct Check {
    std::string what;
    Metrics m;
    double tol = 0;
    bool pass = true;
    double ratio = 0;  // how far past its tolerance (> 1: failed)
  };
  bool failed() const { return !failures_.empty(); }
  bool skipped() const { return skipped_; }
  const std::vector<Check>& checks() const { return checks_; }
  const std::vector<std::string>& failures() const { return failures_; }
  const std::vector<std::string>& infos() const { return infos_; }
  const std::string& skip_reason() const { return skip_reason_; }
  // The check closest to (or furthest past) its tolerance: what the line reports.
  const Check* headline() const;

 private:
  std::vector<Check> checks_;
  std::vector<std::string> failures_, infos_;
  bool skipped_ = false;
  std::string skip_reason_;
};

class Harness {
 public:
  Harness(const Options& options, Backend& cpu, Backend& device);
  ~Harness();
  const Options& options;
  Backend& cpu;
  Backend& device;  // the CUDA backend (or the CPU one with --reference-as-device)
  moe::ExpertsKernelRegistry cpu_kernels, device_kernels;  // each backend's register_kernels
  // Kernel names on the device backend ("cuda-modular" -> "cpu-modular" under self-test).
  std::string device_kernel(const std::string& cuda_name) const;

  bool selected(std::string_view op, std::string_view desc) const;
  // Runs `body` as the case "op desc" (if selected) and prints its line. The case's random
  // stream is seeded from the run seed and the case's name, so --filter reruns it exactly.
  void run(std::string_view op, const std::string& desc, const std::function<void(Case&)>& body);
  // Prints the summary ("N passed, M failed"), writes the JSON; returns the exit code.
  int finish();
  uint64_t seed_for(std::string_view name) const { return hash_text(options.seed, name); }

 private:
  void write_json() const;
  struct State;
  std::unique_ptr<State> state_;
};

// Buffers of one backend for one case, freed when it ends.
class Buffers {
 public:
  explicit Buffers(Backend& backend) : backend_(backend) {}
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  Tensor alloc(DType dtype, const std::vector<int64_t>& shape);
  Tensor f32(const std::vector<float>& host, const std::vector<int64_t>& shape);
  Tensor i32(const std::vector<int32_t>& host, const std::vector<int64_t>& shape);
  Tensor u8(const std::vector<uint8_t>& host, const std::vector<int64_t>& shape);
  // load_weight / load_stacked; throws (the case fails) on an error status.
  Tensor weight(const Tensor& host);
  Tensor stacked(const std::vector<Tensor>& parts);
  // NaN bit patterns over the whole buffer (fill_i32 on an int32 view), so an element the op
  // does not write fails the comparison.
  void poison(const Tensor& tensor);
  void zero(const Tensor& tensor);
  Backend& backend() { return backend_; }

 private:
  Backend& backend_;
  std::vector<Tensor> owned_;
};

// The same host data on both backends.
struct Both {
  Tensor cpu, dev;
};
class Pair {
 public:
  explicit Pair(Harness& h) : cpu(h.cpu), dev(h.device) {}
  Buffers cpu, dev;
  Both alloc(DType dtype, const std::vector<int64_t>& shape) { return {cpu.alloc(dtype, shape), dev.alloc(dtype, shape)}; }
  Both f32(const std::vector<float>& host, const std::vector<int64_t>& shape) {
    return {cpu.f32(host, shape), dev.f32(host, shape)};
  }
  Both i32(const std::vector<int32_t>& host, const std::vector<int64_t>& shape) {
    return {cpu.i32(host, shape), dev.i32(host, shape)};
  }
  Both u8(const std::vector<uint8_t>& host, const std::vector<int64_t>& shape) {
    return {cpu.u8(host, shape), dev.u8(host, shape)};
  }
  Both weight(const Tensor& host) { return {cpu.weight(host), dev.weight(host)}; }
  // An f32 output, poisoned on both.
  Both output(const std::vector<int64_t>& shape) {
    Both out = alloc(DType::kF32, shape);
    cpu.poison(out.cpu);
    dev.poison(out.dev);
    return out;
  }
};

inline constexpr int32_t kNanPoison = 0x7fc07fc0;  // NaN as f32, and as both bf16 halves

Tensor with_shape(Tensor tensor, const std::vector<int64_t>& shape);
int64_t numel_of(const std::vector<int64_t>& shape);
std::string shape_text(const std::vector<int64_t>& shape);
// Download as f32 (f32, bf16 and f16 tensors).
std::vector<float> to_host(Backend& backend, const Tensor& tensor);
std::vector<int32_t> to_host_i32(Backend& backend, const Tensor& tensor);
std::vector<uint8_t> to_host_bytes(Backend& backend, const Tensor& tensor);

// Host memory behind a Tensor view (weights are loaded from it; the CPU backend keeps views of
// bf16/f32 host tensors, so it must outlive the case).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor view;
  HostTensor() = default;
  HostTensor(DType dtype, const std::vector<int64_t>& shape);
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(const HostTensor&) = delete;
  float at(int64_t i) const;  // as f32
};
// offset + uniform [-scale, scale) from (seed, index) via the CPU backend's fill_random (all
// threads); f16 is generated as f32 and converted.
HostTensor host_random(Backend& cpu, DType dtype, const std::vector<int64_t>& shape, uint64_t seed,
                       float scale, float offset = 0.0f);

// Suites (one file each).
void run_basic_ops(Harness& h);
void run_weight_ops(Harness& h);
void run_attention_ops(Harness& h);
void run_sampling_ops(Harness& h);
void run_linear_ops(Harness& h);
void run_moe_ops(Harness& h);
void run_graph_ops(Harness& h);
// `invariant`: a second device backend made with BackendOptions::batch_invariant (reserved).
void run_invariance_ops(Harness& h, Backend& invariant);

}  // namespace sy::harness
