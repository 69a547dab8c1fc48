// KvCache: the paged KV cache's block manager. Fixed-size blocks, ref-counted; full blocks are
// hashed in a chain (xxhash over the previous hash, the tokens, and each position's forced route
// or "free") and shared across requests; unreferenced hashed blocks stay cached and are evicted
// LRU. Each cached block keeps its tokens' routes, so a prefix hit restores them.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace sy::engine {

class KvCache {
 public:
  KvCache(int64_t num_blocks, int block_size, int64_t route_row_ints);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks an allocation can get now: free ones plus unreferenced cached ones.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used() const { return num_blocks() - available(); }
  int64_t cached() const { return static_cast<int64_t>(lru_.size()); }
  int64_t free_uncached() const { return static_cast<int64_t>(free_.size()); }

  // A block for new content (ref 1), preferring never-hashed blocks; nullopt when none is left.
  std::optional<int32_t> allocate();
  // Looks up a full block by chained hash; on a hit takes a reference and returns it.
  std::optional<int32_t> lookup(uint64_t hash);
  void release(int32_t block);
  // Registers a full, computed block under `hash` with its tokens' routes ([block_size * row]).
  void publish(int32_t block, uint64_t hash, std::vector<int32_t> routes);
  const std::vector<int32_t>& routes(int32_t block) const { return blocks_[block].routes; }
  // Forgets every hash (and the routes with them); referenced blocks stay in use.
  void flush();

  static uint64_t chain_hash(uint64_t previous, const int32_t* tokens, const int32_t* forced_routes,
                             const uint8_t* forced, int count, int64_t route_row_ints);

 private:
  struct Block {
    int ref_count = 0;
    std::optional<uint64_t> hash;
    std::vector<int32_t> routes;
    std::list<int32_t>::iterator lru_position;
  };
  void forget_hash(int32_t block);

  int block_size_;
  int64_t route_row_ints_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;   // unreferenced, no hash
  std::list<int32_t> lru_;      // unreferenced, hashed: front = least recently used
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace sy::engine
