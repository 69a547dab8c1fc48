#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "backend/random_fill.h"
#include "tensor/mxfp4.h"

namespace sy::model {
namespace {

// Element i of a float checkpoint tensor (BF16, F16 or F32; the caller checked the dtype) in f32.
float read_float(const TensorInfo& info, int64_t i) {
  const uint8_t* base = info.data;
  switch (info.dtype) {
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, base + i * 2, 2);
      return bf16_to_f32(bits);
    }
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, base + i * 2, 2);
      return f16_to_f32(bits);
    }
    default: {
      float value;
      std::memcpy(&value, base + i * 4, 4);
      return value;
    }
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Tensor view_of(const TensorInfo& info) {
  Tensor tensor;
  tensor.data = const_cast<uint8_t*>(info.data);
  tensor.dtype = info.dtype;
  tensor.rank = static_cast<int>(info.shape.size());
  for (size_t i = 0; i < info.shape.size(); ++i) tensor.shape[i] = info.shape[i];
  return tensor;
}

Tensor no_data(DType dtype, const std::vector<int64_t>& shape) {
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.rank = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) tensor.shape[i] = shape[i];
  return tensor;
}

std::vector<int64_t> with_count(size_t count, const std::vector<int64_t>& shape) {
  std::vector<int64_t> full{static_cast<int64_t>(count)};
  full.insert(full.end(), shape.begin(), shape.end());
  return full;
}

Status check_rank(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(Tensor::kMaxRank))
    return Status::errorf("tensor '{}': rank {} is more than {}", name, shape.size(),
                          Tensor::kMaxRank);
  return Status::ok();
}

}  // namespace

bool is_router_weight(const std::string& name) {
  auto ends_with = [&](std::string_view tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("mlp.gate.weight") || ends_with("block_sparse_moe.gate.weight") ||
         ends_with("mlp.router.weight");
}

Result<Tensor> CheckpointSource::get(const std::string& name, const std::vector<int64_t>& shape) {
  return load(name, shape, /*packed=*/false);
}

Result<Tensor> CheckpointSource::packed(const std::string& name, const std::vector<int64_t>& shape,
                                        bool) {
  return load(name, shape, /*packed=*/true);
}

float fp8_e4m3_to_f32(uint8_t bits) {
  const int exponent = (bits >> 3) & 15, mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude =
      exponent == 0 ? std::ldexp(static_cast<float>(mantissa) / 8.0f, -6)
                    : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return bits & 0x80 ? -magnitude : magnitude;
}

Result<std::vector<uint16_t>> CheckpointSource::dequantize_fp8(const TensorInfo& weight) const {
  if (!fp8_.enabled())
    return Status::errorf(
        "tensor '{}' in {} has dtype F8_E4M3, but config.json has no FP8 quantization_config "
        "(quant_method fp8 with weight_block_size)",
        weight.name, weight.file);
  if (weight.shape.size() != 2)
    return Status::errorf("FP8 tensor '{}' in {} has shape {}; block scales need a matrix",
                          weight.name, weight.file, shape_text(weight.shape));
  const std::string scale_name = weight.name + "_scale_inv";
  const TensorInfo* scale = checkpoint_.find(scale_name);
  if (!scale)
    return Status::errorf("FP8 tensor '{}' in {} has no block scales '{}'", weight.name,
                          weight.file, scale_name);
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const int64_t grid_rows = (rows + fp8_.rows - 1) / fp8_.rows,
                grid_cols = (cols + fp8_.cols - 1) / fp8_.cols;
  if (scale->shape != std::vector<int64_t>{grid_rows, grid_cols})
    return Status::errorf(
        "block scales '{}' in {} have shape {}, expected {} (weight {} in blocks of [{}, {}])",
        scale_name, scale->file, shape_text(scale->shape), shape_text({grid_rows, grid_cols}),
        shape_text(weight.shape), fp8_.rows, fp8_.cols);
  if (scale->dtype != DType::kF32 && scale->dtype != DType::kBF16)
    return Status::errorf("block scales '{}' in {} have dtype {}, expected F32 or BF16", scale_name,
                          scale->file, dtype_name(scale->dtype));
  std::vector<float> scales(static_cast<size_t>(grid_rows * grid_cols));
  for (size_t i = 0; i < scales.size(); ++i) {
    float value;
    if (scale->dtype == DType::kF32) {
      std::memcpy(&value, scale->data + i * 4, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, scale->data + i * 2, 2);
      value = bf16_to_f32(bits);
    }
    if (!std::isfinite(value))
      return Status::errorf("block scales '{}' in {}: entry {} is not finite", scale_name,
                            scale->file, i);
    scales[i] = value;
  }
  float table[256];
  for (int code = 0; code < 256; ++code) table[code] = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
  // As transformers dequantises: the f32 product of value and block scale, rounded to bf16.
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scales.data() + (r / fp8_.rows) * grid_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = weight.data[r * cols + c];
      if ((code & 0x7f) == 0x7f)
        return Status::errorf("FP8 tensor '{}' in {}: element [{}, {}] is NaN", weight.name,
                              weight.file, r, c);
      out[static_cast<size_t>(r * cols + c)] = f32_to_bf16(table[code] * scale_row[c / fp8_.cols]);
    }
  }
  return out;
}

Result<Tensor> CheckpointSource::load(const std::string& name, const std::vector<int64_t>& shape,
                                      bool packed) {
  const TensorInfo* info = checkpoint_.find(name);
  if (!info)
    return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
  if (info->shape != shape)
    return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                          shape_text(info->shape), shape_text(shape));
  if (!packed && info->dtype == DType::kF8E4M3) {
    SY_ASSIGN(std::vector<uint16_t> values, dequantize_fp8(*info));
    Tensor host = no_data(DType::kBF16, shape);
    host.data = values.data();
    if (place_.into) {
      SY_ASSIGN(Tensor * target, next_target(name));
      if (target->numel() != host.numel())
        return Status::errorf("tensor '{}' has {} elements, the loaded model {}", name,
                              host.numel(), target->numel());
      if (!place_.check_only)
        SY_TRY(backend_.load_weight_into(host, *target)
                   .with_context(fmt::format("tensor '{}': ", name)));
      return *target;
    }
    if (!backend_.supports(backend::BackendFeature::kFp8BlockWeights))
      return Status::error(ErrorCode::kUnsupported,
                           fmt::format("tensor '{}': the {} backend does not load FP8 block-"
                                       "quantised weights",
                                       name, backend_.name()));
    // A device backend copies the dequantised values as it copies any bf16 weight.
    if (backend_.device() != Device::kCpu) {
      auto loaded = backend_.load_weight(host);
      if (!loaded) return loaded.status().with_context(fmt::format("tensor '{}': ", name));
      owned_.push_back(*loaded);
      if (place_.order) place_.order->push_back(*loaded);
      return *loaded;
    }
    // The CPU keeps host bf16 weights as views: the values go into a buffer of its own, which the
    // model frees with the other converted tensors.
    Tensor buffer = backend_.alloc(DType::kBF16, {host.numel()});
    if (!buffer.data)
      return Status::error(ErrorCode::kResourceExhausted,
                           fmt::format("out of memory dequantising '{}'", name));
    std::memcpy(buffer.data, values.data(), values.size() * sizeof(uint16_t));
    owned_.push_back(buffer);
    Tensor shaped = no_data(DType::kBF16, shape);
    shaped.data = buffer.data;
    shaped.device = buffer.device;
    if (place_.order) place_.order->push_back(shaped);
    return shaped;
  }
  const bool is_float =
      info->dtype == DType::kBF16 || info->dtype == DType::kF16 || info->dtype == DType::kF32;
  if (packed && info->dtype != DType::kU8)
    return Status::errorf("tensor '{}' in {} has dtype {}, expected U8 (MXFP4 blocks or scales)",
                          name, info->file, dtype_name(info->dtype));
  if (!packed && !is_float)
    return Status::errorf(
        "tensor '{}' in {} has dtype {}, expected BF16, F16 or F32 (or F8_E4M3 with block scales)",
        name, info->file, dtype_name(info->dtype));
  if (place_.into) {
    SY_ASSIGN(Tensor * target, next_target(name));
    if (target->numel() != view_of(*info).numel())
      return Status::errorf("tensor '{}' has {} elements, the loaded model {}", name,
                            view_of(*info).numel(), target->numel());
    if (!place_.check_only)
      SY_TRY(backend_.load_weight_into(view_of(*info), *target)
                 .with_context(fmt::format("tensor '{}': ", name)));
    return *target;
  }
  auto loaded = backend_.load_weight(view_of(*info));
  if (!loaded) return loaded.status().with_context(fmt::format("tensor '{}': ", name));
  if (loaded->data != info->data) owned_.push_back(*loaded);
  if (place_.order) place_.order->push_back(*loaded);
  return *loaded;
}

Result<Tensor> CheckpointSource::stacked(const std::vector<std::string>& names,
                                         const std::vector<int64_t>& shape) {
  std::vector<Tensor> parts;
  for (const std::string& name : names) {
    const TensorInfo* info = checkpoint_.find(name);
    if (!info)
      return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
    if (info->shape != shape)
      return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                            shape_text(info->shape), shape_text(shape));
    if (!parts.empty() && info->dtype != parts.front().dtype)
      return Status::errorf("tensor '{}' in {} has dtype {}, but '{}' has {}", name, info->file,
                            dtype_name(info->dtype), names.front(),
                            dtype_name(parts.front().dtype));
    parts.push_back(view_of(*info));
  }
  // FP8 experts: each part dequantised to bf16 on the host, then stacked like bf16 parts.
  std::vector<std::vector<uint16_t>> dequantized;
  if (parts.front().dtype == DType::kF8E4M3) {
    for (size_t i = 0; i < parts.size(); ++i) {
      SY_ASSIGN(std::vector<uint16_t> values, dequantize_fp8(*checkpoint_.find(names[i])));
      dequantized.push_back(std::move(values));
      parts[i].dtype = DType::kBF16;
      parts[i].data = dequantized.back().data();
    }
  }
  if (place_.into) {
    SY_ASSIGN(Tensor * target, next_target(names.front()));
    if (target->numel() != parts.front().numel() * static_cast<int64_t>(parts.size()))
      return Status::errorf("tensors '{}'...: {} x {} elements, the loaded model {}", names.front(),
                            parts.size(), parts.front().numel(), target->numel());
    if (!place_.check_only)
      SY_TRY(backend_.load_stacked_into(parts, *target)
                 .with_context(fmt::format("tensor '{}': ", names.front())));
    return *target;
  }
  auto loaded = backend_.load_stacked(parts);
  if (!loaded) return loaded.status().with_context(fmt::format("tensor '{}': ", names.front()));
  owned_.push_back(*loaded);
  if (place_.order) place_.order->push_back(*loaded);
  return *loaded;
}

Result<Tensor> CheckpointSource::zero_centred_norm(const std::string& name,
                                                   const std::vector<int64_t>& shape) {
  const TensorInfo* info = checkpoint_.find(name);
  if (!info)
    return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
  if (info->shape != shape)
    return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                          shape_text(info->shape), shape_text(shape));
  const Tensor stored = view_of(*info);
  if (info->dtype != DType::kBF16 && info->dtype != DType::kF16 && info->dtype != DType::kF32)
    return Status::errorf("tensor '{}' in {} has dtype {}, expected BF16, F16 or F32", name,
                          info->file, dtype_name(info->dtype));
  std::vector<float> shifted(static_cast<size_t>(stored.numel()));
  for (int64_t i = 0; i < stored.numel(); ++i)
    shifted[static_cast<size_t>(i)] = 1.0f + read_float(*info, i);
  if (place_.into) {
    SY_ASSIGN(Tensor * target, next_target(name));
    if (target->numel() != stored.numel() || target->dtype != DType::kF32)
      return Status::errorf("tensor '{}' has {} elements, the loaded model {}", name,
                            stored.numel(), target->numel());
    if (!place_.check_only) backend_.upload(shifted.data(), *target);
    return *target;
  }
  Tensor tensor = backend_.alloc(DType::kF32, {stored.numel()});
  if (!tensor.data)
    return Status::error(ErrorCode::kResourceExhausted,
                         fmt::format("out of memory for tensor '{}'", name));
  owned_.push_back(tensor);
  Tensor shaped = no_data(DType::kF32, shape);
  shaped.data = tensor.data;
  shaped.device = tensor.device;
  backend_.upload(shifted.data(), shaped);
  if (place_.order) place_.order->push_back(shaped);
  return shaped;
}

Result<Tensor> CheckpointSource::restacked(const StoredExperts& x, RestackedPart part) {
  const int64_t E = x.experts, H = x.hidden, I = x.intermediate;
  const bool mxfp4 = x.stored == moe::ExpertFormat::kMxfp4Interleaved;
  if (x.stored == moe::ExpertFormat::kStacked)
    return Status::error("restacked: the experts are stored stacked already");
  // A stored tensor, its shape and dtype checked (U8 for MXFP4 blocks and scales).
  auto find = [&](const std::string& name, const std::vector<int64_t>& shape,
                  bool u8) -> Result<const TensorInfo*> {
    const TensorInfo* info = checkpoint_.find(name);
    if (!info)
      return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
    if (info->shape != shape)
      return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                            shape_text(info->shape), shape_text(shape));
    const bool is_float =
        info->dtype == DType::kBF16 || info->dtype == DType::kF16 || info->dtype == DType::kF32;
    if (u8 ? info->dtype != DType::kU8 : !is_float)
      return Status::errorf("tensor '{}' in {} has dtype {}, expected {}", name, info->file,
                            dtype_name(info->dtype), u8 ? "U8" : "BF16, F16 or F32");
    return info;
  };
  // Stored rows interleave gate (2r) and up (2r + 1); restacked row r < I is gate r, r >= I up r -
  // I.
  auto stored_row = [&](int64_t r) { return r < I ? 2 * r : 2 * (r - I) + 1; };
  // Row `row` of an MXFP4 [E * rows, in] matrix (blocks [.., in / 32, 16], scales [.., in / 32]).
  std::vector<float> decoded;
  auto dequantize_row = [&](const TensorInfo& blocks, const TensorInfo& scales, int64_t row,
                            int64_t in, uint16_t* dst) {
    const int64_t groups = in / 32;
    decoded.resize(static_cast<size_t>(in));
    mxfp4_decode_row(blocks.data + row * groups * 16, scales.data + row * groups, in,
                     decoded.data());
    for (int64_t i = 0; i < in; ++i)
      dst[i] = f32_to_bf16(decoded[static_cast<size_t>(i)]);  // exact
  };
  const std::vector<int64_t> shape = x.shape(part);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<uint16_t> out(static_cast<size_t>(numel));
  std::string label;
  switch (part) {
    case RestackedPart::kGateUpBias: {
      label = x.prefix + "gate_up_proj_bias";
      SY_ASSIGN(const TensorInfo* bias, find(label, {E, 2 * I}, false));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < 2 * I; ++r)
          out[static_cast<size_t>(e * 2 * I + r)] =
              f32_to_bf16(read_float(*bias, e * 2 * I + stored_row(r)));
      break;
    }
    case RestackedPart::kGateUp:
      if (mxfp4) {
        label = x.prefix + "gate_up_proj_blocks";
        SY_ASSIGN(const TensorInfo* blocks, find(label, {E, 2 * I, H / 32, 16}, true));
        SY_ASSIGN(const TensorInfo* scales,
                  find(x.prefix + "gate_up_proj_scales", {E, 2 * I, H / 32}, true));
        for (int64_t e = 0; e < E; ++e)
          for (int64_t r = 0; r < 2 * I; ++r)
            dequantize_row(*blocks, *scales, e * 2 * I + stored_row(r), H,
                           out.data() + (e * 2 * I + r) * H);
      } else {
        label = x.prefix + "gate_up_proj";
        SY_ASSIGN(const TensorInfo* stored, find(label, {E, H, 2 * I}, false));  // [in, out]
        for (int64_t e = 0; e < E; ++e)
          for (int64_t r = 0; r < 2 * I; ++r)
            for (int64_t h = 0; h < H; ++h)
              out[static_cast<size_t>((e * 2 * I + r) * H + h)] =
                  f32_to_bf16(read_float(*stored, (e * H + h) * 2 * I + stored_row(r)));
      }
      break;
    case RestackedPart::kDown:
      if (mxfp4) {
        label = x.prefix + "down_proj_blocks";
        SY_ASSIGN(const TensorInfo* blocks, find(label, {E, H, I / 32, 16}, true));
        SY_ASSIGN(const TensorInfo* scales,
                  find(x.prefix + "down_proj_scales", {E, H, I / 32}, true));
        for (int64_t row = 0; row < E * H; ++row)
          dequantize_row(*blocks, *scales, row, I, out.data() + row * I);
      } else {
        label = x.prefix + "down_proj";
        SY_ASSIGN(const TensorInfo* stored, find(label, {E, I, H}, false));  // [in, out]
        for (int64_t e = 0; e < E; ++e)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < I; ++i)
              out[static_cast<size_t>((e * H + h) * I + i)] =
                  f32_to_bf16(read_float(*stored, (e * I + i) * H + h));
      }
      break;
  }
  Tensor host = no_data(DType::kBF16, shape);
  host.data = out.data();
  if (place_.into) {
    SY_ASSIGN(Tensor * target, next_target(label));
    if (target->numel() != numel)
      return Status::errorf("tensor '{}' restacked has {} elements, the loaded model {}", label,
                            numel, target->numel());
    if (!place_.check_only)
      SY_TRY(backend_.load_weight_into(host, *target)
                 .with_context(fmt::format("tensor '{}': ", label)));
    return *target;
  }
  // A buffer of the backend's own (the CPU would otherwise keep a view of `out`).
  Tensor buffer = backend_.alloc(DType::kBF16, {numel});
  if (!buffer.data)
    return Status::error(ErrorCode::kResourceExhausted,
                         fmt::format("out of memory restacking '{}'", label));
  owned_.push_back(buffer);
  backend_.upload(out.data(), buffer);
  Tensor shaped = no_data(DType::kBF16, shape);
  shaped.data = buffer.data;
  shaped.device = buffer.device;
  if (place_.order) place_.order->push_back(shaped);
  return shaped;
}

Result<Tensor> RandomSource::restacked(const StoredExperts& x, RestackedPart part) {
  const char* names[] = {"gate_up_proj", "down_proj", "gate_up_proj_bias"};
  return get(x.prefix + names[static_cast<int>(part)], x.shape(part));
}

Result<Tensor> TensorListSource::restacked(const StoredExperts& x, RestackedPart) {
  return Status::errorf("{}: restacked experts are a load-time conversion, not stored tensors",
                        x.prefix);
}

Status CheckpointSource::finish() {
  if (place_.into && next_ != place_.into->size())
    return Status::errorf("the checkpoint maps onto {} tensors, the loaded model has {}", next_,
                          place_.into->size());
  return Status::ok();
}

Result<Tensor*> CheckpointSource::next_target(const std::string& name) {
  if (next_ >= place_.into->size())
    return Status::errorf("tensor '{}': more tensors than the loaded model has ({})", name,
                          place_.into->size());
  return &(*place_.into)[next_++];
}

Result<Tensor> RandomSource::get(const std::string& name, const std::vector<int64_t>& shape) {
  SY_TRY(check_rank(name, shape));
  const DType dtype = shape.size() == 1 ? DType::kF32 : DType::kBF16;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  Tensor tensor = backend_.alloc(dtype, {numel});
  if (!tensor.data && numel > 0)
    return Status::error(ErrorCode::kResourceExhausted,
                         fmt::format("out of memory for random weight '{}'", name));
  owned_.push_back(tensor);
  Tensor shaped = no_data(dtype, shape);
  shaped.data = tensor.data;
  shaped.device = tensor.device;
  // Uniform with these standard deviations (HF's init for matrices; norms near 1).
  float std_dev = 0.02f, offset = 0.0f;
  if (name.find("norm") != std::string::npos) {
    std_dev = 0.1f / std::sqrt(3.0f);
    offset = 1.0f;
  } else if (is_router_weight(name)) {
    std_dev = 3.0f / std::sqrt(static_cast<float>(hidden_));
  }
  backend_.fill_random(shaped, backend::random_fill_hash(seed_ * 1000003u + tensor_index_++),
                       std_dev * std::sqrt(3.0f), offset);
  return shaped;
}

Result<Tensor> RandomSource::packed(const std::string& name, const std::vector<int64_t>& shape,
                                    bool scales) {
  SY_TRY(check_rank(name, shape));
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  Tensor tensor = backend_.alloc(DType::kU8, {numel});
  if (!tensor.data && numel > 0)
    return Status::error(ErrorCode::kResourceExhausted,
                         fmt::format("out of memory for random weight '{}'", name));
  owned_.push_back(tensor);
  Tensor shaped = no_data(DType::kU8, shape);
  shaped.data = tensor.data;
  shaped.device = tensor.device;
  // Scales 2^(117..120 - 127): e2m1 values up to 6 then give weights of about +-0.02.
  const uint64_t seed = backend::random_fill_hash(seed_ * 1000003u + tensor_index_++);
  if (scales)
    backend_.fill_random_bytes(shaped, seed, 117, 3.999f);
  else
    backend_.fill_random_bytes(shaped, seed, 0, 255.999f);
  return shaped;
}

Result<Tensor> RandomSource::stacked(const std::vector<std::string>& names,
                                     const std::vector<int64_t>& shape) {
  return get(names.front(), with_count(names.size(), shape));
}

Result<Tensor> RandomSource::zero_centred_norm(const std::string& name,
                                               const std::vector<int64_t>& shape) {
  return get(name, shape);  // a norm's name: f32 near 1
}

Result<Tensor> TensorListSource::zero_centred_norm(const std::string& name,
                                                   const std::vector<int64_t>& shape) {
  zero_centred_.push_back(name);
  return get(name, shape);
}

bool TensorListSource::is_zero_centred(const std::string& name) const {
  return std::find(zero_centred_.begin(), zero_centred_.end(), name) != zero_centred_.end();
}

Result<Tensor> TensorListSource::get(const std::string& name, const std::vector<int64_t>& shape) {
  SY_TRY(check_rank(name, shape));
  tensors_.push_back({name, DType::kBF16, shape});
  return no_data(DType::kBF16, shape);
}

Result<Tensor> TensorListSource::packed(const std::string& name, const std::vector<int64_t>& shape,
                                        bool scales) {
  SY_TRY(check_rank(name, shape));
  tensors_.push_back({name, DType::kU8, shape});
  if (scales) scales_.push_back(name);
  return no_data(DType::kU8, shape);
}

bool TensorListSource::is_scales(const std::string& name) const {
  return std::find(scales_.begin(), scales_.end(), name) != scales_.end();
}

Result<Tensor> TensorListSource::stacked(const std::vector<std::string>& names,
                                         const std::vector<int64_t>& shape) {
  SY_TRY(check_rank(names.front(), with_count(names.size(), shape)));
  for (const std::string& name : names) tensors_.push_back({name, DType::kBF16, shape});
  return no_data(DType::kBF16, with_count(names.size(), shape));
}

}  // namespace sy::model
