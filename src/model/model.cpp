#include "model/model.h"

namespace sy::model {

Model::~Model() {
  if (backend_)
    for (Tensor& tensor : owned_) backend_->free_buffer(tensor);
}

Result<std::unique_ptr<Model>> Model::load(const std::string& model_dir, backend::Backend& backend,
                                           const LoadProgress& progress) {
  std::unique_ptr<Model> model(new Model());
  model->model_dir_ = model_dir;
  model->backend_ = &backend;
  SY_ASSIGN(model->config_, load_model_config(model_dir));
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

  auto weights = load_qwen3_moe(model->config_, *model->checkpoint_, backend, model->owned_);
  if (!weights) return weights.status().with_context(model_dir + ": ");
  model->weights_ = std::move(weights).value();
  return model;
}

int64_t Model::parameter_count() const {
  int64_t count = 0;
  for (const auto& tensor : checkpoint_->tensors()) count += tensor.numel();
  return count;
}

Status Model::check_same_shapes(const Model& other) const {
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
