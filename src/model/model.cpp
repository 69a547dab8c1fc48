#include "model/model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/architecture.h"
#include "model/decoder.h"

namespace sy::model {

Model::~Model() {
  if (backend_)
    for (Tensor& tensor : owned_) backend_->free_buffer(tensor);
}

std::unique_ptr<Model> Model::from_parts(ModelConfig config, DecoderWeights weights, std::vector<Tensor> owned,
                                         backend::Backend& backend, std::string model_dir) {
  std::unique_ptr<Model> model(new Model());
  model->config_ = std::move(config);
  model->weights_ = std::move(weights);
  model->owned_ = std::move(owned);
  model->backend_ = &backend;
  model->model_dir_ = std::move(model_dir);
  return model;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& model_dir, backend::Backend& backend,
                                           const LoadProgress& progress) {
  std::unique_ptr<Model> model(new Model());
  model->model_dir_ = model_dir;
  model->backend_ = &backend;
  SY_ASSIGN(model->config_, load_model_config(model_dir));
  adapt_experts_to_backend(model->config_, backend);
  SY_TRY(check_backend_features(model->config_, backend));  // before reading any weight
  auto checkpoint = Checkpoint::open(model_dir);
  if (!checkpoint) return checkpoint.status();
  model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint).value());

  // Touch every page once so loading (not the first request) pays for reading the files, and
  // the progress shown is real.
  const auto& tensors = model->checkpoint_->tensors();
  uint64_t total_bytes = model->checkpoint_->total_bytes(), done_bytes = 0;
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (size_t offset = 0; offset < tensors[i].nbytes; offset += 4096) sink = sink + tensors[i].data[offset];
    done_bytes += tensors[i].nbytes;
    if (progress) progress(i + 1, tensors.size(), done_bytes, total_bytes);
  }

  SY_ASSIGN(const Architecture* arch,
            find_architecture(model->config_.model_type, model->config_.architecture));
  CheckpointSource source(*model->checkpoint_, backend, model->owned_,
                          WeightPlacement{&model->load_order_, nullptr, false},
                          model->config_.fp8_blocks);
  auto weights = arch->build(model->config_, source);
  if (!weights) return weights.status().with_context(model_dir + ": ");
  model->weights_ = std::move(weights).value();
  return model;
}

Result<std::unique_ptr<Model>> Model::random(const std::string& config_path, backend::Backend& backend,
                                             uint64_t seed) {
  std::ifstream file(config_path);
  if (!file) return Status::errorf("{}: cannot open", config_path);
  auto json = nlohmann::json::parse(file, nullptr, false);
  if (json.is_discarded()) return Status::errorf("{}: not valid JSON", config_path);
  auto config = parse_model_config(json);
  if (!config) return config.status().with_context(config_path + ": ");
  std::unique_ptr<Model> model(new Model());
  model->model_dir_ = std::filesystem::path(config_path).parent_path().string();
  model->backend_ = &backend;
  model->config_ = *config;
  adapt_experts_to_backend(model->config_, backend);
  const ModelConfig& c = model->config_;
  SY_TRY(check_backend_features(c, backend));
  SY_ASSIGN(const Architecture* arch, find_architecture(c.model_type, c.architecture));
  RandomSource source(backend, seed, c.hidden_size, model->owned_);
  auto weights = arch->build(c, source);
  if (!weights) return weights.status().with_context(config_path + ": ");
  model->weights_ = std::move(weights).value();
  return model;
}

namespace {

// Counts the parameters an adapter declares, as transformers counts them: an MXFP4 block byte
// holds two weights and the e8m0 scales are not parameters (gpt-oss-20b: 20,914,757,184, where
// the stored elements number about 12.1 billion). `has` answers as the checkpoint does, so
// optional tensors (an untied head, an o_proj bias) count exactly when they were loaded.
class ParameterCounter final : public WeightSource {
 public:
  explicit ParameterCounter(const Checkpoint* checkpoint) : checkpoint_(checkpoint) {}
  bool has(const std::string& name) const override {
    return checkpoint_ && checkpoint_->find(name) != nullptr;
  }
  Result<Tensor> get(const std::string&, const std::vector<int64_t>& shape) override {
    return counted(DType::kBF16, shape, 1);
  }
  Result<Tensor> packed(const std::string&, const std::vector<int64_t>& shape,
                        bool scales) override {
    return counted(DType::kU8, shape, scales ? 0 : 2);
  }
  Result<Tensor> stacked(const std::vector<std::string>& names,
                         const std::vector<int64_t>& shape) override {
    std::vector<int64_t> all = shape;
    all.insert(all.begin(), static_cast<int64_t>(names.size()));
    return counted(DType::kBF16, all, 1);
  }
  Result<Tensor> zero_centred_norm(const std::string&, const std::vector<int64_t>& shape) override {
    return counted(DType::kF32, shape, 1);
  }
  Result<Tensor> restacked(const StoredExperts& experts, RestackedPart part) override {
    return counted(DType::kBF16, experts.shape(part), 1);  // one per weight, as stored
  }
  int64_t count() const { return count_; }

 private:
  Tensor counted(DType dtype, const std::vector<int64_t>& shape, int64_t per_element) {
    Tensor tensor;  // shape only: adapters reshape what they get, never read it
    tensor.dtype = dtype;
    tensor.rank = static_cast<int>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) tensor.shape[i] = shape[i];
    count_ += tensor.numel() * per_element;
    return tensor;
  }
  const Checkpoint* checkpoint_;
  int64_t count_ = 0;
};

}  // namespace

int64_t Model::parameter_count() const {
  auto arch = find_architecture(config_.model_type, config_.architecture);
  ParameterCounter counter(checkpoint_.get());
  if (arch && (*arch)->build(config_, counter)) return counter.count();
  // Unreachable for a model that loaded (its adapter built it); the stored elements otherwise.
  int64_t count = 0;
  if (!checkpoint_) {
    for (const Tensor& tensor : owned_) count += tensor.numel();
    return count;
  }
  for (const auto& tensor : checkpoint_->tensors()) count += tensor.numel();
  return count;
}

Status Model::reload_in_place(const std::string& model_dir) {
  if (!checkpoint_ || load_order_.empty())
    return Status::error(ErrorCode::kUnsupported, "random-weight models are updated by loading a new model");
  if (!backend_->updates_weights_in_place())
    return Status::error(ErrorCode::kUnsupported, "this backend updates weights by loading a new model");
  std::unique_ptr<Model> incoming(new Model());
  incoming->model_dir_ = model_dir;
  SY_ASSIGN(incoming->config_, load_model_config(model_dir));
  auto checkpoint = Checkpoint::open(model_dir);
  if (!checkpoint) return checkpoint.status();
  incoming->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint).value());
  SY_TRY(check_same_shapes(*incoming));
  std::vector<Tensor> unused;
  SY_ASSIGN(const Architecture* arch,
            find_architecture(incoming->config_.model_type, incoming->config_.architecture));
  CheckpointSource check(*incoming->checkpoint_, *backend_, unused,
                         WeightPlacement{nullptr, &load_order_, true},
                         incoming->config_.fp8_blocks);
  auto checked = arch->build(incoming->config_, check);
  if (!checked) return checked.status().with_context(model_dir + ": ");
  CheckpointSource copy(*incoming->checkpoint_, *backend_, unused,
                        WeightPlacement{nullptr, &load_order_, false},
                        incoming->config_.fp8_blocks);
  auto copied = arch->build(incoming->config_, copy);
  if (!copied)
    return copied.status().with_context(model_dir + ": the weights are now partly updated (load them again): ");
  model_dir_ = model_dir;
  config_ = incoming->config_;
  checkpoint_ = std::move(incoming->checkpoint_);  // the old mapping goes; nothing points into it
  return Status::ok();
}

Status Model::check_same_shapes(const Model& other) const {
  if (!checkpoint_ || !other.checkpoint_) return Status::error("random-weight models cannot be swapped");
  const ModelConfig &a = config_, &b = other.config_;
  if (a.model_type != b.model_type)
    return Status::errorf("architecture differs: {} vs {}", a.model_type, b.model_type);
  const auto& mine = checkpoint_->tensors();
  const auto& theirs = other.checkpoint_->tensors();
  if (mine.size() != theirs.size())
    return Status::errorf("tensor count differs: {} vs {}", mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].name != theirs[i].name)
      return Status::errorf("tensor names differ: '{}' vs '{}'", mine[i].name, theirs[i].name);
    if (mine[i].shape != theirs[i].shape)
      return Status::errorf("tensor '{}' changed shape", mine[i].name);
  }
  if (a.num_experts != b.num_experts || a.experts_per_token != b.experts_per_token ||
      a.vocab_size != b.vocab_size || a.num_hidden_layers != b.num_hidden_layers ||
      a.moe_layers() != b.moe_layers())
    return Status::error("model configuration differs (experts, top-k, vocab or layers)");
  return Status::ok();
}

}  // namespace sy::model
