#include "engine/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <xxhash.h>

namespace sy::engine {

RoutePacking::RoutePacking(int64_t num_layers, int64_t top_k, int64_t num_experts, std::vector<int> moe_layers)
    : num_layers_(num_layers), top_k_(top_k), id_bytes_(num_experts <= 256 ? 1 : 2), moe_layers_(std::move(moe_layers)) {}

void RoutePacking::pack(const int32_t* row, uint8_t* out) const {
  if (id_bytes_ ==
      1) {  // every published block's rows pass here: keep the common case a plain narrowing copy
    for (int layer : moe_layers_)
      for (int64_t k = 0; k < top_k_; ++k) *out++ = static_cast<uint8_t>(row[layer * top_k_ + k]);
    return;
  }
  for (int layer : moe_layers_)
    for (int64_t k = 0; k < top_k_; ++k) {
      const uint32_t id = static_cast<uint32_t>(row[layer * top_k_ + k]);
      *out++ = static_cast<uint8_t>(id);
      *out++ = static_cast<uint8_t>(id >> 8);
    }
}

void RoutePacking::unpack(const uint8_t* in, int32_t* row) const {
  std::fill_n(row, row_ints(), 0);
  for (int layer : moe_layers_)
    for (int64_t k = 0; k < top_k_; ++k) {
      int32_t id = *in++;
      if (id_bytes_ == 2) id |= static_cast<int32_t>(*in++) << 8;
      row[layer * top_k_ + k] = id;
    }
}

KvCache::KvCache(int64_t num_blocks, int block_size, RoutePacking packing)
    : block_size_(block_size), packing_(std::move(packing)), blocks_(static_cast<size_t>(num_blocks)) {
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

bool KvCache::matches(const Block& block, int32_t parent, const BlockContent& expected) const {
  const uint64_t parent_generation = parent < 0 ? 0 : blocks_[parent].generation;
  if (parent >= 0 && parent_generation == 0) return false;  // the parent is not registered (any more)
  if (block.parent_generation != parent_generation) return false;
  if (!std::equal(block.tokens.begin(), block.tokens.end(), expected.tokens)) return false;
  for (int i = 0; i < block_size_; ++i)
    if (block.forced[i] != (expected.forced ? expected.forced[i] : 0)) return false;
  const int64_t known = std::min<int64_t>(expected.known_rows, block_size_);
  if (known > block.known_rows) return false;
  std::vector<uint8_t> packed(static_cast<size_t>(packing_.row_bytes()));
  for (int64_t i = 0; i < known; ++i) {
    packing_.pack(expected.routes + i * packing_.row_ints(), packed.data());
    if (!std::equal(packed.begin(), packed.end(), block.routes.begin() + i * packing_.row_bytes())) return false;
  }
  return true;
}

std::optional<int32_t> KvCache::find(uint64_t hash, int32_t parent,
                                     const BlockContent& expected) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  if (!matches(blocks_[it->second], parent, expected))
    return std::nullopt;  // a collision, or other routes
  return it->second;
}

std::optional<int32_t> KvCache::lookup(uint64_t hash, int32_t parent,
                                       const BlockContent& expected) {
  const std::optional<int32_t> found = find(hash, parent, expected);
  if (!found) return std::nullopt;
  Block& block = blocks_[*found];
  if (block.ref_count == 0) lru_.erase(block.lru_position);
  ++block.ref_count;
  return found;
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

bool KvCache::publish(int32_t index, uint64_t hash, int32_t parent, const BlockContent& content) {
  Block& block = blocks_[index];
  if (block.hash || by_hash_.count(hash)) return false;  // already known: keep the first copy
  const uint64_t parent_generation = parent < 0 ? 0 : blocks_[parent].generation;
  if (parent >= 0 && parent_generation == 0) return false;
  block.hash = hash;
  block.generation = next_generation_++;
  block.parent_generation = parent_generation;
  block.tokens.assign(content.tokens, content.tokens + block_size_);
  block.forced.assign(static_cast<size_t>(block_size_), 0);
  if (content.forced) block.forced.assign(content.forced, content.forced + block_size_);
  block.known_rows = content.routes ? std::min<int64_t>(content.known_rows, block_size_) : 0;
  block.routes.assign(static_cast<size_t>(block.known_rows * packing_.row_bytes()), 0);
  for (int64_t i = 0; i < block.known_rows; ++i)
    packing_.pack(content.routes + i * packing_.row_ints(), block.routes.data() + i * packing_.row_bytes());
  by_hash_[hash] = index;
  return true;
}

void KvCache::routes(int32_t index, int32_t* out) const {
  const Block& block = blocks_[index];
  for (int64_t i = 0; i < block.known_rows; ++i)
    packing_.unpack(block.routes.data() + i * packing_.row_bytes(), out + i * packing_.row_ints());
}

void KvCache::forget_hash(int32_t index) {
  Block& block = blocks_[index];
  if (!block.hash) return;
  auto it = by_hash_.find(*block.hash);
  if (it != by_hash_.end() && it->second == index) by_hash_.erase(it);
  block.hash.reset();
  block.generation = block.parent_generation = 0;
  block.known_rows = 0;
  for (auto* v : {&block.routes, &block.forced}) {
    v->clear();
    v->shrink_to_fit();
  }
  block.tokens.clear();
  block.tokens.shrink_to_fit();
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
