#include "engine/scheduler.h"

#include <algorithm>

namespace sy::engine {

std::vector<ScheduledChunk> Scheduler::schedule(bool admission_paused,
                                                std::vector<std::unique_ptr<Sequence>>& rejected) {
  std::vector<ScheduledChunk> batch;
  int64_t budget = config_.max_num_batched_tokens;
  // Logits rows for prompt_logprobs: a sequence that scores its prompt gets at most what is left
  // of this step's rows (at least one token, so it always advances).
  int64_t score_rows = std::max(config_.max_prompt_logprob_rows, 1);
  auto tokens_to_run = [&](const Sequence& seq) {
    int64_t count =
        std::min<int64_t>(static_cast<int64_t>(seq.tokens.size()) - seq.num_computed, budget);
    // A chunk ends at the snapshot boundary, where the state is snapshotted.
    const int64_t boundary = snapshot_boundary(seq);
    if (seq.num_computed < boundary && seq.num_computed + count > boundary)
      count = boundary - seq.num_computed;
    if (!scores_prompt(seq)) return count;
    const int64_t unscored_from = std::max(seq.num_computed, seq.prompt_scored);
    return std::min(count, unscored_from - seq.num_computed + std::max<int64_t>(score_rows, 1));
  };
  auto take = [&](Sequence& seq, int64_t count) {
    batch.push_back({&seq, seq.num_computed, count});
    budget -= count;
    score_rows -= prompt_rows_to_score(seq, seq.num_computed, count);
  };
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    const int64_t count = tokens_to_run(seq);
    if (reserve(seq, seq.num_computed + count)) {
      take(seq, count);
      ++i;
      continue;
    }
    // Out of blocks: the newest running sequence gives its blocks back (maybe this one).
    std::unique_ptr<Sequence> victim = std::move(running_.back());
    running_.pop_back();
    for (auto it = batch.begin(); it != batch.end(); ++it)
      if (it->seq == victim.get()) {
        budget += it->count;
        score_rows += prompt_rows_to_score(*victim, it->begin, it->count);
        batch.erase(it);
        break;
      }
    const bool was_current = victim.get() == &seq;
    preempt(std::move(victim));
    if (was_current) break;
  }
  while (budget > 0 && can_admit(admission_paused) &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    if (!seq.prefix_lookup_done) lookup_prefix(seq);
    const int64_t count = tokens_to_run(seq);
    if (!reserve(seq, seq.num_computed + count)) {
      // A waiting sequence holds no blocks: give back its prefix hits too (it looks up again).
      free_blocks(seq);
      seq.num_computed = 0;
      seq.prefix_lookup_done = false;
      if (running_.empty() && batch.empty()) {
        // Not even one sequence fits: the request can never run in this cache.
        rejected.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
      break;
    }
    take(seq, count);
    count_prefix_hit(seq);
    seq.started = true;
    if (config_.state_slots) {  // running_ < max_num_seqs: a slot is free
      seq.state_slot = free_state_slots_.back();
      seq.state_parity = 0;
      free_state_slots_.pop_back();
      if (seq.restore_snapshot >= 0)  // a prefix hit: its state comes from the snapshot
        pending_copies_.push_back({{snapshot_buffer(seq.restore_snapshot), seq.state_read_buffer()},
                                   &seq,
                                   seq.restore_snapshot});
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return batch;
}

void Scheduler::computed(Sequence& seq, int64_t end) {
  seq.num_computed = end;
  publish(seq, end);
  if (seq.state_slot < 0) return;
  seq.state_parity ^= 1;  // the step wrote the state into the other buffer
  if (end == snapshot_boundary(seq)) take_snapshot(seq, end);
}

int64_t Scheduler::snapshot_boundary(const Sequence& seq) const {
  if (snapshots_.empty()) return 0;
  const int64_t bs = kv_.block_size();
  return (seq.prompt_len - 1) / bs * bs;
}

int32_t Scheduler::snapshot_of(int32_t block) const {
  const uint64_t generation = kv_.generation(block);
  if (generation == 0) return -1;
  for (size_t i = 0; i < snapshots_.size(); ++i)
    if (snapshots_[i].block == block && snapshots_[i].generation == generation)
      return static_cast<int32_t>(i);
  return -1;
}

// Queues a copy of seq's state (after positions [0, end), end a block boundary) into a snapshot
// that follows its block end/bs - 1, unless one is there already or every snapshot is pinned.
void Scheduler::take_snapshot(Sequence& seq, int64_t end) {
  const size_t index = static_cast<size_t>(end / kv_.block_size() - 1);
  if (seq.cached_blocks.size() <= index) return;  // not in the prefix cache: nothing could hit it
  const int32_t block = seq.cached_blocks[index];
  if (block < 0 || kv_.generation(block) != seq.cached_generations[index]) return;
  if (const int32_t existing = snapshot_of(block); existing >= 0) {
    snapshots_[static_cast<size_t>(existing)].last_used = ++snapshot_clock_;
    return;
  }
  int32_t victim = -1;
  for (size_t i = 0; i < snapshots_.size(); ++i) {
    const Snapshot& candidate = snapshots_[i];
    if (candidate.pins > 0) continue;
    if (victim < 0 || candidate.last_used < snapshots_[static_cast<size_t>(victim)].last_used)
      victim = static_cast<int32_t>(i);
  }
  if (victim < 0) return;
  snapshots_[static_cast<size_t>(victim)] = {block, kv_.generation(block), 0, ++snapshot_clock_};
  pending_copies_.push_back({{seq.state_read_buffer(), snapshot_buffer(victim)}, nullptr, -1});
  ++stats_.state_snapshots_taken;
}

std::vector<StateCopy> Scheduler::state_copies() const {
  std::vector<StateCopy> copies;
  for (const PendingCopy& pending : pending_copies_) copies.push_back(pending.copy);
  return copies;
}

void Scheduler::state_copies_done() {
  for (const PendingCopy& pending : pending_copies_) {
    if (pending.restored < 0) continue;
    --snapshots_[static_cast<size_t>(pending.restored)].pins;
    pending.owner->restore_snapshot = -1;
    ++stats_.state_snapshots_restored;
  }
  pending_copies_.clear();
}

void Scheduler::publish(Sequence& seq, int64_t end) {
  if (!config_.enable_prefix_caching) return;
  const int64_t bs = kv_.block_size();
  const int64_t full = end / bs;
  for (int64_t b = seq.published_blocks; b < full; ++b) {
    if (config_.capture_routes && seq.route_rows < (b + 1) * bs) break;
    seq.published_blocks = b + 1;
    // The chain continues from the cached block for b - 1 while it still holds that content.
    const int32_t parent = b ? seq.cached_blocks[b - 1] : -1;
    const bool chained =
        b == 0 || (parent >= 0 && kv_.generation(parent) == seq.cached_generations[b - 1]);
    std::optional<int32_t> cached;
    if (chained) {
      const std::vector<uint8_t> forced = forced_mask(seq, b);
      const BlockContent content = block_content(seq, b, forced);
      const uint64_t hash = block_hash(seq, b);
      cached = kv_.publish(seq.blocks[b], hash, parent, content) ? seq.blocks[b]
                                                                 : kv_.find(hash, parent, content);
    }
    seq.cached_blocks.push_back(cached ? *cached : -1);
    seq.cached_generations.push_back(cached ? kv_.generation(*cached) : 0);
  }
}

std::unique_ptr<Sequence> Scheduler::remove(const Sequence* seq) {
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == seq) {
      std::unique_ptr<Sequence> removed = std::move(*it);
      running_.erase(it);
      free_blocks(*removed);
      return removed;
    }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (it->get() == seq) {
      std::unique_ptr<Sequence> removed = std::move(*it);
      waiting_.erase(it);
      free_blocks(*removed);
      return removed;
    }
  return nullptr;
}

std::unique_ptr<Sequence> Scheduler::remove(RequestId id) {
  for (const auto& seq : running_)
    if (seq->id == id) return remove(seq.get());
  for (const auto& seq : waiting_)
    if (seq->id == id) return remove(seq.get());
  return nullptr;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::remove_all() {
  std::vector<std::unique_ptr<Sequence>> all;
  for (auto& seq : running_) all.push_back(std::move(seq));
  for (auto& seq : waiting_) all.push_back(std::move(seq));
  running_.clear();
  waiting_.clear();
  for (auto& seq : all) free_blocks(*seq);
  return all;
}

// Ensures blocks for positions [0, end) exist; when the cache has too few, gives back the blocks
// this call took and returns false.
bool Scheduler::reserve(Sequence& seq, int64_t end) {
  const int64_t needed = (end + kv_.block_size() - 1) / kv_.block_size();
  const size_t held = seq.blocks.size();
  while (static_cast<int64_t>(seq.blocks.size()) < needed) {
    auto block = kv_.allocate();
    if (!block) {
      while (seq.blocks.size() > held) {
        kv_.release(seq.blocks.back());
        seq.blocks.pop_back();
      }
      return false;
    }
    seq.blocks.push_back(*block);
  }
  return true;
}

void Scheduler::free_blocks(Sequence& seq) {
  // Tail first: the LRU then evicts a prefix's last blocks before its first, and a chain whose
  // first block is gone can never be hit (lookups walk from the start).
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) kv_.release(*it);
  seq.blocks.clear();
  seq.published_blocks = 0;
  seq.cached_blocks.clear();
  seq.cached_generations.clear();
  // The linear-attention state goes with the KV: what remains of the sequence restarts at 0
  // (or at a prefix hit's snapshot). A restore still queued for it goes too (its read buffer may
  // be another sequence's by the next step); a snapshot it is taking stays queued: the next
  // step copies it before any layer could write that buffer, and copies run in queue order.
  if (seq.restore_snapshot >= 0) {
    --snapshots_[static_cast<size_t>(seq.restore_snapshot)].pins;
    seq.restore_snapshot = -1;
  }
  std::erase_if(pending_copies_, [&](const PendingCopy& pending) { return pending.owner == &seq; });
  if (seq.state_slot >= 0) {
    free_state_slots_.push_back(seq.state_slot);
    seq.state_slot = -1;
  }
}

// Positions of full block `index` whose route the request gave (its replay).
std::vector<uint8_t> Scheduler::forced_mask(const Sequence& seq, int64_t index) const {
  const int64_t begin = index * kv_.block_size();
  std::vector<uint8_t> forced(static_cast<size_t>(kv_.block_size()));
  for (int i = 0; i < kv_.block_size(); ++i) forced[i] = begin + i < seq.user_forced_rows;
  return forced;
}

// Chained hash of full block `index` of seq (its tokens and forced routes must be known).
uint64_t Scheduler::block_hash(Sequence& seq, int64_t index) {
  while (static_cast<int64_t>(seq.block_hashes.size()) <= index) {
    const int64_t b = static_cast<int64_t>(seq.block_hashes.size());
    const int64_t begin = b * kv_.block_size();
    const uint64_t previous = b ? seq.block_hashes[b - 1] : 0;
    const std::vector<uint8_t> forced = forced_mask(seq, b);
    const int32_t* routes =
        seq.routes.empty() ? nullptr : seq.routes.data() + begin * config_.route_row_ints;
    seq.block_hashes.push_back(KvCache::chain_hash(previous, seq.tokens.data() + begin, routes,
                                                   forced.data(), kv_.block_size(),
                                                   config_.route_row_ints));
  }
  return seq.block_hashes[index];
}

// Full block `index` of seq as the prefix cache compares it: tokens, forced rows, and the route
// rows the sequence has for it (given, or logged by an earlier computation).
BlockContent Scheduler::block_content(const Sequence& seq, int64_t index,
                                      const std::vector<uint8_t>& forced) const {
  const int64_t begin = index * kv_.block_size();
  BlockContent content;
  content.tokens = seq.tokens.data() + begin;
  content.forced = forced.data();
  content.known_rows = std::clamp<int64_t>(seq.route_rows - begin, 0, kv_.block_size());
  content.routes =
      content.known_rows > 0 ? seq.routes.data() + begin * config_.route_row_ints : nullptr;
  return content;
}

// Prefix-cache lookup for a sequence with nothing computed: reuse leading full blocks (always
// leaving the last token to compute) and restore their routes into the route log.
void Scheduler::lookup_prefix(Sequence& seq) {
  seq.prefix_lookup_done = true;
  // prompt_logprobs and gating weights need every prompt position computed by this request.
  if (!config_.enable_prefix_caching || seq.request.sampling.prompt_logprobs >= 0 ||
      seq.request.return_route_weights)
    return;
  const int64_t bs = kv_.block_size(), row_ints = config_.route_row_ints;
  const int64_t max_blocks = (static_cast<int64_t>(seq.tokens.size()) - 1) / bs;
  int64_t hits = 0;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const std::vector<uint8_t> forced = forced_mask(seq, b);
    auto block =
        kv_.lookup(block_hash(seq, b), b ? seq.blocks[b - 1] : -1, block_content(seq, b, forced));
    if (!block) break;
    seq.blocks.push_back(*block);
    ++hits;
  }
  if (config_.state_slots) {
    // Linear attention: a hit needs the state after its last block, which only a snapshot has.
    int32_t snapshot = -1;
    while (hits > 0 && (snapshot = snapshot_of(seq.blocks[static_cast<size_t>(hits - 1)])) < 0) {
      kv_.release(seq.blocks.back());
      seq.blocks.pop_back();
      --hits;
    }
    if (snapshot >= 0) {
      seq.restore_snapshot = snapshot;
      ++snapshots_[static_cast<size_t>(snapshot)].pins;
      snapshots_[static_cast<size_t>(snapshot)].last_used = ++snapshot_clock_;
    }
  }
  for (int64_t b = 0; b < hits; ++b) {
    if (config_.capture_routes && seq.route_rows < (b + 1) * bs) {
      // Every cached block of a capturing engine holds all its rows (publish waits for them).
      seq.routes.resize(static_cast<size_t>((b + 1) * bs * row_ints));
      kv_.routes(seq.blocks[static_cast<size_t>(b)], seq.routes.data() + b * bs * row_ints);
      seq.route_rows = (b + 1) * bs;
    }
  }
  seq.published_blocks = hits;
  seq.cached_blocks.assign(seq.blocks.begin(), seq.blocks.end());
  seq.cached_generations.clear();
  for (int32_t block : seq.cached_blocks) seq.cached_generations.push_back(kv_.generation(block));
  seq.num_computed = hits * bs;
}

// The prefix-cache figures of a sequence, counted once, at its first admission (as vLLM counts
// num_cached_tokens): a lookup whose admission then failed for want of blocks is not what served
// the request, and later admissions (after a preemption) may hit blocks it computed itself.
void Scheduler::count_prefix_hit(Sequence& seq) {
  if (seq.prefix_counted) return;
  seq.prefix_counted = true;
  seq.cached_prompt_tokens = std::min(seq.num_computed, seq.prompt_len);
  stats_.prefix_cache_queries_tokens += seq.prompt_len;
  stats_.prefix_cache_hits_tokens += seq.cached_prompt_tokens;
}

void Scheduler::preempt(std::unique_ptr<Sequence> seq) {
  free_blocks(*seq);
  seq->num_computed = 0;
  seq->prefix_lookup_done = false;
  ++stats_.preemptions_total;
  waiting_.push_front(std::move(seq));
}

}  // namespace sy::engine
