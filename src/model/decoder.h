// The decoder forward pass, written once for every architecture the adapters describe:
// embed -> per layer (norm, attention over the paged KV cache, norm, dense MLP or MoE block)
// -> final norm -> logits of the requested rows. Routes go from the MoE kernels straight into
// the step's route buffer, which is poisoned before and checked after the step.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace sy::model {

// One step's tokens, as host arrays (uploaded once).
struct StepInputs {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> token_seq;     // [T] index of the token's sequence in this step
  std::vector<int32_t> slot_mapping;  // [T] KV slot the token's K/V go to
  std::vector<int32_t> block_tables;  // [num_seqs * max_blocks_per_seq]
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logits_rows;   // tokens whose logits are wanted
  bool capture_routes = false;
  std::vector<uint8_t> forced;         // [T] 1 = replay this token's routes (empty: none)
  std::vector<int32_t> forced_routes;  // [T * num_hidden_layers * top_k] when forced is set
};

struct StepOutputs {
  Tensor logits;                // backend buffer [logits_rows, vocab] f32, valid until next step
  std::vector<int32_t> routes;  // host [T, num_hidden_layers, top_k] when capturing; dense rows 0
};

class Decoder {
 public:
  Decoder(backend::Backend& backend, moe::ExpertsKernel& kernel, int block_size);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // KV cache for `num_blocks` blocks of the model's shape (f32).
  void allocate_kv_cache(const ModelConfig& config, int64_t num_blocks);
  int block_size() const { return block_size_; }
  const moe::ExpertsKernel& kernel() const { return kernel_; }

  // Runs one step. An MoE route the kernel left unwritten is an error naming layer and kernel.
  Status forward(const Model& model, const StepInputs& inputs, StepOutputs& outputs);

 private:
  backend::Backend& backend_;
  moe::ExpertsKernel& kernel_;
  int block_size_;
  std::vector<Tensor> k_cache_, v_cache_;
  Tensor logits_;
};

}  // namespace sy::model
