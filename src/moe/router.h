// The reference router (CPU, f32): the oracle every ExpertsKernel is checked against.
// Selection uses the softmax probabilities (as HF does), descending, ties -> lower expert id.
#pragma once

#include <cstdint>

#include "moe/router_spec.h"
#include "util/status.h"

namespace sy::moe {

// Route value the step's buffer is poisoned with; any value a kernel leaves there is an error.
inline constexpr int32_t kRoutePoison = -1;
// Bit pattern the gating-weight sink is poisoned with (a NaN no arithmetic produces).
inline constexpr int32_t kRouteWeightPoisonBits = 0x7fbadbad;

// logits: [num_experts]. Writes top_k ids (descending score, ties lower id) and gating weights.
// `scratch` must hold num_experts floats.
void route_token(const float* logits, const RouterSpec& spec, int32_t* ids, float* weights,
                 float* scratch);

// Forced routing (replay): the ids are given; weights are recomputed from these logits at those
// ids, then renormalised as the model does (DESIGN.md, Megatron's router replay).
void gate_forced(const float* logits, const RouterSpec& spec, const int32_t* forced_ids,
                 float* weights, float* scratch);

// A replay row is valid when every id is in [0, num_experts) and no id repeats.
Status validate_route_row(const int32_t* ids, const RouterSpec& spec);

}  // namespace sy::moe
