// KvCache: the paged KV cache's block manager. Fixed-size blocks, ref-counted; full blocks are
// hashed in a chain (xxhash over the previous hash, the tokens, and each position's forced route
// or "free") and shared across requests; unreferenced hashed blocks stay cached and are evicted
// LRU. The hash only finds a candidate: a hit also compares the block's tokens, forced rows and
// known routes, and its parent block, so a collision can never serve another prompt's KV. Each
// cached block keeps its tokens' routes in the wire dtype, MoE layers only, so a hit restores them.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace sy::engine {

// Packs a route row ([num_layers, top_k] int32, the engine's layout) into its stored form: the
// MoE layers' ids only, one byte each when the model has <= 256 experts, else two (the wire dtype).
class RoutePacking {
 public:
  RoutePacking() = default;
  RoutePacking(int64_t num_layers, int64_t top_k, int64_t num_experts, std::vector<int> moe_layers);
  int64_t row_ints() const { return num_layers_ * top_k_; }  // unpacked row
  int64_t row_bytes() const { return static_cast<int64_t>(moe_layers_.size()) * top_k_ * id_bytes_; }
  int id_bytes() const { return id_bytes_; }
  void pack(const int32_t* row, uint8_t* out) const;
  void unpack(const uint8_t* in, int32_t* row) const;  // dense layers' entries become 0

 private:
  int64_t num_layers_ = 0, top_k_ = 0;
  int id_bytes_ = 1;
  std::vector<int> moe_layers_;
};

// A full block as the engine knows it: what a publish stores and what a hit must match.
struct BlockContent {
  const int32_t* tokens = nullptr;  // [block_size]
  const uint8_t* forced = nullptr;  // [block_size]: 1 = the route was given (replay); null = none
  // Route rows [block_size, row_ints] of which the first `known_rows` are known: on publish, the
  // rows that produced the KV; on lookup, rows the sequence already has (given or logged), which
  // the block's must equal (a recompute replays them, so their KV must come from them).
  const int32_t* routes = nullptr;
  int64_t known_rows = 0;
};

class KvCache {
 public:
  KvCache(int64_t num_blocks, int block_size, RoutePacking packing);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks an allocation can get now: free ones plus unreferenced cached ones.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used() const { return num_blocks() - available(); }
  int64_t cached() const { return static_cast<int64_t>(lru_.size()); }
  int64_t free_uncached() const { return static_cast<int64_t>(free_.size()); }
  // What a cached block keeps per token besides its KV: routes (wire dtype, MoE layers), and
  // the token id and forced flag a hit is checked against.
  int64_t route_bytes_per_token() const { return packing_.row_bytes(); }
  int64_t key_bytes_per_token() const { return static_cast<int64_t>(sizeof(int32_t) + 1); }

  // A block for new content (ref 1), preferring never-hashed blocks; nullopt when none is left.
  std::optional<int32_t> allocate();
  // The cached block under `hash` whose content matches `expected` and whose parent is `parent`
  // (the block the caller holds for the previous position range; -1 for the first block); on a
  // hit takes a reference.
  std::optional<int32_t> lookup(uint64_t hash, int32_t parent, const BlockContent& expected);
  // As lookup, without taking a reference (the registered block with that content, if any).
  std::optional<int32_t> find(uint64_t hash, int32_t parent, const BlockContent& expected) const;
  void release(int32_t block);
  // Registers a full, computed block under `hash`, after `parent` (-1 for the first block; a
  // parent that is not itself registered means no registration). False when not registered.
  bool publish(int32_t block, uint64_t hash, int32_t parent, const BlockContent& content);
  // The block's stored routes, unpacked into [block_size, row_ints] (known rows only).
  int64_t known_route_rows(int32_t block) const { return blocks_[block].known_rows; }
  // The block's current registration (unique per publish; 0 = not registered): what it holds is
  // one prefix's KV for exactly as long as this stays the same.
  uint64_t generation(int32_t block) const { return blocks_[block].generation; }
  void routes(int32_t block, int32_t* out) const;
  // Forgets every hash (and the routes with them); referenced blocks stay in use.
  void flush();

  static uint64_t chain_hash(uint64_t previous, const int32_t* tokens, const int32_t* forced_routes,
                             const uint8_t* forced, int count, int64_t route_row_ints);

 private:
  struct Block {
    int ref_count = 0;
    std::optional<uint64_t> hash;
    uint64_t generation = 0;         // unique per registration; 0 = not registered
    uint64_t parent_generation = 0;  // the parent's registration it was computed after
    std::vector<int32_t> tokens;
    std::vector<uint8_t> forced;
    std::vector<uint8_t> routes;     // [block_size, packing row_bytes]
    int64_t known_rows = 0;
    std::list<int32_t>::iterator lru_position;
  };
  void forget_hash(int32_t block);
  bool matches(const Block& block, int32_t parent, const BlockContent& expected) const;

  int block_size_;
  RoutePacking packing_;
  uint64_t next_generation_ = 1;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;   // unreferenced, no hash
  std::list<int32_t> lru_;      // unreferenced, hashed: front = least recently used
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace sy::engine
