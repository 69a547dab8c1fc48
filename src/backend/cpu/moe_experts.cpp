// One routed expert's MLP for any ExpertSpec, shared by cpu-modular and cpu-fused (so their
// results agree bit for bit). Qwen3-style experts keep expert_mlp; the others (biases, the
// clamped SwiGLU, interleaved or MXFP4 storage) dequantise 64 weight rows at a time into f32 and
// run the reference GEMM over them: MXFP4 stays packed in memory. Floor: the packed weight bytes
// (0.53 bytes/param for MXFP4) streamed once per expert, plus the decode.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "tensor/mxfp4.h"

namespace sy::backend::cpu {
namespace {

float read_f32(const Tensor& t, int64_t i) {
  return t.dtype == DType::kBF16 ? bf16_to_f32(t.ptr<uint16_t>()[i]) : t.ptr<float>()[i];
}

// Expert e's matrix [out, in] as stored (`matrix` and, for MXFP4, `scales`).
struct ExpertMatrix {
  const Tensor* matrix = nullptr;
  const Tensor* scales = nullptr;
  moe::ExpertFormat format = moe::ExpertFormat::kStacked;
  int64_t expert = 0, out = 0, in = 0;

  // Row o (an output feature) in f32.
  void row(int64_t o, float* dst) const {
    switch (format) {
      case moe::ExpertFormat::kStacked:
        for (int64_t i = 0; i < in; ++i) dst[i] = read_f32(*matrix, (expert * out + o) * in + i);
        return;
      case moe::ExpertFormat::kTransposedInterleaved:  // stored [in, out]
        for (int64_t i = 0; i < in; ++i) dst[i] = read_f32(*matrix, (expert * in + i) * out + o);
        return;
      case moe::ExpertFormat::kMxfp4Interleaved: {
        const int64_t groups = in / 32;
        mxfp4_decode_row(matrix->ptr<uint8_t>() + (expert * out + o) * groups * 16,
                         scales->ptr<uint8_t>() + (expert * out + o) * groups, in, dst);
        return;
      }
    }
  }
};

// out[r, o] = x[r, :] . W[o, :] + bias[o] over W's rows dequantised a tile at a time.
void project(const float* x, int64_t rows, const ExpertMatrix& w, const float* bias, float* out,
             ThreadPool* pool) {
  constexpr int64_t kTile = 64;
  const int64_t tiles = (w.out + kTile - 1) / kTile;
  auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(kTile * w.in));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o0 = t * kTile, count = std::min(kTile, w.out - o0);
      for (int64_t o = 0; o < count; ++o) w.row(o0 + o, tile.data() + o * w.in);
      const Tensor weights(tile.data(), DType::kF32, {count, w.in});
      matmul_rows(x, w.in, rows, weights, bias ? bias + o0 : nullptr, out + o0, w.out, nullptr);
    }
  };
  if (pool)
    pool->parallel_for(tiles, 1, body);
  else
    body(0, tiles);
}

}  // namespace

std::vector<float> vector_f32(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.data ? t.numel() : 0));
  for (size_t i = 0; i < values.size(); ++i) values[i] = read_f32(t, static_cast<int64_t>(i));
  return values;
}

void expert_forward(const float* x, int64_t rows, const moe::MoeLayerWeights& w, int64_t e,
                    const moe::ExpertSpec& spec, float* out, ThreadPool* pool) {
  if (spec.is_default()) {
    expert_mlp(x, rows, w.gate(e), w.up(e), w.down_of(e), out, pool);
    return;
  }
  const int64_t inter = w.intermediate(spec.format);
  const bool interleaved = spec.format != moe::ExpertFormat::kStacked;
  // Hidden size: the down projection's output width.
  const int64_t hidden =
      spec.format == moe::ExpertFormat::kTransposedInterleaved ? w.down.dim(2) : w.down.dim(1);
  const ExpertMatrix gate_up{&w.gate_up, &w.gate_up_scales, spec.format, e, 2 * inter, hidden};
  const ExpertMatrix down{&w.down, &w.down_scales, spec.format, e, hidden, inter};
  std::vector<float> gate_up_bias, down_bias;
  if (spec.has_biases) {
    gate_up_bias.resize(static_cast<size_t>(2 * inter));
    down_bias.resize(static_cast<size_t>(hidden));
    for (int64_t i = 0; i < 2 * inter; ++i)
      gate_up_bias[i] = read_f32(w.gate_up_bias, e * 2 * inter + i);
    for (int64_t i = 0; i < hidden; ++i) down_bias[i] = read_f32(w.down_bias, e * hidden + i);
  }
  std::vector<float> projected(static_cast<size_t>(rows * 2 * inter)),
      activated(static_cast<size_t>(rows * inter));
  project(x, rows, gate_up, spec.has_biases ? gate_up_bias.data() : nullptr, projected.data(),
          pool);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gu = projected.data() + r * 2 * inter;
    float* h = activated.data() + r * inter;
    for (int64_t i = 0; i < inter; ++i) {
      float gate = interleaved ? gu[2 * i] : gu[i];
      float up = interleaved ? gu[2 * i + 1] : gu[inter + i];
      if (spec.activation == moe::ExpertActivation::kClampedSwiGlu) {
        // transformers' GptOssExperts: gate clamped above only, up both ways, and (up + 1).
        gate = std::min(gate, spec.limit);
        up = std::clamp(up, -spec.limit, spec.limit);
        h[i] = (up + 1.0f) * (gate / (1.0f + std::exp(-gate * spec.alpha)));
      } else {
        h[i] = gate / (1.0f + std::exp(-gate)) * up;
      }
    }
  }
  project(activated.data(), rows, down, spec.has_biases ? down_bias.data() : nullptr, out, pool);
}

}  // namespace sy::backend::cpu
