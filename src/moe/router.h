// The reference router (CPU, f32): the oracle every ExpertsKernel is checked against. It
// implements every RouterSpec option (moe/router_spec.h gives the order of the stages).
// Selection is by the choice score, descending; ties -> lower expert id.
#pragma once

#include <cstdint>

#include "moe/router_spec.h"
#include "util/status.h"

namespace sy::moe {

// Route value the step's buffer is poisoned with; any value a kernel leaves there is an error.
inline constexpr int32_t kRoutePoison = -1;
// Bit pattern the gating-weight sink is poisoned with (a NaN no arithmetic produces).
inline constexpr int32_t kRouteWeightPoisonBits = 0x7fbadbad;

// The layer's bias vectors ([num_experts] f32 each), required when the spec says it has them.
struct RouterBiases {
  const float* logit = nullptr;      // added to the logits (spec.has_logit_bias)
  const float* selection = nullptr;  // added to the scores for selection only (has_selection_bias)
};

// Floats of scratch route_token and gate_forced need: num_experts without the extended options
// (RouterSpec::uses_extended_options), more with them.
int64_t router_scratch_floats(const RouterSpec& spec);

// A spec every stage can run: top_k within the experts (and within the kept groups), groups
// dividing the experts evenly. Errors name the offending field.
Status validate_router_spec(const RouterSpec& spec);

// logits: [num_experts], the raw x . router^T. Writes top_k ids (descending choice score, ties
// lower id) and their gating weights. `scratch` holds router_scratch_floats(spec) floats.
void route_token(const float* logits, const RouterSpec& spec, const RouterBiases& biases,
                 int32_t* ids, float* weights, float* scratch);
inline void route_token(const float* logits, const RouterSpec& spec, int32_t* ids, float* weights,
                        float* scratch) {
  route_token(logits, spec, RouterBiases{}, ids, weights, scratch);
}

// Forced routing (replay): the ids are given; weights are recomputed from these logits at those
// ids, then renormalised and scaled as the model does (DESIGN.md, Megatron's router replay). A
// selection-only bias and group limits play no part (they only select).
void gate_forced(const float* logits, const RouterSpec& spec, const RouterBiases& biases,
                 const int32_t* forced_ids, float* weights, float* scratch);
inline void gate_forced(const float* logits, const RouterSpec& spec, const int32_t* forced_ids,
                        float* weights, float* scratch) {
  gate_forced(logits, spec, RouterBiases{}, forced_ids, weights, scratch);
}

// A replay row is valid when every id is in [0, num_experts) and no id repeats.
Status validate_route_row(const int32_t* ids, const RouterSpec& spec);

}  // namespace sy::moe
