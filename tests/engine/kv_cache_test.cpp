// The block manager: ref counts, prefix hits by chained hash checked against the block's content,
// routes kept with blocks in the wire dtype, LRU eviction of unreferenced cached blocks, flush.
#include <gtest/gtest.h>

#include "engine/kv_cache.h"

namespace sy::engine {
namespace {

// Rows of 2 layers x 1 id, both MoE: a route row is {id_layer0, id_layer1}.
RoutePacking two_moe_layers() { return RoutePacking(2, 1, 16, {0, 1}); }

BlockContent content(const std::vector<int32_t>& tokens, const std::vector<int32_t>* routes = nullptr,
                     const std::vector<uint8_t>* forced = nullptr) {
  BlockContent c;
  c.tokens = tokens.data();
  c.forced = forced ? forced->data() : nullptr;
  c.routes = routes ? routes->data() : nullptr;
  c.known_rows = routes ? static_cast<int64_t>(routes->size()) / 2 : 0;
  return c;
}

TEST(KvCache, PublishedBlocksAreFoundWithTheirRoutesAndEvictedLeastRecentlyUsedFirst) {
  KvCache cache(3, 4, two_moe_layers());
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  const uint64_t h1 = KvCache::chain_hash(0, tokens.data(), nullptr, nullptr, 4, 2);
  const uint64_t h2 = KvCache::chain_hash(h1, tokens.data(), nullptr, nullptr, 4, 2);
  EXPECT_NE(h1, h2) << "the chain makes position part of the hash";
  auto a = cache.allocate(), b = cache.allocate();
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> routes_a = {9, 9, 8, 8, 7, 7, 6, 6}, routes_b = {1, 1, 2, 2, 3, 3, 4, 4};
  EXPECT_TRUE(cache.publish(*a, h1, -1, content(tokens, &routes_a)));
  EXPECT_TRUE(cache.publish(*b, h2, *a, content(tokens, &routes_b)));
  cache.release(*a);
  cache.release(*b);
  EXPECT_EQ(cache.cached(), 2);
  EXPECT_EQ(cache.used(), 0);
  auto hit = cache.lookup(h1, -1, content(tokens));
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, *a);
  std::vector<int32_t> restored(8, -1);
  cache.routes(*hit, restored.data());
  EXPECT_EQ(restored, routes_a);
  EXPECT_EQ(cache.used(), 1);
  cache.release(*hit);  // a is now the most recently used
  auto c = cache.allocate(), d = cache.allocate();  // the free block, then evicts b (LRU)
  ASSERT_TRUE(c && d);
  EXPECT_EQ(*d, *b);
  EXPECT_FALSE(cache.lookup(h2, *a, content(tokens))) << "evicted";
  EXPECT_TRUE(cache.lookup(h1, -1, content(tokens)));
  EXPECT_FALSE(cache.allocate()) << "everything referenced";
}

TEST(KvCache, ForcedRoutesAreCoveredByTheHashAndFlushForgetsEverything) {
  std::vector<int32_t> tokens = {5, 6};
  std::vector<int32_t> routes = {1, 2, 3, 4};
  std::vector<uint8_t> free_rows = {0, 0}, forced_rows = {1, 0};
  const uint64_t free_hash = KvCache::chain_hash(0, tokens.data(), routes.data(), free_rows.data(), 2, 2);
  const uint64_t forced_hash = KvCache::chain_hash(0, tokens.data(), routes.data(), forced_rows.data(), 2, 2);
  std::vector<int32_t> other = {1, 3, 3, 4};
  const uint64_t other_forced = KvCache::chain_hash(0, tokens.data(), other.data(), forced_rows.data(), 2, 2);
  EXPECT_NE(free_hash, forced_hash);
  EXPECT_NE(forced_hash, other_forced);
  KvCache cache(2, 2, two_moe_layers());
  auto block = cache.allocate();
  cache.publish(*block, free_hash, -1, content(tokens, &routes));
  cache.release(*block);
  cache.flush();
  EXPECT_FALSE(cache.lookup(free_hash, -1, content(tokens)));
  EXPECT_EQ(cache.cached(), 0);
  EXPECT_EQ(cache.free_uncached(), 2);
}

// Bug 4: the lookup trusted the hash alone. A block found under the same hash but holding other
// tokens, other forced rows, or computed after another parent block is a miss.
TEST(KvCache, AHashCollisionIsAMissNotAnotherPromptsKv) {
  KvCache cache(4, 2, two_moe_layers());
  const std::vector<int32_t> tokens = {5, 6}, other_tokens = {5, 7};
  const std::vector<int32_t> routes = {1, 2, 3, 4};
  const std::vector<uint8_t> forced = {1, 0};
  const uint64_t hash = 42;  // the same hash for everything below: a collision by construction
  auto root = cache.allocate(), other_root = cache.allocate(), child = cache.allocate();
  ASSERT_TRUE(cache.publish(*root, 7, -1, content(tokens, &routes)));
  ASSERT_TRUE(cache.publish(*child, hash, *root, content(tokens, &routes)));
  EXPECT_FALSE(cache.lookup(hash, *root, content(other_tokens))) << "other tokens";
  EXPECT_FALSE(cache.lookup(hash, *root, content(tokens, &routes, &forced))) << "a row forced here, free there";
  EXPECT_FALSE(cache.lookup(hash, -1, content(tokens))) << "another position (no parent)";
  ASSERT_TRUE(cache.publish(*other_root, 8, -1, content(other_tokens)));
  EXPECT_FALSE(cache.lookup(hash, *other_root, content(tokens))) << "computed after another parent";
  auto hit = cache.lookup(hash, *root, content(tokens));
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, *child);
  cache.release(*hit);
  // The parent evicted and registered again (same tokens, new KV): the child was computed after
  // the old one, so it is a miss.
  cache.release(*root);
  cache.release(*child);
  cache.release(*other_root);  // LRU: root, child, other_root; one block never used
  auto never_used = cache.allocate(), evicted_root = cache.allocate();
  ASSERT_TRUE(never_used && evicted_root);
  ASSERT_EQ(*evicted_root, *root);
  ASSERT_TRUE(cache.publish(*evicted_root, 7, -1, content(tokens, &routes)));
  EXPECT_FALSE(cache.lookup(hash, *evicted_root, content(tokens))) << "the child followed the old parent";
}

// Bug 5 (second half): a sequence that already has routes for a block's positions (from its
// route log, after a preemption) recomputes them replaying those routes, so a cached block whose
// KV came from other routes is a miss for it; with the same routes it is a hit.
TEST(KvCache, AHitMustHaveTheRoutesTheSequenceAlreadyLogged) {
  KvCache cache(2, 2, two_moe_layers());
  const std::vector<int32_t> tokens = {5, 6};
  const std::vector<int32_t> stored = {1, 2, 3, 4}, logged_other = {1, 2, 3, 5}, first_row = {1, 2};
  auto block = cache.allocate();
  ASSERT_TRUE(cache.publish(*block, 9, -1, content(tokens, &stored)));
  EXPECT_FALSE(cache.lookup(9, -1, content(tokens, &logged_other)));
  EXPECT_TRUE(cache.lookup(9, -1, content(tokens, &first_row))) << "one logged row, equal";
  EXPECT_TRUE(cache.lookup(9, -1, content(tokens, &stored)));
  EXPECT_TRUE(cache.lookup(9, -1, content(tokens))) << "nothing logged: the block's routes are restored";
}

// Bug 7: routes are kept in the wire dtype, MoE layers only.
TEST(KvCache, RoutesAreStoredInTheWireDtypeForMoeLayersOnly) {
  // Qwen3-30B-A3B: 48 layers, all MoE, 128 experts, top-8. int32 for every layer was 1536 B/token.
  KvCache qwen3(1, 16, RoutePacking(48, 8, 128, [] {
                  std::vector<int> all(48);
                  for (int i = 0; i < 48; ++i) all[i] = i;
                  return all;
                }()));
  EXPECT_EQ(qwen3.route_bytes_per_token(), 48 * 8 * 1);
  // More than 256 experts: two bytes an id; dense layers take no bytes and come back as 0.
  RoutePacking wide(3, 2, 300, {0, 2});
  EXPECT_EQ(wide.row_bytes(), 2 * 2 * 2);
  const std::vector<int32_t> row = {299, 256, 77, 88, 0, 255};
  std::vector<uint8_t> packed(static_cast<size_t>(wide.row_bytes()));
  wide.pack(row.data(), packed.data());
  std::vector<int32_t> back(6, -1);
  wide.unpack(packed.data(), back.data());
  EXPECT_EQ(back, (std::vector<int32_t>{299, 256, 0, 0, 0, 255}));
  EXPECT_EQ(RoutePacking(4, 4, 16, {0, 2, 3}).row_bytes(), 12) << "the golden test model: was 64 B/token";
}

}  // namespace
}  // namespace sy::engine
