#include "engine/kv_cache.h"

#include <cassert>

#include <xxhash.h>

namespace sy::engine {

KvCache::KvCache(int64_t num_blocks, int block_size, int64_t route_row_ints)
    : block_size_(block_size), route_row_ints_(route_row_ints), blocks_(static_cast<size_t>(num_blocks)) {
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> KvCache::allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    block = lru_.front();
    lru_.pop_front();
    forget_hash(block);
  } else {
    return std::nullopt;
  }
  blocks_[block].ref_count = 1;
  return block;
}

std::optional<int32_t> KvCache::lookup(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  Block& block = blocks_[it->second];
  if (block.ref_count == 0) lru_.erase(block.lru_position);
  ++block.ref_count;
  return it->second;
}

void KvCache::release(int32_t index) {
  Block& block = blocks_[index];
  assert(block.ref_count > 0);
  if (--block.ref_count > 0) return;
  if (block.hash) {
    lru_.push_back(index);
    block.lru_position = std::prev(lru_.end());
  } else {
    free_.push_back(index);
  }
}

void KvCache::publish(int32_t index, uint64_t hash, std::vector<int32_t> routes) {
  Block& block = blocks_[index];
  if (block.hash || by_hash_.count(hash)) return;  // already known: keep the first copy
  block.hash = hash;
  block.routes = std::move(routes);
  by_hash_[hash] = index;
}

void KvCache::forget_hash(int32_t index) {
  Block& block = blocks_[index];
  if (!block.hash) return;
  auto it = by_hash_.find(*block.hash);
  if (it != by_hash_.end() && it->second == index) by_hash_.erase(it);
  block.hash.reset();
  block.routes.clear();
  block.routes.shrink_to_fit();
}

void KvCache::flush() {
  for (int32_t index : lru_) {
    forget_hash(index);
    free_.push_back(index);
  }
  lru_.clear();
  for (size_t i = 0; i < blocks_.size(); ++i) forget_hash(static_cast<int32_t>(i));
  by_hash_.clear();
}

uint64_t KvCache::chain_hash(uint64_t previous, const int32_t* tokens, const int32_t* forced_routes,
                             const uint8_t* forced, int count, int64_t route_row_ints) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0x5357594152440001ull);
  XXH64_update(state, &previous, sizeof previous);
  XXH64_update(state, tokens, sizeof(int32_t) * static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    uint8_t is_forced = forced ? forced[i] : 0;
    XXH64_update(state, &is_forced, 1);
    if (is_forced)
      XXH64_update(state, forced_routes + i * route_row_ints, sizeof(int32_t) * static_cast<size_t>(route_row_ints));
  }
  uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

}  // namespace sy::engine
