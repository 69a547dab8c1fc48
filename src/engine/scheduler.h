// Scheduler: decides what runs each step — continuous batching under caps on sequences and tokens,
// chunked prefill, prefix-cache lookup, preemption by recompute of the newest running sequence —
// and owns the sequences' KV blocks (reserve, publish to the prefix cache, release). It knows
// nothing of the model: the engine runs the chunks it returns and reports back what was computed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/sequence.h"

namespace sy::engine {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_prompt_logprob_rows = 256;
  bool enable_prefix_caching = true;
  bool capture_routes = false;  // cached blocks then carry routes; a hit restores them
  int64_t route_row_ints = 0;   // num_hidden_layers * top_k
  // Models with linear attention: a state slot per running sequence (slots 0 .. max_num_seqs-1,
  // Sequence::state_slot), taken at admission and given back with the blocks.
  bool state_slots = false;
  // With state slots and the prefix cache: state buffers for snapshots of the linear-attention
  // state after a prompt's last full block (state buffers 2 * max_num_seqs + i), so that a
  // prefix hit ending there resumes from the state there. 0: no prefix hits for such models.
  int state_snapshots = 0;
};

// A whole-buffer copy of linear-attention state that the next step does before its layers.
struct StateCopy {
  int32_t from = 0, to = 0;
};

// Positions [begin, begin + count) of `seq` run this step.
struct ScheduledChunk {
  Sequence* seq;
  int64_t begin, count;
};

struct SchedulerStats {
  int64_t preemptions_total = 0;
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hits_tokens = 0;
  int64_t state_snapshots_taken = 0;
  int64_t state_snapshots_restored = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvCache& kv) : config_(config), kv_(kv) {
    if (config_.state_slots)
      for (int32_t slot = config_.max_num_seqs - 1; slot >= 0; --slot)
        free_state_slots_.push_back(slot);
    if (config_.state_slots && config_.enable_prefix_caching)
      snapshots_.resize(static_cast<size_t>(std::max(config_.state_snapshots, 0)));
  }

  void add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }
  // This step's chunks: running sequences first (oldest first; when blocks run out the newest
  // running one is preempted), then waiting ones in order while tokens, slots and blocks allow.
  // With admission paused (a weight update drains) only preempted sequences are admitted.
  // A sequence that cannot fit even in an empty cache is moved to `rejected`.
  std::vector<ScheduledChunk> schedule(bool admission_paused,
                                       std::vector<std::unique_ptr<Sequence>>& rejected);
  // After a successful step: positions up to `end` of seq are computed; full blocks are published;
  // a linear-attention state is now in the sequence's other buffer (its parity flips), and if
  // `end` is the sequence's snapshot boundary a snapshot of it is queued (state_copies()).
  void computed(Sequence& seq, int64_t end);
  // The state copies the next step must do before its layers (snapshots taken, hits restored),
  // in order; state_copies_done() once a step that did them succeeded.
  std::vector<StateCopy> state_copies() const;
  void state_copies_done();
  // Publishes seq's full blocks below `end` now, before computed() (whose publishing then finds
  // them done): once a step's routes are logged, while the device finishes the step.
  void publish(Sequence& seq, int64_t end);
  // Removes a running or waiting sequence (by pointer or id), giving its blocks back.
  std::unique_ptr<Sequence> remove(const Sequence* seq);
  std::unique_ptr<Sequence> remove(RequestId id);
  // Everything, running then waiting, blocks given back (shutdown).
  std::vector<std::unique_ptr<Sequence>> remove_all();

  bool has_running() const { return !running_.empty(); }
  bool has_waiting() const { return !waiting_.empty(); }
  // Something runs or could be admitted now.
  bool has_work(bool admission_paused) const {
    return has_running() || can_admit(admission_paused);
  }
  // Running, or preempted (its KV, route log and tokens so far came from the current weights).
  bool in_flight() const {
    return !running_.empty() || (!waiting_.empty() && waiting_.front()->started);
  }
  int64_t running_count() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting_count() const { return static_cast<int64_t>(waiting_.size()); }
  const SchedulerStats& stats() const { return stats_; }

 private:
  bool can_admit(bool admission_paused) const {
    return !waiting_.empty() && (!admission_paused || waiting_.front()->started);
  }
  bool reserve(Sequence& seq, int64_t end);
  void free_blocks(Sequence& seq);
  void lookup_prefix(Sequence& seq);
  void count_prefix_hit(Sequence& seq);
  // Linear-attention models: the position after the prompt's last full block that leaves a
  // token to compute (where its state is snapshotted; 0: none, or no snapshots).
  int64_t snapshot_boundary(const Sequence& seq) const;
  int32_t snapshot_of(int32_t block) const;  // a valid snapshot after `block`, or -1
  void take_snapshot(Sequence& seq, int64_t end);
  int32_t snapshot_buffer(int32_t snapshot) const { return 2 * config_.max_num_seqs + snapshot; }
  void preempt(std::unique_ptr<Sequence> seq);
  std::vector<uint8_t> forced_mask(const Sequence& seq, int64_t index) const;
  uint64_t block_hash(Sequence& seq, int64_t index);
  BlockContent block_content(const Sequence& seq, int64_t index,
                             const std::vector<uint8_t>& forced) const;

  SchedulerConfig config_;
  KvCache& kv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // preempted ones at the front
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<int32_t> free_state_slots_;  // never fewer than max_num_seqs - running
  // Linear-attention state snapshots: each follows one registration of one cached block.
  struct Snapshot {
    int32_t block = -1;
    uint64_t generation = 0;  // kv_.generation(block) when taken (0: empty)
    int pins = 0;             // hits whose restore has not run yet
    uint64_t last_used = 0;   // eviction: least recently taken or hit first
  };
  std::vector<Snapshot> snapshots_;
  uint64_t snapshot_clock_ = 0;
  // Copies for the next step, in order; a restore names its sequence (dropped if it leaves first).
  struct PendingCopy {
    StateCopy copy;
    Sequence* owner = nullptr;  // restores only
    int32_t restored = -1;      // the snapshot a restore reads (unpinned when done), else -1
  };
  std::vector<PendingCopy> pending_copies_;
  SchedulerStats stats_;
};

}  // namespace sy::engine
