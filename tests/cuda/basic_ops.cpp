// Weight loading, fills, and the element-wise / row-wise ops and GEMMs of the forward pass.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "backend/random_fill.h"
#include "harness.h"

namespace sy::harness {
namespace {

constexpr float kEps = 1e-6f;
constexpr double kF32Tol = 1e-5;   // pure f32 element-wise / row-wise ops
constexpr double kGemmTol = 1e-2;  // CUDA GEMMs round activations to bf16

const char* dtype_text(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    default: return "?";
  }
}

// `value` as it reads back from a tensor of dtype `d`.
float rounded_to(DType d, float value) {
  if (d == DType::kBF16) return bf16_to_f32(f32_to_bf16(value));
  if (d == DType::kF16) return f16_to_f32(f32_to_f16(value));
  return value;
}

// Checks a loaded weight against the host data it came from: the shape is kept and every
// value reads back as the host value rounded to the loaded dtype.
void check_loaded(Case& c, Backend& backend, const char* who, const Tensor& loaded, const HostTensor& host,
                  const std::vector<int64_t>& expected_shape) {
  std::vector<int64_t> got(loaded.shape.begin(), loaded.shape.begin() + loaded.rank);
  if (got != expected_shape) {
    c.fail(fmt::format("{}: shape {} expected {}", who, shape_text(got), shape_text(expected_shape)));
    return;
  }
  if (loaded.dtype != DType::kF32 && loaded.dtype != DType::kBF16 && loaded.dtype != DType::kF16) {
    c.fail(fmt::format("{}: loaded as {}, not a float type", who, dtype_name(loaded.dtype)));
    return;
  }
  const std::vector<float> values = to_host(backend, loaded);
  std::vector<float> expected(values.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = rounded_to(loaded.dtype, host.at(static_cast<int64_t>(i)));
  c.check(fmt::format("{} ({})", who, dtype_text(loaded.dtype)), compare(values, expected, expected_shape.back()), 0.0);
}

void load_weight_cases(Harness& h) {
  const std::vector<std::vector<int64_t>> shapes = {{200}, {72, 200}, {4, 16, 8}};
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const auto& shape : shapes) {
      h.run("load_weight", fmt::format("{} {}", dtype_text(dtype), shape_text(shape)), [&](Case& c) {
        HostTensor host = host_random(h.cpu, dtype, shape, c.rng.next(), 2.0f, 0.5f);
        Pair p(h);
        Both w = p.weight(host.view);
        check_loaded(c, h.cpu, "cpu", w.cpu, host, shape);
        check_loaded(c, h.device, "device", w.dev, host, shape);
        c.info(fmt::format("device keeps {}", dtype_text(w.dev.dtype)));
      });
    }
  }
}

void load_stacked_cases(Harness& h) {
  struct Shape {
    DType dtype;
    int64_t parts;
    std::vector<int64_t> part_shape;
  };
  const std::vector<Shape> shapes = {{DType::kBF16, 5, {72, 200}}, {DType::kF32, 3, {200}},
                                     {DType::kF16, 4, {16, 8}}, {DType::kF32, 2, {8, 16}},
                                     {DType::kBF16, 12, {144, 200}}};
  for (const Shape& s : shapes) {
    h.run("load_stacked", fmt::format("{} {}x{}", dtype_text(s.dtype), s.parts, shape_text(s.part_shape)), [&](Case& c) {
      std::vector<HostTensor> parts;
      std::vector<Tensor> views;
      std::vector<int64_t> stacked_shape = {s.parts};
      stacked_shape.insert(stacked_shape.end(), s.part_shape.begin(), s.part_shape.end());
      HostTensor all(s.dtype, stacked_shape);  // the expected stack, for check_loaded
      const size_t part_bytes = static_cast<size_t>(numel_of(s.part_shape)) * dtype_size(s.dtype);
      for (int64_t i = 0; i < s.parts; ++i) {
        parts.push_back(host_random(h.cpu, s.dtype, s.part_shape, c.rng.next(), 1.0f));
        views.push_back(parts.back().view);
        std::memcpy(all.bytes.data() + static_cast<size_t>(i) * part_bytes, parts.back().bytes.data(), part_bytes);
      }
      Pair p(h);
      Tensor cpu_stack = p.cpu.stacked(views);
      Tensor dev_stack = p.dev.stacked(views);
      check_loaded(c, h.cpu, "cpu", cpu_stack, all, stacked_shape);
      check_loaded(c, h.device, "device", dev_stack, all, stacked_shape);
      c.info(fmt::format("device keeps {}", dtype_text(dev_stack.dtype)));
    });
  }
}

void fill_i32_cases(Harness& h) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}}) {
    h.run("fill_i32", fmt::format("n={}", n), [&](Case& c) {
      const int32_t a = static_cast<int32_t>(c.rng.next()), b = static_cast<int32_t>(c.rng.next());
      Buffers dev(h.device);
      Tensor t = dev.alloc(DType::kI32, {n});
      dev.poison(t);
      h.device.fill_i32(t, a);
      std::vector<int32_t> expected(static_cast<size_t>(n), a);
      // Then a slice in the middle: nothing outside it may change.
      const int64_t begin = n > 2 ? c.rng.between(1, n / 2) : 0, count = n > 2 ? c.rng.between(1, n - begin - 1) : n;
      Tensor slice = t.slice_rows(begin, count);
      h.device.fill_i32(slice, b);
      std::fill_n(expected.begin() + begin, count, b);
      const std::vector<int32_t> got = to_host_i32(h.device, t);
      int64_t wrong = 0, first = -1;
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != expected[i] && wrong++ == 0) first = static_cast<int64_t>(i);
      std::vector<float> agree(got.size()), ones(got.size(), 1.0f);
      for (size_t i = 0; i < got.size(); ++i) agree[i] = got[i] == expected[i] ? 1.0f : 0.0f;
      c.check("values", compare(agree, ones, n), 0.0);
      if (wrong) c.fail(fmt::format("{} of {} wrong (first at {}: {} expected {})", wrong, n, first, got[first], expected[first]));
      c.info(fmt::format("slice [{}, {})", begin, begin + count));
    });
  }
}

void fill_random_cases(Harness& h) {
  struct Shape {
    DType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Shape> shapes = {{DType::kF32, {1}},       {DType::kF32, {7}},   {DType::kF32, {1000003}},
                                     {DType::kBF16, {333, 72}}, {DType::kBF16, {4097}}, {DType::kF32, {2048, 600}},
                                     {DType::kBF16, {1000003}}};
  for (const Shape& s : shapes) {
    h.run("fill_random", fmt::format("{} {}", dtype_text(s.dtype), shape_text(s.shape)), [&](Case& c) {
      const uint64_t seed = c.rng.next();
      const float scale = c.rng.uniform(0.01f, 2.0f), offset = c.rng.below(2) ? c.rng.uniform(-1.0f, 1.0f) : 0.0f;
      Pair p(h);
      Both t = p.alloc(s.dtype, s.shape);
      p.cpu.poison(t.cpu);
      p.dev.poison(t.dev);
      h.cpu.fill_random(t.cpu, seed, scale, offset);
      h.device.fill_random(t.dev, seed, scale, offset);
      const std::vector<uint8_t> dev_bytes = to_host_bytes(h.device, t.dev), cpu_bytes = to_host_bytes(h.cpu, t.cpu);
      const size_t elem = dtype_size(s.dtype);
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < dev_bytes.size() / elem; ++i)
        if (std::memcmp(&dev_bytes[i * elem], &cpu_bytes[i * elem], elem) && differ++ == 0) first = static_cast<int64_t>(i);
      c.check("values", compare(to_host(h.device, t.dev), to_host(h.cpu, t.cpu), s.shape.back()), 0.0);
      if (differ) c.fail(fmt::format("{} elements differ bitwise (first #{})", differ, first));
      // The CPU itself against the shared definition (backend/random_fill.h).
      const float v0 = backend::random_fill_value(seed, 0, scale, offset);
      const float cpu0 = to_host(h.cpu, t.cpu)[0];
      if (cpu0 != rounded_to(s.dtype, v0)) c.fail(fmt::format("cpu element 0 is {}, random_fill_value gives {}", cpu0, v0));
    });
  }
}

// Packed (U8) random weights: every byte equal on both backends and to random_fill_byte.
void fill_random_bytes_cases(Harness& h) {
  for (const int64_t n : {int64_t{1}, int64_t{4097}, int64_t{3000017}}) {
    for (const bool scales : {false, true}) {
      h.run("fill_random_bytes", fmt::format("n={} {}", n, scales ? "scales" : "blocks"),
            [&](Case& c) {
              const uint64_t seed = c.rng.next();
              const int lo = scales ? 117 : 0;
              const float span = scales ? 3.999f : 255.999f;
              Pair p(h);
              Both t = p.alloc(DType::kU8, {n});
              p.cpu.poison(t.cpu);
              p.dev.poison(t.dev);
              h.cpu.fill_random_bytes(t.cpu, seed, lo, span);
              h.device.fill_random_bytes(t.dev, seed, lo, span);
              const std::vector<uint8_t> dev = to_host_bytes(h.device, t.dev),
                                         cpu = to_host_bytes(h.cpu, t.cpu);
              int64_t differ = 0, wrong = 0, first = -1;
              for (size_t i = 0; i < cpu.size(); ++i) {
                if (dev[i] != cpu[i] && differ++ == 0) first = static_cast<int64_t>(i);
                if (cpu[i] != backend::random_fill_byte(seed, i, lo, span)) ++wrong;
              }
              if (differ)
                c.fail(fmt::format("{} bytes differ from the CPU's (first #{})", differ, first));
              if (wrong) c.fail(fmt::format("{} CPU bytes differ from random_fill_byte", wrong));
              const int top = lo + static_cast<int>(span);
              if (!cpu.empty() && (*std::min_element(cpu.begin(), cpu.end()) < lo ||
                                   *std::max_element(cpu.begin(), cpu.end()) > top))
                c.fail(fmt::format("bytes outside [{}, {}]", lo, top));
            });
    }
  }
}

void embedding_cases(Harness& h) {
  struct Shape {
    int64_t vocab, hidden, tokens;
  };
  std::vector<Shape> shapes = {{1000, 8, 1}, {5000, 72, 17}, {32000, 200, 300}, {2000, 2048, 1000}};
  shapes.push_back(h.options.quick ? Shape{32000, 2048, 100} : Shape{151936, 2048, 100});
  for (const Shape& s : shapes) {
    h.run("embedding", fmt::format("vocab={} hidden={} T={}", s.vocab, s.hidden, s.tokens), [&](Case& c) {
      HostTensor table = host_random(h.cpu, DType::kBF16, {s.vocab, s.hidden}, c.rng.next(), 1.0f);
      std::vector<int32_t> ids(static_cast<size_t>(s.tokens));
      for (int32_t& id : ids) id = static_cast<int32_t>(c.rng.below(s.vocab));
      ids.front() = 0;
      if (s.tokens > 1) ids.back() = static_cast<int32_t>(s.vocab - 1);
      Pair p(h);
      Both w = p.weight(table.view);
      Both id = p.i32(ids, {s.tokens});
      Both out = p.output({s.tokens, s.hidden});
      h.cpu.embedding(w.cpu, id.cpu, out.cpu);
      h.device.embedding(w.dev, id.dev, out.dev);
      c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), s.hidden), 0.0);
    });
  }
}

void rms_norm_cases(Harness& h) {
  struct Shape {
    std::vector<int64_t> x;  // the last dim is the normed width
    DType weight;
    bool in_place;
    float scale;
  };
  std::vector<Shape> shapes = {{{1, 8}, DType::kBF16, false, 1.0f},        {{3, 200}, DType::kF32, false, 1.0f},
                               {{17, 2048}, DType::kBF16, false, 1.0f},    {{300, 328}, DType::kBF16, false, 50.0f},
                               {{100, 32, 128}, DType::kBF16, true, 1.0f}, {{17, 6, 200}, DType::kF32, false, 3.0f},
                               {{7, 2048}, DType::kBF16, true, 0.01f},     {{1000, 72}, DType::kBF16, false, 1.0f}};
  if (!h.options.quick) shapes.push_back({{1000, 4096}, DType::kBF16, false, 1.0f});
  for (const Shape& s : shapes) {
    const int64_t width = s.x.back();
    h.run("rms_norm", fmt::format("x={} w={}{}", shape_text(s.x), dtype_text(s.weight), s.in_place ? " in-place" : ""),
          [&](Case& c) {
            HostTensor weight = host_random(h.cpu, s.weight, {width}, c.rng.next(), 0.5f, 1.0f);
            const std::vector<float> x = random_floats(c.rng, numel_of(s.x), s.scale);
            Pair p(h);
            Both w = p.weight(weight.view);
            Both xt = p.f32(x, s.x);
            if (s.in_place) {
              h.cpu.rms_norm(xt.cpu, w.cpu, kEps, xt.cpu);
              h.device.rms_norm(xt.dev, w.dev, kEps, xt.dev);
              c.check("x", compare(to_host(h.device, xt.dev), to_host(h.cpu, xt.cpu), width), kF32Tol);
            } else {
              Both out = p.output(s.x);
              h.cpu.rms_norm(xt.cpu, w.cpu, kEps, out.cpu);
              h.device.rms_norm(xt.dev, w.dev, kEps, out.dev);
              c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), width), kF32Tol);
              c.check("x unchanged", compare(to_host(h.device, xt.dev), x, width), 0.0);
            }
          });
  }
}

void add_rms_norm_cases(Harness& h) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 2048}, {7, 200}, {300, 2048}, {1000, 72}, {33, 4096}};
  for (auto [rows, width] : shapes) {
    h.run("add_rms_norm", fmt::format("rows={} width={}", rows, width), [&](Case& c) {
      HostTensor weight = host_random(h.cpu, DType::kBF16, {width}, c.rng.next(), 0.5f, 1.0f);
      const std::vector<float> x = random_floats(c.rng, rows * width, 1.0f), delta = random_floats(c.rng, rows * width, 2.0f);
      Pair p(h);
      Both w = p.weight(weight.view);
      Both xt = p.f32(x, {rows, width}), dt = p.f32(delta, {rows, width});
      Both out = p.output({rows, width});
      h.cpu.add_rms_norm(xt.cpu, dt.cpu, w.cpu, kEps, out.cpu);
      h.device.add_rms_norm(xt.dev, dt.dev, w.dev, kEps, out.dev);
      c.check("x", compare(to_host(h.device, xt.dev), to_host(h.cpu, xt.cpu), width), kF32Tol);
      c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), width), kF32Tol);
    });
    // With an earlier delta (the decoder's post-attention step after a pending feed-forward
    // output): one launch on the device, the CPU's two adds then the norm.
    h.run("add2_rms_norm", fmt::format("rows={} width={}", rows, width), [&](Case& c) {
      HostTensor weight = host_random(h.cpu, DType::kBF16, {width}, c.rng.next(), 0.5f, 1.0f);
      const std::vector<float> x = random_floats(c.rng, rows * width, 1.0f),
                               earlier = random_floats(c.rng, rows * width, 3.0f),
                               delta = random_floats(c.rng, rows * width, 2.0f);
      Pair p(h);
      Both w = p.weight(weight.view);
      Both xt = p.f32(x, {rows, width}), et = p.f32(earlier, {rows, width}),
           dt = p.f32(delta, {rows, width});
      Both out = p.output({rows, width});
      h.cpu.add2_rms_norm(xt.cpu, et.cpu, dt.cpu, w.cpu, kEps, out.cpu);
      h.device.add2_rms_norm(xt.dev, et.dev, dt.dev, w.dev, kEps, out.dev);
      c.check("x", compare(to_host(h.device, xt.dev), to_host(h.cpu, xt.cpu), width), kF32Tol);
      c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), width), kF32Tol);
    });
  }
}

void matmul_cases(Harness& h) {
  struct Shape {
    int64_t rows, in, out;
    int bias;          // 0 none, 1 f32, 2 bf16
    int64_t head_dim;  // > 0: out viewed as [rows, out / head_dim, head_dim] (q/k/v projections)
  };
  std::vector<Shape> shapes;
  if (h.options.quick) {
    shapes = {{1, 200, 2048, 0, 0},   {3, 2048, 200, 2, 0},     {17, 328, 72, 0, 0}, {64, 200, 1200, 1, 200},
              {300, 2048, 2048, 1, 0}, {1000, 72, 8, 2, 0},     {1, 2048, 151936, 0, 0},
              {8, 2048, 328, 1, 0},    {9, 328, 2048, 0, 0}};
  } else {
    shapes = {{1, 200, 2048, 0, 0},     {1, 2048, 4096, 1, 0},  {3, 2048, 200, 2, 0},    {17, 328, 72, 0, 0},
              {64, 200, 1200, 1, 200},  {100, 2048, 4096, 0, 0}, {300, 4096, 2048, 1, 0}, {1000, 2048, 328, 0, 0},
              {1000, 72, 8, 2, 0},      {33, 4096, 512, 0, 128}, {5, 2048, 151936, 0, 0},
              // Both sides of the device's switch from GEMV to GEMM (8 rows on CUDA).
              {8, 2048, 328, 1, 0},     {9, 328, 2048, 0, 0}};
    // Two more from the run's seed; rows bounded so the CPU reference stays fast.
    Rng rng(h.seed_for("matmul shapes"));
    for (int i = 0; i < 2; ++i) {
      const int64_t in = 8 * rng.between(1, 512), out = 8 * rng.between(1, 512);
      const int64_t rows = rng.between(1, std::min<int64_t>(1000, std::max<int64_t>(1, 2000000000 / (in * out))));
      shapes.push_back({rows, in, out, static_cast<int>(rng.below(3)), 0});
    }
  }
  for (const Shape& s : shapes) {
    const char* bias_text[] = {"", " bias=f32", " bias=bf16"};
    h.run("matmul", fmt::format("rows={} in={} out={}{}{}", s.rows, s.in, s.out, bias_text[s.bias],
                                s.head_dim ? fmt::format(" out=[{},{},{}]", s.rows, s.out / s.head_dim, s.head_dim) : ""),
          [&](Case& c) {
            HostTensor weight = host_random(h.cpu, DType::kBF16, {s.out, s.in}, c.rng.next(), std::sqrt(3.0f / s.in));
            HostTensor bias;
            if (s.bias) bias = host_random(h.cpu, s.bias == 1 ? DType::kF32 : DType::kBF16, {s.out}, c.rng.next(), 0.5f);
            const std::vector<float> x = random_floats(c.rng, s.rows * s.in, 1.0f);
            Pair p(h);
            Both w = p.weight(weight.view);
            Both b;
            if (s.bias) b = p.weight(bias.view);
            Both xt = p.f32(x, {s.rows, s.in});
            Both out = p.output(s.head_dim ? std::vector<int64_t>{s.rows, s.out / s.head_dim, s.head_dim}
                                           : std::vector<int64_t>{s.rows, s.out});
            h.cpu.matmul(xt.cpu, w.cpu, s.bias ? &b.cpu : nullptr, out.cpu);
            h.device.matmul(xt.dev, w.dev, s.bias ? &b.dev : nullptr, out.dev);
            c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), s.out), kGemmTol);
          });
  }
}

// Several weights over one x (the attention's q/k/v): each part must equal matmul's result,
// whether the device runs them as one launch (small rows; f32 biases in the GEMV's epilogue), as
// GEMMs over x rounded to bf16 once (large rows), or falls back per part.
void matmul_parts_cases(Harness& h) {
  struct Shape {
    int64_t rows, in;
    std::vector<int64_t> outs;
    int biased_part;  // -1: none
  };
  const std::vector<Shape> shapes = {
      {1, 2048, {4096, 512, 512}, -1}, {3, 2048, {4096, 512, 512}, -1},
      {8, 328, {200, 72, 8}, -1},      {1, 4096, {2048}, -1},
      {5, 200, {16, 24, 8, 40}, -1},   {2, 200, {16, 24, 8, 40, 56}, -1},
      {4, 328, {200, 72, 8}, 1},       {9, 2048, {4096, 512, 512}, -1},
      {40, 328, {200, 72, 8}, 2},      {1, 2048, {512, 512, 1}, -1},
      {4, 2048, {512, 512, 1}, -1},    {300, 2048, {512, 512, 1}, 0},
      {77, 200, {16, 24, 8, 40}, 3}};
  for (const Shape& s : shapes) {
    std::string outs;
    for (int64_t o : s.outs) outs += fmt::format("{}{}", outs.empty() ? "" : ",", o);
    h.run("matmul_parts", fmt::format("rows={} in={} outs={}{}", s.rows, s.in, outs,
                                      s.biased_part >= 0 ? fmt::format(" bias on part {}", s.biased_part) : ""),
          [&](Case& c) {
            const std::vector<float> x = random_floats(c.rng, s.rows * s.in, 1.0f);
            Pair p(h);
            Both xt = p.f32(x, {s.rows, s.in});
            std::vector<HostTensor> weights, biases;
            std::vector<Both> w, b, out;
            for (size_t i = 0; i < s.outs.size(); ++i) {
              weights.push_back(host_random(h.cpu, DType::kBF16, {s.outs[i], s.in}, c.rng.next(), std::sqrt(3.0f / s.in)));
              w.push_back(p.weight(weights.back().view));
              if (static_cast<int>(i) == s.biased_part) {
                biases.push_back(host_random(h.cpu, DType::kF32, {s.outs[i]}, c.rng.next(), 0.5f));
                b.push_back(p.weight(biases.back().view));
              } else {
                b.push_back({});
              }
              out.push_back(p.output({s.rows, s.outs[i]}));
            }
            std::vector<Backend::MatmulPart> cpu_parts, dev_parts;
            for (size_t i = 0; i < s.outs.size(); ++i) {
              const bool biased = static_cast<int>(i) == s.biased_part;
              cpu_parts.push_back({&w[i].cpu, biased ? &b[i].cpu : nullptr, &out[i].cpu});
              dev_parts.push_back({&w[i].dev, biased ? &b[i].dev : nullptr, &out[i].dev});
            }
            h.cpu.matmul_parts(xt.cpu, cpu_parts);
            h.device.matmul_parts(xt.dev, dev_parts);
            // A part narrower than 8 (a shared expert's 1-wide gate) is compared against its whole
            // output's scale: a row of one dot product has no rms of its own, and the GEMM rounds x
            // to bf16 (~2e-3 of a unit-scale output), which a near-zero value cannot absorb.
            for (size_t i = 0; i < s.outs.size(); ++i)
              c.check(fmt::format("out{}", i),
                      compare(to_host(h.device, out[i].dev), to_host(h.cpu, out[i].cpu),
                              s.outs[i] < 8 ? s.rows * s.outs[i] : s.outs[i]),
                      kGemmTol);
          });
  }
}

// The residual add + input norm fused into the q/k/v GEMV (one row): bitwise the device's own
// add_rms_norm then matmul_parts, near the CPU's, x left as it was (a biased part: gpt-oss's
// q/k/v). Where the device declines (more rows, an odd width) the case says so and checks
// nothing else.
void norm_matmul_parts_cases(Harness& h) {
  struct Shape {
    int64_t rows, in;
    std::vector<int64_t> outs;
    bool delta;
    bool expect_fused;
    int biased_part = -1;  // -1: none
  };
  const std::vector<Shape> shapes = {{1, 2048, {4096, 512, 512}, true, true},
                                     {1, 2048, {4096, 512, 512}, false, true},
                                     {1, 4096, {1000}, true, true},
                                     {1, 200, {16, 24, 8, 40}, true, true},
                                     {1, 2880, {72, 8}, true, true},
                                     {1, 8192, {300}, true, true},
                                     {2, 2048, {512}, true, false},
                                     {1, 204, {64}, true, false},
                                     {1, 2880, {4096, 512, 512}, true, true, 0},
                                     {1, 200, {16, 24, 8, 40}, false, true, 3}};
  for (const Shape& s : shapes) {
    std::string outs;
    for (int64_t o : s.outs) outs += fmt::format("{}{}", outs.empty() ? "" : ",", o);
    h.run("norm_matmul_parts",
          fmt::format("rows={} in={} outs={}{}{}", s.rows, s.in, outs, s.delta ? " +delta" : "",
                      s.biased_part >= 0 ? fmt::format(" bias on part {}", s.biased_part) : ""),
          [&](Case& c) {
            const std::vector<float> x = random_floats(c.rng, s.rows * s.in, 1.0f);
            const std::vector<float> d = random_floats(c.rng, s.rows * s.in, 2.0f);
            Pair p(h);
            Both xt = p.f32(x, {s.rows, s.in}), dt = p.f32(d, {s.rows, s.in});
            HostTensor norm_host = host_random(h.cpu, DType::kF32, {s.in}, c.rng.next(), 1.0f);
            Both norm = p.weight(norm_host.view);
            std::vector<HostTensor> weights;
            std::vector<Both> w, fused, unfused;
            for (int64_t o : s.outs) {
              weights.push_back(host_random(h.cpu, DType::kBF16, {o, s.in}, c.rng.next(), std::sqrt(3.0f / s.in)));
              w.push_back(p.weight(weights.back().view));
              fused.push_back(p.output({s.rows, o}));
              unfused.push_back(p.output({s.rows, o}));
            }
            HostTensor bias_host;
            std::optional<Both> bias;
            if (s.biased_part >= 0) {
              bias_host =
                  host_random(h.cpu, DType::kF32, {s.outs[static_cast<size_t>(s.biased_part)]},
                              c.rng.next(), 0.5f);
              bias = p.weight(bias_host.view);
            }
            std::vector<Backend::MatmulPart> fused_parts, unfused_parts, cpu_parts;
            for (size_t i = 0; i < s.outs.size(); ++i) {
              const bool biased = static_cast<int>(i) == s.biased_part;
              fused_parts.push_back({&w[i].dev, biased ? &bias->dev : nullptr, &fused[i].dev});
              unfused_parts.push_back({&w[i].dev, biased ? &bias->dev : nullptr, &unfused[i].dev});
              cpu_parts.push_back({&w[i].cpu, biased ? &bias->cpu : nullptr, &unfused[i].cpu});
            }
            const bool did = h.device.norm_matmul_parts(xt.dev, s.delta ? &dt.dev : nullptr, norm.dev, 1e-6f, fused_parts);
            const bool expect = s.expect_fused && !h.options.reference_as_device;  // the CPU never fuses
            if (!c.expect(did == expect, fmt::format("fused: {}, expected {}", did, expect)) || !did)
              return;
            c.check("x unchanged", compare(to_host(h.device, xt.dev), x, s.in), 0.0);
            // The unfused sequence on both backends (the device's x and normed are written here).
            Both normed = p.output({s.rows, s.in});
            for (Backend* b : {&h.device, &h.cpu}) {
              Tensor& xb = b == &h.cpu ? xt.cpu : xt.dev;
              Tensor& nb = b == &h.cpu ? normed.cpu : normed.dev;
              Tensor& db = b == &h.cpu ? dt.cpu : dt.dev;
              if (s.delta)
                b->add_rms_norm(xb, db, b == &h.cpu ? norm.cpu : norm.dev, 1e-6f, nb);
              else
                b->rms_norm(xb, b == &h.cpu ? norm.cpu : norm.dev, 1e-6f, nb);
              b->matmul_parts(nb, b == &h.cpu ? cpu_parts : unfused_parts);
            }
            for (size_t i = 0; i < s.outs.size(); ++i) {
              const std::vector<float> got = to_host(h.device, fused[i].dev);
              c.check(fmt::format("out{} = unfused", i), compare(got, to_host(h.device, unfused[i].dev), s.outs[i]), 0.0);
              c.check(fmt::format("out{} ~ cpu", i), compare(got, to_host(h.cpu, unfused[i].cpu), s.outs[i]), kGemmTol);
            }
          });
  }
}

void add_inplace_cases(Harness& h) {
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {17, 200}, {1000, 2048}}) {
    h.run("add_inplace", fmt::format("rows={} width={}", rows, width), [&](Case& c) {
      const std::vector<float> x = random_floats(c.rng, rows * width, 1.0f), y = random_floats(c.rng, rows * width, 3.0f);
      Pair p(h);
      Both xt = p.f32(x, {rows, width}), yt = p.f32(y, {rows, width});
      h.cpu.add_inplace(xt.cpu, yt.cpu);
      h.device.add_inplace(xt.dev, yt.dev);
      c.check("x", compare(to_host(h.device, xt.dev), to_host(h.cpu, xt.cpu), width), kF32Tol);
    });
  }
}

void add_sigmoid_gated_cases(Harness& h) {
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {17, 72}, {300, 2048}}) {
    h.run("add_sigmoid_gated", fmt::format("rows={} width={}", rows, width), [&](Case& c) {
      const std::vector<float> x = random_floats(c.rng, rows * width, 1.0f), y = random_floats(c.rng, rows * width, 3.0f);
      std::vector<float> gate = random_floats(c.rng, rows, 6.0f);
      gate[0] = -100.0f;  // exp overflows: the gate is 0
      Pair p(h);
      Both xt = p.f32(x, {rows, width}), yt = p.f32(y, {rows, width}), gt = p.f32(gate, {rows, 1});
      h.cpu.add_sigmoid_gated(xt.cpu, yt.cpu, gt.cpu);
      h.device.add_sigmoid_gated(xt.dev, yt.dev, gt.dev);
      c.check("out", compare(to_host(h.device, xt.dev), to_host(h.cpu, xt.cpu), width), kF32Tol);
    });
  }
}

void silu_mul_cases(Harness& h) {
  struct Shape {
    int64_t rows, width;
    bool in_place;  // out = gate, as the decoder calls it
  };
  for (const Shape& s : std::vector<Shape>{{1, 8, false}, {17, 768, false}, {300, 2048, false}, {33, 200, true}}) {
    h.run("silu_mul", fmt::format("rows={} width={}{}", s.rows, s.width, s.in_place ? " in-place" : ""), [&](Case& c) {
      std::vector<float> gate = random_floats(c.rng, s.rows * s.width, 8.0f);
      const std::vector<float> up = random_floats(c.rng, s.rows * s.width, 2.0f);
      // The tails of silu: exp overflows for -100, saturates for +100.
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = -30.0f;
      gate[3] = 0.0f;
      Pair p(h);
      Both g = p.f32(gate, {s.rows, s.width}), u = p.f32(up, {s.rows, s.width});
      if (s.in_place) {
        h.cpu.silu_mul(g.cpu, u.cpu, g.cpu);
        h.device.silu_mul(g.dev, u.dev, g.dev);
        c.check("gate", compare(to_host(h.device, g.dev), to_host(h.cpu, g.cpu), s.width), kF32Tol);
      } else {
        Both out = p.output({s.rows, s.width});
        h.cpu.silu_mul(g.cpu, u.cpu, out.cpu);
        h.device.silu_mul(g.dev, u.dev, out.dev);
        c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), s.width), kF32Tol);
      }
    });
  }
}

// A shared expert's end (silu·mul, down projection, sigmoid-gated or plain add into the routed
// output): the device's fused GEMV (decode rows) bitwise its own three ops, near the CPU's;
// steps past the GEMV's rows and widths not a multiple of 8 take the three ops.
void shared_expert_down_cases(Harness& h) {
  struct Shape {
    int64_t rows, width, hidden;
    bool gated;
  };
  const std::vector<Shape> shapes = {
      {1, 512, 2048, true}, {3, 512, 2048, true}, {8, 1408, 2048, false}, {1, 200, 72, true},
      {5, 2816, 512, true}, {17, 512, 256, true}, {2, 20, 24, false}};
  for (const Shape& s : shapes) {
    h.run("shared_expert_down",
          fmt::format("rows={} width={} hidden={}{}", s.rows, s.width, s.hidden,
                      s.gated ? " gated" : ""),
          [&](Case& c) {
            std::vector<float> gate = random_floats(c.rng, s.rows * s.width, 6.0f);
            gate[0] = -100.0f;  // silu's tails
            if (gate.size() > 1) gate[1] = 100.0f;
            const std::vector<float> up = random_floats(c.rng, s.rows * s.width, 2.0f);
            std::vector<float> logit = random_floats(c.rng, s.rows, 6.0f);
            logit[0] = -100.0f;  // exp overflows: the gate is 0
            const std::vector<float> routed = random_floats(c.rng, s.rows * s.hidden, 1.0f);
            Pair p(h);
            const HostTensor w_host = host_random(h.cpu, DType::kBF16, {s.hidden, s.width},
                                                  c.rng.next(), std::sqrt(3.0f / s.width));
            Both w = p.weight(w_host.view), u = p.f32(up, {s.rows, s.width}),
                 lg = p.f32(logit, {s.rows, 1});
            Both g_fused = p.f32(gate, {s.rows, s.width}), g_ops = p.f32(gate, {s.rows, s.width});
            Both out_fused = p.f32(routed, {s.rows, s.hidden}),
                 out_ops = p.f32(routed, {s.rows, s.hidden});
            Both scratch = p.output({s.rows, s.hidden});
            h.cpu.add_shared_expert_down(g_fused.cpu, u.cpu, w.cpu, s.gated ? &lg.cpu : nullptr,
                                         scratch.cpu, out_fused.cpu);
            h.device.add_shared_expert_down(g_fused.dev, u.dev, w.dev, s.gated ? &lg.dev : nullptr,
                                            scratch.dev, out_fused.dev);
            h.device.Backend::add_shared_expert_down(
                g_ops.dev, u.dev, w.dev, s.gated ? &lg.dev : nullptr, scratch.dev, out_ops.dev);
            const std::vector<float> got = to_host(h.device, out_fused.dev);
            c.check("out = the three ops", compare(got, to_host(h.device, out_ops.dev), s.hidden),
                    0.0);
            c.check("out ~ cpu", compare(got, to_host(h.cpu, out_fused.cpu), s.hidden), kGemmTol);
          });
  }
}

void rope_cases(Harness& h) {
  struct Shape {
    int64_t tokens, heads, kv_heads, head_dim, max_position;
    int64_t rotary = 0;  // partial rotary: the dims that turn (0: all)
    bool yarn = false;   // the spec's own frequencies and attention factor
  };
  const std::vector<Shape> shapes = {{1, 32, 4, 128, 40000},       {17, 8, 8, 64, 40000},
                                     {300, 6, 2, 200, 40000},      {100, 16, 4, 80, 40000},
                                     {33, 4, 1, 256, 2048},        {1000, 8, 2, 128, 40000},
                                     {17, 8, 8, 64, 40000, 32},    {33, 4, 2, 20, 4000, 10},
                                     {64, 8, 2, 64, 40000, 0, true}, {5, 5, 1, 24, 300, 0, true},
                                     {40, 4, 2, 18, 4000}};
  for (const Shape& s : shapes) {
    h.run("rope", fmt::format("T={} heads={}/{} head_dim={} positions<={} theta=1e6{}{}", s.tokens, s.heads, s.kv_heads,
                              s.head_dim, s.max_position, s.rotary ? fmt::format(" rotary={}", s.rotary) : "",
                              s.yarn ? " yarn" : ""),
          [&](Case& c) {
            std::vector<int32_t> positions(static_cast<size_t>(s.tokens));
            for (int32_t& pos : positions) pos = static_cast<int32_t>(c.rng.between(0, s.max_position));
            positions.front() = 0;
            if (s.tokens > 1) positions.back() = static_cast<int32_t>(s.max_position);
            const std::vector<float> q = random_floats(c.rng, s.tokens * s.heads * s.head_dim, 1.0f);
            const std::vector<float> k = random_floats(c.rng, s.tokens * s.kv_heads * s.head_dim, 1.0f);
            Pair p(h);
            Both pos = p.i32(positions, {s.tokens});
            Both seq = p.i32(std::vector<int32_t>(static_cast<size_t>(s.tokens), 0), {s.tokens});
            Both slots = p.i32(std::vector<int32_t>(static_cast<size_t>(s.tokens), -1), {s.tokens});
            Both tables = p.i32({0}, {1, 1});
            auto batch_of = [&](const Tensor& ps, const Tensor& sq, const Tensor& sl, const Tensor& tb) {
              backend::AttentionBatch b;
              b.positions = ps;
              b.token_seq = sq;
              b.slot_mapping = sl;
              b.block_tables = tb;
              b.max_query_len = s.tokens;
              b.max_context_len = *std::max_element(positions.begin(), positions.end()) + 1;
              return b;
            };
            const backend::AttentionBatch cb = batch_of(pos.cpu, seq.cpu, slots.cpu, tables.cpu);
            const backend::AttentionBatch db = batch_of(pos.dev, seq.dev, slots.dev, tables.dev);
            backend::RopeSpec spec{1e6, s.rotary ? s.rotary : s.head_dim};
            // YaRN-like frequencies: decreasing, some of them scaled down, and a factor != 1.
            std::vector<float> inv_freq(static_cast<size_t>(s.head_dim / 2));
            for (size_t i = 0; i < inv_freq.size(); ++i)
              inv_freq[i] = static_cast<float>(std::pow(1e4, -2.0 * static_cast<double>(i) / static_cast<double>(s.head_dim)) /
                                               (i >= inv_freq.size() / 2 ? 8.0 : 1.0));
            if (s.yarn) {
              spec.inv_freq = inv_freq.data();
              spec.attention_factor = 1.2079f;
            }
            Both qt = p.f32(q, {s.tokens, s.heads, s.head_dim}), kt = p.f32(k, {s.tokens, s.kv_heads, s.head_dim});
            h.cpu.rope(qt.cpu, cb, spec);
            h.device.rope(qt.dev, db, spec);
            h.cpu.rope(kt.cpu, cb, spec);
            h.device.rope(kt.dev, db, spec);
            const Metrics mq = compare(to_host(h.device, qt.dev), to_host(h.cpu, qt.cpu), s.heads * s.head_dim);
            c.check("q", mq, kF32Tol);
            c.check("k", compare(to_host(h.device, kt.dev), to_host(h.cpu, kt.cpu), s.kv_heads * s.head_dim), kF32Tol);
            if (c.failed() && mq.worst_row >= 0) {
              // One f32 rounding of the angle at position p moves it by up to p * 2^-24 rad: an
              // implementation that does not compute inv_freq and the angle as the CPU does
              // (inv_freq = float(1 / theta^(2i/d)) in double, angle = float(p) * inv_freq in
              // f32, accurate sin/cos) differs by about that much.
              c.info(fmt::format("worst q row: token {} at position {}; f32 angle noise at that position ~{:.1e} rad",
                                 mq.worst_row, positions[static_cast<size_t>(mq.worst_row)],
                                 positions[static_cast<size_t>(mq.worst_row)] * 5.96e-8));
            }
          });
  }
}

void gather_rows_cases(Harness& h) {
  struct Shape {
    int64_t rows, width, picked;
  };
  for (const Shape& s : std::vector<Shape>{{1, 8, 1}, {300, 2048, 17}, {1000, 200, 1000}, {5, 72, 64}}) {
    h.run("gather_rows", fmt::format("x=[{},{}] picked={}", s.rows, s.width, s.picked), [&](Case& c) {
      const std::vector<float> x = random_floats(c.rng, s.rows * s.width, 1.0f);
      std::vector<int32_t> index(static_cast<size_t>(s.picked));
      for (int32_t& r : index) r = static_cast<int32_t>(c.rng.below(s.rows));
      index.front() = static_cast<int32_t>(s.rows - 1);
      Pair p(h);
      Both xt = p.f32(x, {s.rows, s.width});
      Both it = p.i32(index, {s.picked});
      Both out = p.output({s.picked, s.width});
      h.cpu.gather_rows(xt.cpu, it.cpu, out.cpu);
      h.device.gather_rows(xt.dev, it.dev, out.dev);
      c.check("out", compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), s.width), 0.0);
    });
  }
}

}  // namespace

void run_weight_ops(Harness& h) {
  fill_i32_cases(h);
  fill_random_cases(h);
  fill_random_bytes_cases(h);
  load_weight_cases(h);
  load_stacked_cases(h);
}

void run_basic_ops(Harness& h) {
  embedding_cases(h);
  rms_norm_cases(h);
  add_rms_norm_cases(h);
  add_inplace_cases(h);
  silu_mul_cases(h);
  rope_cases(h);
  add_sigmoid_gated_cases(h);
  shared_expert_down_cases(h);
  gather_rows_cases(h);
  matmul_cases(h);
  matmul_parts_cases(h);
  norm_matmul_parts_cases(h);
}

}  // namespace sy::harness
