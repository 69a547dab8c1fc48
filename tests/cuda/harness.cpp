#include "harness.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

namespace sy::harness {
namespace {

// The case in progress, for the crash handler: a device error aborts the process (CudaContext
// has no way back), and the line that says which case did it is the most useful output then.
// A signal handler can only reach a global; nothing else in the harness is global.
char g_running[768] = "";

void on_crash(int signal_number) {
  const char* head = "\nCRASH (signal) during case: ";
  ssize_t ignored = write(STDERR_FILENO, head, std::strlen(head));
  ignored = write(STDERR_FILENO, g_running, std::strlen(g_running));
  ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string sci(double value) {
  if (std::isinf(value)) return "inf";
  if (std::isnan(value)) return "nan";
  return fmt::format("{:.1e}", value);
}

// A row may be this many times the global tolerance off, one element this many times of its
// row's rms: rounding noise spreads (the largest of ~10^6 bf16-rounded attention outputs reaches
// ~5 tol), while an unwritten or wrong element is off by about 1 rms.
constexpr double kRowFactor = 3, kElemFactor = 20;

// How far past its tolerance a check is (> 1: failed).
double tolerance_ratio(const Case::Check& c) {
  auto part = [&](double value, double limit) {
    if (limit <= 0) return value > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    return value / limit;
  };
  double r = std::max({part(c.m.rel, c.tol), part(c.m.worst_row_rel, kRowFactor * c.tol),
                       part(c.m.worst_elem, kElemFactor * c.tol)});
  if (c.m.nonfinite || c.m.ref_nonfinite) r = std::numeric_limits<double>::infinity();
  return r;
}

}  // namespace

uint64_t hash_text(uint64_t seed, std::string_view text) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  Rng mix(h);
  return mix.next();
}

std::vector<float> random_floats(Rng& rng, int64_t count, float scale) {
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = rng.uniform(-scale, scale);
  return values;
}

std::vector<int32_t> distinct_ids(Rng& rng, int64_t count, int64_t n) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < count; ++i) std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(i + rng.below(n - i))]);
  all.resize(static_cast<size_t>(count));
  return all;
}

Metrics compare(const float* out, const float* ref, int64_t n, int64_t width,
                const std::vector<uint8_t>* row_mask) {
  Metrics m;
  if (width <= 0) width = std::max<int64_t>(n, 1);
  const int64_t rows = n / width;
  std::vector<double> row_diff2(static_cast<size_t>(rows), 0.0), row_ref2(static_cast<size_t>(rows), 0.0),
      row_max(static_cast<size_t>(rows), 0.0);
  double diff2 = 0, ref2 = 0;
  int64_t compared_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (row_mask && !(*row_mask)[static_cast<size_t>(r)]) continue;
    ++compared_rows;
    for (int64_t i = r * width; i < (r + 1) * width; ++i) {
      const double o = out[i], e = ref[i];
      ++m.elements;
      if (!std::isfinite(e)) {
        ++m.ref_nonfinite;
        continue;
      }
      if (!std::isfinite(o)) {
        if (m.nonfinite++ == 0) m.first_nonfinite = i;
        continue;
      }
      const double d = std::abs(o - e);
      row_diff2[static_cast<size_t>(r)] += d * d;
      row_ref2[static_cast<size_t>(r)] += e * e;
      row_max[static_cast<size_t>(r)] = std::max(row_max[static_cast<size_t>(r)], d);
    }
    diff2 += row_diff2[static_cast<size_t>(r)];
    ref2 += row_ref2[static_cast<size_t>(r)];
    m.max_abs = std::max(m.max_abs, row_max[static_cast<size_t>(r)]);
  }
  m.rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  // Rows whose reference is (nearly) zero are measured against the typical row instead.
  const double floor_norm = compared_rows ? 1e-3 * std::sqrt(ref2 / static_cast<double>(compared_rows)) : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    if (row_mask && !(*row_mask)[static_cast<size_t>(r)]) continue;
    const double norm = std::max(std::sqrt(row_ref2[static_cast<size_t>(r)]), floor_norm);
    const double d = std::sqrt(row_diff2[static_cast<size_t>(r)]);
    const double row_rel = norm > 0 ? d / norm : (d > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    const double rms = norm / std::sqrt(static_cast<double>(width));
    const double elem = rms > 0 ? row_max[static_cast<size_t>(r)] / rms
                                : (row_max[static_cast<size_t>(r)] > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    if (row_rel > m.worst_row_rel || m.worst_row < 0) {
      if (row_rel > m.worst_row_rel) m.worst_row = r;
      m.worst_row_rel = std::max(m.worst_row_rel, row_rel);
    }
    m.worst_elem = std::max(m.worst_elem, elem);
  }
  m.width = width;
  return m;
}

void Case::check(std::string_view what, const Metrics& m, double tol) {
  Check c{std::string(what), m, tol, true, 0.0};
  c.ratio = tolerance_ratio(c);
  std::vector<std::string> why;
  if (m.nonfinite)
    why.push_back(fmt::format("{} NaN/Inf where the reference is finite (first at row {} col {})", m.nonfinite,
                              m.first_nonfinite / m.width, m.first_nonfinite % m.width));
  if (m.ref_nonfinite) why.push_back(fmt::format("{} NaN/Inf in the CPU reference", m.ref_nonfinite));
  if (m.rel > tol) why.push_back(fmt::format("rel {} > {}", sci(m.rel), sci(tol)));
  if (m.worst_row_rel > kRowFactor * tol)
    why.push_back(fmt::format("row {} rel {} > {}", m.worst_row, sci(m.worst_row_rel), sci(kRowFactor * tol)));
  if (m.worst_elem > kElemFactor * tol)
    why.push_back(fmt::format("an element off by {} of its row's rms > {}", sci(m.worst_elem), sci(kElemFactor * tol)));
  if (!why.empty()) {
    c.pass = false;
    std::string text = std::string(what) + ": ";
    for (size_t i = 0; i < why.size(); ++i) text += (i ? ", " : "") + why[i];
    failures_.push_back(text);
  }
  checks_.push_back(std::move(c));
}

void Case::check_close(std::string_view what, const std::vector<float>& out, const std::vector<float>& ref,
                       double atol, double rtol) {
  if (out.size() != ref.size()) {
    fail(fmt::format("{}: {} values, the reference has {}", what, out.size(), ref.size()));
    return;
  }
  Check c{std::string(what), compare(out, ref, 1), atol, true, 0.0};
  int64_t bad = 0, worst = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    const double limit = atol + rtol * std::abs(static_cast<double>(ref[i]));
    const double d = std::abs(static_cast<double>(out[i]) - ref[i]);
    const double r = std::isfinite(d) ? d / limit : std::numeric_limits<double>::infinity();
    if (!(r <= 1.0)) ++bad;
    if (!(r <= c.ratio)) {
      c.ratio = r;
      worst = static_cast<int64_t>(i);
    }
  }
  if (bad) {
    c.pass = false;
    failures_.push_back(fmt::format("{}: {} of {} values off by more than {} + {}|ref| (worst #{}: {} vs {})", what, bad,
                                    out.size(), sci(atol), sci(rtol), worst, out[static_cast<size_t>(worst)],
                                    ref[static_cast<size_t>(worst)]));
  }
  checks_.push_back(std::move(c));
}

void Case::fail(std::string message) { failures_.push_back(std::move(message)); }
void Case::info(std::string message) { infos_.push_back(std::move(message)); }
void Case::skip(std::string reason) {
  skipped_ = true;
  skip_reason_ = std::move(reason);
}

const Case::Check* Case::headline() const {
  const Check* best = nullptr;
  double best_ratio = -1;
  for (const Check& c : checks_) {
    const double r = c.ratio;
    if (r > best_ratio) {
      best = &c;
      best_ratio = r;
    }
  }
  return best;
}

struct Harness::State {
  nlohmann::json cases = nlohmann::json::array();
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failed_names;
  double started_s = 0;
};

Harness::Harness(const Options& opts, Backend& cpu_backend, Backend& device_backend)
    : options(opts), cpu(cpu_backend), device(device_backend), state_(std::make_unique<State>()) {
  state_->started_s = now_s();
  cpu.register_kernels(cpu_kernels);
  device.register_kernels(device_kernels);
  for (int s : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(s, on_crash);
}

Harness::~Harness() = default;

std::string Harness::device_kernel(const std::string& cuda_name) const {
  if (!options.reference_as_device) return cuda_name;
  if (cuda_name.rfind("cuda-", 0) == 0) return "cpu-" + cuda_name.substr(5);
  return cuda_name;
}

bool Harness::selected(std::string_view op, std::string_view desc) const {
  const std::string name = std::string(op) + " " + std::string(desc);
  for (const std::string& x : options.excludes)
    if (name.find(x) != std::string::npos) return false;
  if (options.filters.empty()) return true;
  for (const std::string& f : options.filters)
    if (name.find(f) != std::string::npos) return true;
  return false;
}

void Harness::run(std::string_view op, const std::string& desc, const std::function<void(Case&)>& body) {
  if (!selected(op, desc)) return;
  const std::string name = std::string(op) + " " + desc;
  std::snprintf(g_running, sizeof g_running, "%s (seed %llu)", name.c_str(),
                static_cast<unsigned long long>(options.seed));
  Case c(seed_for(name));
  const double start = now_s();
  try {
    body(c);
  } catch (const std::exception& error) {
    c.fail(std::string("exception: ") + error.what());
  }
  const double elapsed_ms = (now_s() - start) * 1e3;
  g_running[0] = '\0';

  const Case::Check* head = c.headline();
  // Poison left in the output (or NaN produced) reads as nan, whatever the finite part says.
  const bool nan = head && (head->m.nonfinite || head->m.ref_nonfinite);
  const std::string numbers = !head ? std::string("rel=- maxabs=-")
                              : nan ? std::string("rel=nan maxabs=nan")
                                    : fmt::format("rel={} maxabs={}", sci(head->m.rel), sci(head->m.max_abs));
  std::string line;
  const char* status = "pass";
  if (c.skipped() && !c.failed()) {
    status = "skip";
    ++state_->skipped;
    line = fmt::format("SKIP {} ({})", name, c.skip_reason());
  } else {
    const bool failed = c.failed();
    if (failed) {
      status = "fail";
      ++state_->failed;
      state_->failed_names.push_back(std::string(op));
    } else {
      ++state_->passed;
    }
    line = fmt::format("{} {} {} (seed {})", failed ? "FAIL" : "PASS", name, numbers, options.seed);
    if (failed) {
      line += ":";
      for (size_t i = 0; i < c.failures().size(); ++i) line += (i ? "; " : " ") + c.failures()[i];
    }
  }
  if (!c.infos().empty()) {
    line += " |";
    for (size_t i = 0; i < c.infos().size(); ++i) line += (i ? "; " : " ") + c.infos()[i];
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  nlohmann::json record = {{"op", std::string(op)}, {"desc", desc}, {"status", status},
                           {"seed", options.seed}, {"time_ms", elapsed_ms},
                           {"failures", c.failures()}, {"info", c.infos()}};
  // JSON has no inf/nan: those go as strings.
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(fmt::format("{}", v)); };
  if (head) {
    record["rel"] = nan ? nlohmann::json("nan") : number(head->m.rel);
    record["max_abs"] = nan ? nlohmann::json("nan") : number(head->m.max_abs);
  }
  if (c.skipped()) record["skip_reason"] = c.skip_reason();
  nlohmann::json checks = nlohmann::json::array();
  for (const Case::Check& k : c.checks()) {
    const auto& finite = number;
    checks.push_back({{"what", k.what}, {"pass", k.pass}, {"tol", k.tol}, {"rel", finite(k.m.rel)},
                      {"max_abs", finite(k.m.max_abs)}, {"worst_row_rel", finite(k.m.worst_row_rel)},
                      {"worst_row", k.m.worst_row}, {"worst_elem", finite(k.m.worst_elem)},
                      {"nonfinite", k.m.nonfinite}, {"ref_nonfinite", k.m.ref_nonfinite},
                      {"elements", k.m.elements}});
  }
  record["checks"] = checks;
  state_->cases.push_back(std::move(record));
  // Rewritten after every case: a crash later still leaves the cases before it on disk.
  write_json();
}

void Harness::write_json() const {
  if (options.json_path.empty()) return;
  nlohmann::json doc = {{"seed", options.seed},
                        {"quick", options.quick},
                        {"device", device.name()},
                        {"passed", state_->passed},
                        {"failed", state_->failed},
                        {"skipped", state_->skipped},
                        {"elapsed_s", now_s() - state_->started_s},
                        {"cases", state_->cases}};
  std::ofstream file(options.json_path);
  file << doc.dump(1) << "\n";
}

int Harness::finish() {
  write_json();
  const double elapsed = now_s() - state_->started_s;
  if (state_->skipped) std::printf("%d skipped (not counted)\n", state_->skipped);
  if (state_->failed) {
    std::vector<std::string> ops = state_->failed_names;
    std::sort(ops.begin(), ops.end());
    ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
    std::string list;
    for (const std::string& op : ops) list += (list.empty() ? "" : ",") + op;
    std::printf("rerun the failures: --seed %llu --filter %s\n",
                static_cast<unsigned long long>(options.seed), list.c_str());
  }
  std::printf("elapsed %.1f s\n", elapsed);
  std::printf("%d passed, %d failed\n", state_->passed, state_->failed);
  std::fflush(stdout);
  return state_->failed ? 1 : 0;
}

// ---- buffers and host tensors ----

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

Tensor with_shape(Tensor tensor, const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(Tensor::kMaxRank)) throw std::runtime_error("rank too high");
  tensor.rank = static_cast<int>(shape.size());
  tensor.shape = {};
  for (size_t i = 0; i < shape.size(); ++i) tensor.shape[i] = shape[i];
  return tensor;
}

Buffers::~Buffers() {
  for (Tensor& t : owned_) backend_.free_buffer(t);
}

Tensor Buffers::alloc(DType dtype, const std::vector<int64_t>& shape) {
  const int64_t n = numel_of(shape);
  Tensor t = backend_.alloc(dtype, {std::max<int64_t>(n, 1)});
  if (!t.data) throw std::runtime_error(fmt::format("{}: alloc {} {} failed", backend_.name(), dtype_name(dtype), shape_text(shape)));
  owned_.push_back(t);
  return with_shape(t, shape);
}

Tensor Buffers::f32(const std::vector<float>& host, const std::vector<int64_t>& shape) {
  if (static_cast<int64_t>(host.size()) != numel_of(shape)) throw std::runtime_error("f32 upload: size mismatch");
  Tensor t = alloc(DType::kF32, shape);
  backend_.upload(host.data(), t);
  return t;
}

Tensor Buffers::i32(const std::vector<int32_t>& host, const std::vector<int64_t>& shape) {
  if (static_cast<int64_t>(host.size()) != numel_of(shape)) throw std::runtime_error("i32 upload: size mismatch");
  Tensor t = alloc(DType::kI32, shape);
  backend_.upload(host.data(), t);
  return t;
}

Tensor Buffers::u8(const std::vector<uint8_t>& host, const std::vector<int64_t>& shape) {
  if (static_cast<int64_t>(host.size()) != numel_of(shape)) throw std::runtime_error("u8 upload: size mismatch");
  Tensor t = alloc(DType::kU8, shape);
  backend_.upload(host.data(), t);
  return t;
}

Tensor Buffers::weight(const Tensor& host) {
  Result<Tensor> loaded = backend_.load_weight(host);
  if (!loaded) throw std::runtime_error(fmt::format("{} load_weight({} {}): {}", backend_.name(), dtype_name(host.dtype),
                                                    host.shape_string(), loaded.message()));
  if (loaded->data != host.data) owned_.push_back(*loaded);  // a view of `host` is not ours to free
  return *loaded;
}

Tensor Buffers::stacked(const std::vector<Tensor>& parts) {
  Result<Tensor> loaded = backend_.load_stacked(parts);
  if (!loaded) throw std::runtime_error(fmt::format("{} load_stacked: {}", backend_.name(), loaded.message()));
  owned_.push_back(*loaded);
  return *loaded;
}

namespace {
Tensor as_i32_words(const Tensor& tensor) {
  if (tensor.nbytes() % 4) throw std::runtime_error("poison: buffer size is not a multiple of 4 bytes");
  Tensor words = tensor;
  words.dtype = DType::kI32;
  words.rank = 1;
  words.shape = {static_cast<int64_t>(tensor.nbytes() / 4), 0, 0, 0};
  return words;
}
}  // namespace

void Buffers::poison(const Tensor& tensor) {
  if (tensor.nbytes() % 4 == 0) {
    Tensor words = as_i32_words(tensor);
    backend_.fill_i32(words, kNanPoison);
    return;
  }
  // An odd number of 16-bit elements: upload the pattern instead.
  std::vector<uint8_t> pattern(tensor.nbytes());
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(static_cast<uint32_t>(kNanPoison) >> (8 * (i % 4)));
  Tensor target = tensor;
  backend_.upload(pattern.data(), target);
}

void Buffers::zero(const Tensor& tensor) {
  Tensor words = as_i32_words(tensor);
  backend_.fill_i32(words, 0);
}

std::vector<float> to_host(Backend& backend, const Tensor& tensor) {
  const size_t n = static_cast<size_t>(tensor.numel());
  std::vector<float> out(n);
  if (tensor.dtype == DType::kF32) {
    backend.download(tensor, out.data());
  } else if (tensor.dtype == DType::kBF16 || tensor.dtype == DType::kF16) {
    std::vector<uint16_t> raw(n);
    backend.download(tensor, raw.data());
    for (size_t i = 0; i < n; ++i) out[i] = tensor.dtype == DType::kBF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
  } else {
    throw std::runtime_error(fmt::format("to_host: dtype {} is not a float type", dtype_name(tensor.dtype)));
  }
  return out;
}

std::vector<int32_t> to_host_i32(Backend& backend, const Tensor& tensor) {
  if (tensor.dtype != DType::kI32) throw std::runtime_error("to_host_i32: not an int32 tensor");
  std::vector<int32_t> out(static_cast<size_t>(tensor.numel()));
  backend.download(tensor, out.data());
  return out;
}

std::vector<uint8_t> to_host_bytes(Backend& backend, const Tensor& tensor) {
  std::vector<uint8_t> out(tensor.nbytes());
  backend.download(tensor, out.data());
  return out;
}

HostTensor::HostTensor(DType dtype, const std::vector<int64_t>& shape) {
  const int64_t n = numel_of(shape);
  bytes.resize(static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dtype));
  view = with_shape(Tensor(bytes.data(), dtype, {n}), shape);
}

float HostTensor::at(int64_t i) const {
  switch (view.dtype) {
    case DType::kF32: return view.ptr<float>()[i];
    case DType::kBF16: return bf16_to_f32(view.ptr<uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(view.ptr<uint16_t>()[i]);
    default: throw std::runtime_error("HostTensor::at: not a float type");
  }
}

HostTensor host_random(Backend& cpu, DType dtype, const std::vector<int64_t>& shape, uint64_t seed, float scale,
                       float offset) {
  HostTensor host(dtype, shape);
  if (dtype == DType::kF16) {
    HostTensor staging(DType::kF32, shape);
    cpu.fill_random(staging.view, seed, scale, offset);
    for (int64_t i = 0; i < host.view.numel(); ++i)
      host.view.ptr<uint16_t>()[i] = f32_to_f16(staging.view.ptr<float>()[i]);
  } else {
    cpu.fill_random(host.view, seed, scale, offset);
  }
  return host;
}

}  // namespace sy::harness
