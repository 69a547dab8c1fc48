// The block manager: ref counts, prefix hits by chained hash, routes kept with blocks, LRU
// eviction of unreferenced cached blocks, flush.
#include <gtest/gtest.h>

#include "engine/kv_cache.h"

namespace sy::engine {
namespace {

TEST(KvCache, PublishedBlocksAreFoundWithTheirRoutesAndEvictedLeastRecentlyUsedFirst) {
  KvCache cache(3, 4, 2);
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  const uint64_t h1 = KvCache::chain_hash(0, tokens.data(), nullptr, nullptr, 4, 2);
  const uint64_t h2 = KvCache::chain_hash(h1, tokens.data(), nullptr, nullptr, 4, 2);
  EXPECT_NE(h1, h2) << "the chain makes position part of the hash";
  auto a = cache.allocate(), b = cache.allocate();
  ASSERT_TRUE(a && b);
  cache.publish(*a, h1, {9, 9, 8, 8, 7, 7, 6, 6});
  cache.publish(*b, h2, {1, 1, 2, 2, 3, 3, 4, 4});
  cache.release(*a);
  cache.release(*b);
  EXPECT_EQ(cache.cached(), 2);
  EXPECT_EQ(cache.used(), 0);
  auto hit = cache.lookup(h1);
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, *a);
  EXPECT_EQ(cache.routes(*hit), (std::vector<int32_t>{9, 9, 8, 8, 7, 7, 6, 6}));
  EXPECT_EQ(cache.used(), 1);
  cache.release(*hit);  // a is now the most recently used
  auto c = cache.allocate(), d = cache.allocate();  // the free block, then evicts b (LRU)
  ASSERT_TRUE(c && d);
  EXPECT_EQ(*d, *b);
  EXPECT_FALSE(cache.lookup(h2)) << "evicted";
  EXPECT_TRUE(cache.lookup(h1));
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
  KvCache cache(2, 2, 2);
  auto block = cache.allocate();
  cache.publish(*block, free_hash, routes);
  cache.release(*block);
  cache.flush();
  EXPECT_FALSE(cache.lookup(free_hash));
  EXPECT_EQ(cache.cached(), 0);
  EXPECT_EQ(cache.free_uncached(), 2);
}

}  // namespace
}  // namespace sy::engine
