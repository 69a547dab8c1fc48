// The decoder forward pass, written once for every architecture the adapters describe:
// embed -> per layer (norm, attention over the paged KV cache, norm, dense MLP or MoE block)
// -> final norm -> logits of the requested rows. Routes go from the MoE kernels straight into
// the step's route buffer, which is poisoned before the step, copied to the host once after the
// last layer, and checked there (collect_routes) while the device computes the logits.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
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
  bool capture_weights = false;        // also the gating weights (needs capture_routes)
  std::vector<uint8_t> forced;         // [T] 1 = replay this token's routes (empty: none)
  std::vector<int32_t> forced_routes;  // [T * num_hidden_layers * top_k] when forced is set
  // Models with linear-attention layers: per sequence of the step, the state buffer its conv and
  // recurrent states are read from and the one this step writes them to, both in
  // [0, state_buffers()) and never equal (a failed step leaves the read buffer intact, so a
  // rerun computes the same). A sequence whose first token here is at position 0 reads zeros.
  std::vector<int32_t> state_read, state_write;
  // Whole-buffer state copies {from, to} done before the step's layers, in order (prefix-cache
  // snapshots of linear-attention state: taking one, restoring one into a sequence's read buffer).
  std::vector<std::pair<int32_t, int32_t>> state_copies;
};

struct StepOutputs {
  Tensor logits;                // backend buffer [logits_rows, vocab] f32, valid until next step
  std::vector<int32_t> routes;  // host [T, num_hidden_layers, top_k] once collected; dense rows 0
  std::vector<float> weights;   // host, same layout, when capture_weights; dense entries 0
  int64_t poisoned_rows = 0;    // step tokens with a route or weight no kernel wrote
  double route_host_seconds = 0;  // collect_routes' host work on the routes (copy, check)
};

// Which MoE kernel runs a step: `small` for steps of at most `small_max_tokens` tokens (a
// monolithic decode kernel), `large` otherwise. Both may be the same kernel.
struct KernelChoice {
  moe::ExpertsKernel* large = nullptr;
  moe::ExpertsKernel* small = nullptr;
  int64_t small_max_tokens = 0;
  moe::ExpertsKernel& for_tokens(int64_t tokens) const {
    return small && tokens <= small_max_tokens ? *small : *large;
  }
};

// What the description needs of the backend (sliding window, attention sinks, YaRN, MXFP4, ...),
// refused with kUnsupported naming the first missing feature. Model::load checks it before
// reading weights; Decoder::allocate again before allocating.
Status check_backend_features(const ModelConfig& config, const backend::Backend& backend);
// Experts stored in a layout the backend's kernels do not read (gpt-oss's interleaved bf16 or
// MXFP4 without BackendFeature::kInterleavedExperts; MXFP4 stays packed with kMxfp4Experts) are
// kept as bf16 kStacked instead: sets config.experts.format (the adapter then asks
// WeightSource::restacked). Before the check.
void adapt_experts_to_backend(ModelConfig& config, const backend::Backend& backend);

class Decoder {
 public:
  Decoder(backend::Backend& backend, KernelChoice kernels, int block_size);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // The KV cache for `num_blocks` blocks (in the backend's KV dtype) and the step workspace for
  // the largest step `limits` allows, both allocated once: no step allocates.
  Status allocate(const ModelConfig& config, int64_t num_blocks, const backend::StepLimits& limits);
  int block_size() const { return block_size_; }
  // Per-sequence state buffers of the linear-attention layers (2 per sequence the step limits
  // allow: read and write, then `snapshots` more for the prefix cache's state snapshots),
  // allocated once by allocate(); 0 for a model without such layers.
  int64_t state_buffers() const { return state_buffers_; }
  void set_state_snapshots(int64_t snapshots) { state_snapshots_ = snapshots; }
  const KernelChoice& kernels() const { return kernels_; }
  // Graph recording of decode steps (backends that support it); on by default.
  void set_graphs_enabled(bool enabled) { graphs_enabled_ = enabled; }
  // Tensor parallel (dist/): the model is one rank's shard and `all_reduce` sums a [T, hidden]
  // f32 buffer over the group in place, giving every rank the same bits. Called after each
  // attention output projection and each feed-forward block (dense, MoE and shared expert
  // together), in layer order, on every rank. Turns off the fusions that add a partial sum
  // into the residual stream (fused MoE input norm) and graph recording.
  using AllReduce = std::function<Status(Tensor&)>;
  void set_all_reduce(AllReduce all_reduce) { all_reduce_ = std::move(all_reduce); }

  // Enqueues one step; on a device, the step may still be running when this returns. Logits
  // are usable by the backend's next operations (sampling).
  Status forward(const Model& model, const StepInputs& inputs, StepOutputs& outputs);
  // The step's routes come to the host in route_pieces() pieces (layer ranges, in order, that
  // cover every layer once: one piece for small steps, up to kMaxRoutePieces for a prefill).
  // collect_route_piece(p) waits until piece p is on the host, not for the rest of the step (the
  // device may still compute later layers, the logits, the samples), and checks it into
  // outputs.routes (its columns of every row; gating weights come in one piece). A route the
  // kernel left unwritten is an error naming layer and kernel. Optional: collect_routes
  // collects the pieces not yet collected, finish_step all of them.
  static constexpr int kMaxRoutePieces = 4;
  static constexpr int64_t kRoutePieceMinTokens = 64;
  int route_pieces() const { return static_cast<int>(step_pieces_.size()); }
  std::pair<int64_t, int64_t> route_piece_layers(int piece) const {
    return step_pieces_[static_cast<size_t>(piece)];
  }
  Status collect_route_piece(const Model& model, StepOutputs& outputs, int piece);
  Status collect_routes(const Model& model, StepOutputs& outputs);
  // Completes the step: collects the routes (if not yet; their error is returned) and waits for
  // the device either way.
  Status finish_step(const Model& model, StepOutputs& outputs);

 private:
  Status check_routes(const Model& model, StepOutputs& outputs, int64_t layer_begin,
                      int64_t layer_end);
  struct Workspace;

  backend::Backend& backend_;
  KernelChoice kernels_;
  int block_size_;
  bool graphs_enabled_ = true;
  AllReduce all_reduce_;
  std::vector<Tensor> k_cache_, v_cache_;
  // Linear-attention layers: [state_buffers_, conv_dim, kernel - 1] and [state_buffers_,
  // value_heads, key_head_dim, value_head_dim] f32 (undefined for other layers).
  std::vector<Tensor> conv_state_, recurrent_state_;
  int64_t state_buffers_ = 0;
  int64_t state_snapshots_ = 0;
  std::unique_ptr<Workspace> ws_;
  // The step in flight (between forward and finish_step).
  int64_t step_tokens_ = 0;
  bool step_capture_ = false;
  bool step_weights_ = false;
  std::vector<std::pair<int64_t, int64_t>> step_pieces_;  // layer ranges (empty: no capture)
  int step_pieces_collected_ = 0;
  std::vector<uint8_t> step_poisoned_;  // [tokens] 1: a row with a route no kernel wrote
  int64_t step_padded_tokens_ = 0;  // the step's route buffer rows (graph padding included)
  moe::ExpertsKernel* step_kernel_ = nullptr;
};

}  // namespace sy::model
