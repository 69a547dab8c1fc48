#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "model/config_json.h"

namespace sy::model {
namespace {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension at which RoPE makes `rotations` turns over the original context.
double correction_dim(double rotations, double dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

RopeTable rope_table(const ModelConfig& c) {
  RopeTable table;
  const RopeScaling& y = c.rope_scaling;
  if (y.kind != RopeKind::kYarn) return table;
  const int64_t dim = c.rope_dim(), half = dim / 2;
  const double base = c.rope_theta;
  table.attention_factor = static_cast<float>(y.attention_factor > 0.0 ? y.attention_factor
                                              : (y.mscale != 0.0 && y.mscale_all_dim != 0.0)
                                                  ? yarn_mscale(y.factor, y.mscale) /
                                                        yarn_mscale(y.factor, y.mscale_all_dim)
                                                  : yarn_mscale(y.factor, 1.0));
  const double max_positions = static_cast<double>(y.original_max_position_embeddings);
  double low = correction_dim(y.beta_fast, static_cast<double>(dim), base, max_positions);
  double high = correction_dim(y.beta_slow, static_cast<double>(dim), base, max_positions);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  // Every step in f32, in transformers' order.
  const float base_f = static_cast<float>(base), factor_f = static_cast<float>(y.factor);
  const float low_f = static_cast<float>(low), width_f = static_cast<float>(high - low);
  table.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = std::pow(base_f, exponent);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / width_f, 0.0f, 1.0f);
    const float extrapolation_share = 1.0f - ramp;
    table.inv_freq[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_share) + extrapolation * extrapolation_share;
  }
  return table;
}

Result<int64_t> partial_rotary_dim(const nlohmann::json& config, int64_t head_dim,
                                   double default_factor) {
  double factor = default_factor;
  const char* where = "partial_rotary_factor";
  SY_ASSIGN(factor, config_json::get_number(config, "partial_rotary_factor", factor));
  if (auto it = config.find("rope_parameters"); it != config.end() && it->is_object()) {
    SY_ASSIGN(factor, config_json::get_number(*it, "partial_rotary_factor", factor));
    if (it->contains("partial_rotary_factor")) where = "rope_parameters.partial_rotary_factor";
  }
  // Python's int() of the product (truncation), as transformers' rope init takes it.
  const double product = static_cast<double>(head_dim) * factor;
  const int64_t dim = product >= 0.0 && product <= static_cast<double>(head_dim)
                          ? static_cast<int64_t>(product)
                          : -1;
  if (!(factor > 0.0) || dim <= 0 || dim % 2)
    return Status::errorf(
        "config.json: {} {} gives {} rotary dims of head_dim {}; they must be even and in (0, {}]",
        where, factor, product, head_dim, head_dim);
  return dim;
}

}  // namespace sy::model
