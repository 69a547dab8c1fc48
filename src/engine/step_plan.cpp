#include "engine/step_plan.h"

#include <cstring>

namespace sy::engine {
namespace {

struct Header {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  int64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 16);

// Flags and counts first, then the arrays in this order.
struct StepHeader {
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 0;
  uint32_t flags = 0;  // 1: capture_routes, 2: capture_weights
  uint32_t state_copies = 0;  // {from, to} pairs (linear-attention state snapshots)
  int64_t tokens = 0;
  int64_t block_table_entries = 0;
  int64_t logits_rows = 0;
  int64_t forced = 0;
  int64_t forced_routes = 0;
  int64_t state_entries = 0;  // state_read and state_write (linear-attention models)
};

template <typename T>
void put(std::vector<uint8_t>& out, const std::vector<T>& values) {
  const size_t at = out.size();
  out.resize(at + values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size() * sizeof(T));
}

class Reader {
 public:
  Reader(const uint8_t* data, int64_t bytes) : data_(data), left_(bytes) {}
  template <typename T>
  Status take(std::vector<T>& values, int64_t count, const char* what) {
    if (count < 0 || count > left_ / static_cast<int64_t>(sizeof(T)))
      return Status::errorf("step plan: {} entries of {} do not fit the {} bytes left", count, what,
                            left_);
    values.resize(static_cast<size_t>(count));
    if (count) std::memcpy(values.data(), data_, static_cast<size_t>(count) * sizeof(T));
    data_ += count * static_cast<int64_t>(sizeof(T));
    left_ -= count * static_cast<int64_t>(sizeof(T));
    return Status::ok();
  }
  int64_t left() const { return left_; }

 private:
  const uint8_t* data_;
  int64_t left_;
};

}  // namespace

std::vector<uint8_t> encode_step(const model::StepInputs& step) {
  StepHeader h;
  h.num_seqs = step.num_seqs;
  h.max_blocks_per_seq = step.max_blocks_per_seq;
  h.flags = (step.capture_routes ? 1u : 0u) | (step.capture_weights ? 2u : 0u);
  h.tokens = static_cast<int64_t>(step.token_ids.size());
  h.block_table_entries = static_cast<int64_t>(step.block_tables.size());
  h.logits_rows = static_cast<int64_t>(step.logits_rows.size());
  h.forced = static_cast<int64_t>(step.forced.size());
  h.forced_routes = static_cast<int64_t>(step.forced_routes.size());
  h.state_entries = static_cast<int64_t>(step.state_read.size());
  h.state_copies = static_cast<uint32_t>(step.state_copies.size());
  std::vector<int32_t> copies;
  for (const auto& [from, to] : step.state_copies) copies.insert(copies.end(), {from, to});
  std::vector<uint8_t> out(sizeof(h));
  std::memcpy(out.data(), &h, sizeof(h));
  put(out, step.token_ids);
  put(out, step.positions);
  put(out, step.token_seq);
  put(out, step.slot_mapping);
  put(out, step.block_tables);
  put(out, step.logits_rows);
  put(out, step.forced);
  put(out, step.forced_routes);
  put(out, step.state_read);
  put(out, step.state_write);
  put(out, copies);
  return out;
}

Result<model::StepInputs> decode_step(const uint8_t* data, int64_t bytes) {
  StepHeader h;
  if (bytes < static_cast<int64_t>(sizeof(h)))
    return Status::errorf("step plan: {} bytes, shorter than its header", bytes);
  std::memcpy(&h, data, sizeof(h));
  Reader in(data + sizeof(h), bytes - static_cast<int64_t>(sizeof(h)));
  model::StepInputs step;
  step.num_seqs = h.num_seqs;
  step.max_blocks_per_seq = h.max_blocks_per_seq;
  step.capture_routes = (h.flags & 1u) != 0;
  step.capture_weights = (h.flags & 2u) != 0;
  SY_TRY(in.take(step.token_ids, h.tokens, "token_ids"));
  SY_TRY(in.take(step.positions, h.tokens, "positions"));
  SY_TRY(in.take(step.token_seq, h.tokens, "token_seq"));
  SY_TRY(in.take(step.slot_mapping, h.tokens, "slot_mapping"));
  SY_TRY(in.take(step.block_tables, h.block_table_entries, "block_tables"));
  SY_TRY(in.take(step.logits_rows, h.logits_rows, "logits_rows"));
  SY_TRY(in.take(step.forced, h.forced, "forced"));
  SY_TRY(in.take(step.forced_routes, h.forced_routes, "forced_routes"));
  SY_TRY(in.take(step.state_read, h.state_entries, "state_read"));
  SY_TRY(in.take(step.state_write, h.state_entries, "state_write"));
  std::vector<int32_t> copies;
  SY_TRY(in.take(copies, 2 * int64_t{h.state_copies}, "state_copies"));
  for (size_t i = 0; i < copies.size(); i += 2)
    step.state_copies.emplace_back(copies[i], copies[i + 1]);
  if (in.left() != 0) return Status::errorf("step plan: {} bytes left over", in.left());
  if (h.num_seqs < 0 || h.max_blocks_per_seq < 0 ||
      h.block_table_entries != int64_t{h.num_seqs} * h.max_blocks_per_seq)
    return Status::errorf("step plan: block table of {} entries for {} sequences x {} blocks",
                          h.block_table_entries, h.num_seqs, h.max_blocks_per_seq);
  if (h.state_entries != 0 && h.state_entries != h.num_seqs)
    return Status::errorf("step plan: state buffers for {} sequences in a step of {}",
                          h.state_entries, h.num_seqs);
  if (h.forced != 0 && h.forced != h.tokens)
    return Status::errorf("step plan: {} forced flags for {} tokens", h.forced, h.tokens);
  for (int32_t seq : step.token_seq)
    if (seq < 0 || seq >= h.num_seqs)
      return Status::errorf("step plan: token of sequence {} in a step of {}", seq, h.num_seqs);
  for (int32_t row : step.logits_rows)
    if (row < 0 || row >= h.tokens)
      return Status::errorf("step plan: logits row {} in a step of {} tokens", row, h.tokens);
  return step;
}

namespace {

Status send(dist::Communicator& comm, PlanKind kind, const std::vector<uint8_t>& payload) {
  Header header;
  header.kind = static_cast<uint32_t>(kind);
  header.payload_bytes = static_cast<int64_t>(payload.size());
  SY_TRY(comm.broadcast(&header, sizeof(header), 0));
  if (payload.empty()) return Status::ok();
  // broadcast writes on the receivers only; the root's buffer is read.
  return comm.broadcast(const_cast<uint8_t*>(payload.data()), header.payload_bytes, 0);
}

}  // namespace

Status send_step(dist::Communicator& comm, const model::StepInputs& step) {
  return send(comm, PlanKind::kStep, encode_step(step));
}

Status send_reload_weights(dist::Communicator& comm, const std::string& model_dir) {
  return send(comm, PlanKind::kReloadWeights,
              std::vector<uint8_t>(model_dir.begin(), model_dir.end()));
}

Status send_stop(dist::Communicator& comm) {
  return send(comm, PlanKind::kStop, {});
}

Result<PlanMessage> receive_plan(dist::Communicator& comm) {
  Header header;
  SY_TRY(comm.broadcast(&header, sizeof(header), 0));
  if (header.payload_bytes < 0 || header.payload_bytes > (int64_t{1} << 31))
    return Status::error(ErrorCode::kInternal,
                         fmt::format("step plan: payload of {} bytes", header.payload_bytes));
  std::vector<uint8_t> payload(static_cast<size_t>(header.payload_bytes));
  if (header.payload_bytes > 0) SY_TRY(comm.broadcast(payload.data(), header.payload_bytes, 0));
  PlanMessage message;
  switch (static_cast<PlanKind>(header.kind)) {
    case PlanKind::kStep: {
      message.kind = PlanKind::kStep;
      SY_ASSIGN(message.step, decode_step(payload.data(), header.payload_bytes));
      return message;
    }
    case PlanKind::kReloadWeights:
      message.kind = PlanKind::kReloadWeights;
      message.model_dir.assign(payload.begin(), payload.end());
      return message;
    case PlanKind::kStop:
      message.kind = PlanKind::kStop;
      return message;
  }
  return Status::error(ErrorCode::kInternal,
                       fmt::format("step plan: unknown message kind {}", header.kind));
}

}  // namespace sy::engine
