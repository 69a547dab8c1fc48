// The step plan of a multi-process (tensor/expert-parallel) run: rank 0's engine owns the
// scheduler and sends every other rank what to do next — run this step's forward pass, load
// new weights, or stop — over the group's broadcast. The other ranks hold no scheduler; they
// follow the plan (engine.h: run_engine_follower).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/decoder.h"
#include "util/status.h"

namespace sy::engine {

enum class PlanKind : uint32_t { kStep = 1, kReloadWeights = 2, kStop = 3 };

struct PlanMessage {
  PlanKind kind = PlanKind::kStop;
  model::StepInputs step;  // kStep
  std::string model_dir;   // kReloadWeights
};

// The byte form of a step: fixed header, then each array. decode_step validates every count
// against the bytes present and the arrays against each other (a corrupt plan is an error,
// never an out-of-range slot).
std::vector<uint8_t> encode_step(const model::StepInputs& step);
Result<model::StepInputs> decode_step(const uint8_t* data, int64_t bytes);

// Rank 0 sends (every other rank is in receive_plan at the same time). Each message is two
// broadcasts: a 16-byte header (kind, payload bytes), then the payload.
Status send_step(dist::Communicator& comm, const model::StepInputs& step);
Status send_reload_weights(dist::Communicator& comm, const std::string& model_dir);
Status send_stop(dist::Communicator& comm);
Result<PlanMessage> receive_plan(dist::Communicator& comm);

}  // namespace sy::engine
