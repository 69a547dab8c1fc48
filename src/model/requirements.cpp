#include <fmt/format.h>

#include "model/decoder.h"

namespace sy::model {

void adapt_experts_to_backend(ModelConfig& c, const backend::Backend& backend) {
  if (c.experts.stored == moe::ExpertFormat::kStacked ||
      backend.supports(backend::BackendFeature::kInterleavedExperts))
    return;
  const bool reads_mxfp4 = c.experts.stored == moe::ExpertFormat::kMxfp4Interleaved &&
                           backend.supports(backend::BackendFeature::kMxfp4Experts) &&
                           backend.supports(backend::BackendFeature::kMxfp4Weights);
  if (!reads_mxfp4) c.experts.format = moe::ExpertFormat::kStacked;
}

Status check_backend_features(const ModelConfig& c, const backend::Backend& backend) {
  bool windowed = false, gated_shared = false, sinks = false, latent = false, partial = false,
       linear = false, output_gate = false;
  for (const LayerSpec& layer : c.layers) {
    windowed |= layer.attention.sliding_window > 0;
    gated_shared |= layer.shared_expert_gate;
    sinks |= layer.attention.sinks;
    latent |= layer.attention.latent;
    linear |= layer.attention.linear;
    output_gate |= layer.attention.output_gate;
    partial |= !layer.attention.latent && c.rope_dim() < c.head_dim;
  }
  const bool mxfp4 = c.experts.format == moe::ExpertFormat::kMxfp4Interleaved;
  const bool yarn = c.rope_scaling.kind == RopeKind::kYarn;
  const bool fp8 = c.fp8_blocks.enabled();
  std::string missing;
  for (auto [needed, feature] : {std::pair{windowed, backend::BackendFeature::kSlidingWindow},
                                 std::pair{gated_shared, backend::BackendFeature::kSigmoidGatedAdd},
                                 std::pair{sinks, backend::BackendFeature::kAttentionSinks},
                                 std::pair{yarn, backend::BackendFeature::kScaledRope},
                                 std::pair{mxfp4, backend::BackendFeature::kMxfp4Weights},
                                 std::pair{latent, backend::BackendFeature::kLatentAttention},
                                 std::pair{linear, backend::BackendFeature::kGatedDeltaNet},
                                 std::pair{output_gate, backend::BackendFeature::kGatedAttention},
                                 std::pair{partial, backend::BackendFeature::kPartialRotary},
                                 std::pair{fp8, backend::BackendFeature::kFp8BlockWeights}})
    if (needed && !backend.supports(feature))
      missing +=
          fmt::format("{}{}", missing.empty() ? "" : ", ", backend::backend_feature_name(feature));
  if (!missing.empty())
    return Status::error(
        ErrorCode::kUnsupported,
        fmt::format("the {} backend does not implement {} yet, which this {} model needs",
                    backend.name(), missing, c.model_type));
  const auto shape_error = [&](const Status& status) {
    return Status::error(ErrorCode::kUnsupported,
                         fmt::format("config.json: this {} model's {}", c.model_type, status.message()));
  };
  if (latent) {
    const LatentAttentionSpec& m = c.latent_attention;
    if (Status shape = backend.supports_shape(backend::Backend::LatentShape{
            m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.interleave});
        !shape)
      return shape_error(shape);
  }
  if (linear) {
    const LinearAttentionSpec& l = c.linear_attention;
    if (Status shape = backend.supports_shape(backend::Backend::LinearShape{
            l.num_key_heads, l.num_value_heads, l.key_head_dim, l.value_head_dim, l.conv_kernel});
        !shape)
      return shape_error(shape);
  }
  return Status::ok();
}

}  // namespace sy::model
