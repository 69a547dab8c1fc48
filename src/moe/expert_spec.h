// ExpertSpec: how a model's routed experts compute (activation, biases) and how their tensors are
// stored (stacked bf16, gpt-oss's interleaved layouts, MXFP4 blocks). Kernels read the experts as
// stored and refuse at start-up a spec they do not implement (ExpertsKernel::supports_experts).
#pragma once

namespace sy::moe {

// How a layer's experts compute and how their tensors are stored; the kernels read them as
// stored (MXFP4 stays packed). The default is Qwen3-MoE's: SwiGLU, no biases, bf16/f32 gate rows
// then up rows.
enum class ExpertActivation {
  kSwiGlu,         // silu(gate) * up
  kClampedSwiGlu,  // gpt-oss: g = min(gate, limit), u = clamp(up, +-limit); (u + 1) * g *
                   // sigmoid(alpha g)
};
enum class ExpertFormat {
  kStacked,  // gate_up [E, 2I, H]: rows [0, I) gate, [I, 2I) up; down [E, H, I]; bf16/f32
  // gpt-oss as transformers saves it unquantised: gate_up [E, H, 2I] whose columns interleave
  // gate and up (2i gate, 2i+1 up); down [E, I, H] (both [in, out]).
  kTransposedInterleaved,
  // gpt-oss as published: MXFP4 [out, in] matrices, gate_up rows interleaved (2i gate, 2i+1 up).
  // Blocks U8 [E, out, in / 32, 16], two e2m1 values a byte (low nibble first); scales U8
  // [E, out, in / 32], e8m0 (2^(s - 127)).
  kMxfp4Interleaved,
};
struct ExpertSpec {
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  float alpha = 1.702f;  // kClampedSwiGlu
  float limit = 7.0f;    // kClampedSwiGlu (swiglu_limit)
  ExpertFormat format = ExpertFormat::kStacked;  // as the kernels read them
  // As the checkpoint stores them. A backend whose kernels read only kStacked
  // (BackendFeature::kInterleavedExperts absent) gets stored != format: the loader restacks
  // (and for MXFP4 dequantises) the experts to bf16 kStacked on the host (model/weights.h
  // WeightSource::restacked); the gate_up bias follows the same row order.
  ExpertFormat stored = ExpertFormat::kStacked;
  bool has_biases = false;  // MoeLayerWeights::gate_up_bias / down_bias are added

  bool is_default() const {
    return activation == ExpertActivation::kSwiGlu && format == ExpertFormat::kStacked &&
           !has_biases;
  }
};

}  // namespace sy::moe
