// The scheduler on its own, with plain fake sequences and no model: token budget and chunked
// prefill, decode after prefill, preemption of the newest running sequence, reservations that
// fail part-way, drains that admit only preempted sequences, prefix hits, rejection, slot caps.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>

#include "engine/scheduler.h"

namespace sy::engine {
namespace {

constexpr int kBlock = 16;

std::unique_ptr<Sequence> fake_sequence(RequestId id, int prompt_len, int32_t first_token = 1) {
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->tokens.resize(static_cast<size_t>(prompt_len));
  std::iota(seq->tokens.begin(), seq->tokens.end(), first_token);
  seq->request.prompt_ids = seq->tokens;
  seq->prompt_len = prompt_len;
  return seq;
}

struct Harness {
  KvCache kv;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> rejected;

  Harness(int64_t blocks, int budget, int max_seqs = 256, bool prefix_caching = true)
      : kv(blocks, kBlock, RoutePacking(1, 2, 16, {0})),
        scheduler(SchedulerConfig{max_seqs, budget, 256, prefix_caching, false, 2}, kv) {}

  // One step as the engine runs it: every chunk is computed, and a chunk that reaches the end of
  // its sequence samples one more token.
  std::vector<ScheduledChunk> step(bool paused = false) {
    std::vector<ScheduledChunk> chunks = scheduler.schedule(paused, rejected);
    for (const ScheduledChunk& c : chunks) {
      scheduler.computed(*c.seq, c.begin + c.count);
      if (c.begin + c.count == static_cast<int64_t>(c.seq->tokens.size()))
        c.seq->tokens.push_back(7);
    }
    return chunks;
  }
};

std::string describe(const std::vector<ScheduledChunk>& chunks) {
  std::string text;
  for (const auto& c : chunks)
    text += (text.empty() ? "" : " ") + std::to_string(c.seq->id) + ":" + std::to_string(c.begin) +
            "+" + std::to_string(c.count);
  return text;
}

TEST(Scheduler, ChunksPrefillsUnderTheTokenBudgetThenDecodes) {
  Harness h(64, 32);
  h.scheduler.add(fake_sequence(1, 40));
  h.scheduler.add(fake_sequence(2, 30, 100));
  EXPECT_EQ(describe(h.step()), "1:0+32") << "the first prompt takes the whole budget";
  EXPECT_EQ(describe(h.step()), "1:32+8 2:0+24") << "running first, then the next waiting one";
  EXPECT_EQ(describe(h.step()), "1:40+1 2:24+6")
      << "1 decodes (its sampled token), 2 finishes prefill";
  EXPECT_EQ(describe(h.step()), "1:41+1 2:30+1");
  EXPECT_EQ(h.scheduler.running_count(), 2);
  EXPECT_EQ(h.kv.used(), 3 + 2) << "blocks for 42 and 31 tokens";
}

TEST(Scheduler, OutOfBlocksPreemptsTheNewestRunningSequence) {
  Harness h(5, 256);
  h.scheduler.add(fake_sequence(1, 47));       // 3 blocks, the 4th at position 48
  h.scheduler.add(fake_sequence(2, 31, 200));  // 2 blocks
  EXPECT_EQ(describe(h.step()), "1:0+47 2:0+31");
  EXPECT_EQ(h.kv.used(), 5);
  EXPECT_EQ(describe(h.step()), "1:47+1 2:31+1") << "both still fit their blocks";
  // 1 now needs a 4th block: none is free, so 2 (the newest) gives its blocks back and waits at
  // the front; 1 runs alone.
  EXPECT_EQ(describe(h.step()), "1:48+1");
  EXPECT_EQ(h.scheduler.stats().preemptions_total, 1);
  EXPECT_EQ(h.scheduler.running_count(), 1);
  EXPECT_EQ(h.scheduler.waiting_count(), 1);
  EXPECT_TRUE(h.scheduler.in_flight());
  EXPECT_EQ(h.kv.used(), 4);
  auto done = h.scheduler.remove(RequestId{1});
  ASSERT_TRUE(done);
  EXPECT_EQ(done->num_computed, 49);
  // 2 comes back: its first block is a prefix hit (blocks are given back tail first, so the
  // eviction for 1 took its second); the rest is recomputed.
  EXPECT_EQ(describe(h.step()), "2:16+17");
  EXPECT_EQ(h.scheduler.remove(RequestId{2})->cached_prompt_tokens, 0)
      << "its own blocks are not cached tokens";
  EXPECT_EQ(h.kv.used(), 0);
}

TEST(Scheduler, AReservationThatFailsPartWayTakesNothing) {
  Harness h(6, 256);
  h.scheduler.add(fake_sequence(1, 40));  // 3 blocks
  EXPECT_EQ(describe(h.step()), "1:0+40");
  h.scheduler.add(fake_sequence(2, 80, 500));  // 5 blocks: only 3 are free
  const int64_t available = h.kv.available();
  EXPECT_EQ(describe(h.step()), "1:40+1");
  EXPECT_EQ(h.kv.available(), available) << "2 was not admitted and holds nothing";
  EXPECT_EQ(h.scheduler.waiting_count(), 1);
  EXPECT_TRUE(h.rejected.empty()) << "2 fits an empty cache: it waits";
}

TEST(Scheduler, WhilePausedOnlyPreemptedSequencesAreAdmitted) {
  Harness h(5, 256);
  h.scheduler.add(fake_sequence(1, 47));
  h.scheduler.add(fake_sequence(2, 31, 200));
  h.step();
  h.step();
  h.step();  // 2 preempted
  ASSERT_EQ(h.scheduler.stats().preemptions_total, 1);
  h.scheduler.add(fake_sequence(3, 5, 900));  // arrives during the drain
  h.scheduler.remove(RequestId{1});
  EXPECT_EQ(describe(h.step(/*paused=*/true)), "2:16+17")
      << "the preempted sequence finishes first";
  EXPECT_TRUE(h.scheduler.in_flight());
  h.scheduler.remove(RequestId{2});
  EXPECT_FALSE(h.scheduler.in_flight()) << "3 never started: the drain may run";
  EXPECT_FALSE(h.scheduler.has_work(true));
  EXPECT_TRUE(h.step(true).empty());
  EXPECT_EQ(describe(h.step(false)), "3:0+5") << "admitted once the pause ends";
}

TEST(Scheduler, PrefixHitsSkipCachedBlocksAndCountOnce) {
  Harness h(16, 256);
  h.scheduler.add(fake_sequence(1, 40));
  h.step();
  h.scheduler.remove(RequestId{1});  // its 2 full blocks stay cached
  h.scheduler.add(fake_sequence(2, 40));
  EXPECT_EQ(describe(h.step()), "2:32+8");
  auto second = h.scheduler.remove(RequestId{2});
  EXPECT_EQ(second->cached_prompt_tokens, 32);
  EXPECT_EQ(h.scheduler.stats().prefix_cache_hits_tokens, 32);
  EXPECT_EQ(h.scheduler.stats().prefix_cache_queries_tokens, 80);
  // A prompt of exactly two blocks leaves its last token to compute (its logits are needed).
  h.scheduler.add(fake_sequence(3, 32));
  EXPECT_EQ(describe(h.step()), "3:16+16");
}

// A waiting sequence's prefix hit is counted when it is admitted, not at a lookup whose admission
// failed: 2 first looks up before 1's blocks are cached (no hit) and does not fit, then is
// admitted with 1's two full blocks as its hit (vLLM counts num_cached_tokens so too).
TEST(Scheduler, APrefixHitCountsAtAdmissionNotAtAFailedLookup) {
  Harness h(4, 256);
  h.scheduler.add(fake_sequence(1, 47));
  h.scheduler.add(fake_sequence(2, 50));  // the same first 47 tokens: 4 blocks, 2 of them 1's
  EXPECT_EQ(describe(h.step()), "1:0+47") << "2 needs 4 blocks, 1 free";
  EXPECT_EQ(describe(h.step()), "1:47+1") << "2 would hit 2 blocks but needs 2 more, 1 free";
  h.scheduler.remove(RequestId{1});  // its full blocks stay cached
  EXPECT_EQ(describe(h.step()), "2:32+18");
  auto second = h.scheduler.remove(RequestId{2});
  EXPECT_EQ(second->cached_prompt_tokens, 32);
  EXPECT_EQ(h.scheduler.stats().prefix_cache_hits_tokens, 32);
  EXPECT_EQ(h.scheduler.stats().prefix_cache_queries_tokens, 47 + 50);
}

// Two sequences with the same first two blocks, admitted together (no hit: nothing is cached
// yet): the second's duplicates are not registered, but its third block continues the chain of
// the first's cached copies, so a later prompt equal to the second's hits all three blocks.
TEST(Scheduler, ASequenceDuplicatingCachedBlocksContinuesTheirChain) {
  Harness h(32, 256);
  h.scheduler.add(fake_sequence(1, 40));
  auto b = fake_sequence(2, 60);
  std::iota(b->tokens.begin() + 32, b->tokens.end(), 500);  // blocks 0-1 as 1's, then its own
  b->request.prompt_ids = b->tokens;
  const std::vector<int32_t> b_tokens = b->tokens;
  h.scheduler.add(std::move(b));
  EXPECT_EQ(describe(h.step()), "1:0+40 2:0+60");
  h.scheduler.remove(RequestId{1});
  h.scheduler.remove(RequestId{2});
  auto c = fake_sequence(3, 60);
  c->tokens = b_tokens;
  c->request.prompt_ids = b_tokens;
  h.scheduler.add(std::move(c));
  EXPECT_EQ(describe(h.step()), "3:48+12");
}

// Linear-attention models with snapshots: a prompt's prefill chunk ends at its snapshot
// boundary (the start of the block holding its last token), the tail runs in the next step.
TEST(Scheduler, WithStateSnapshotsAPrefillChunkEndsAtTheSnapshotBoundary) {
  KvCache kv(32, kBlock, RoutePacking(1, 2, 16, {0}));
  Scheduler scheduler(SchedulerConfig{4, 256, 256, true, false, 2, true, 2}, kv);
  std::vector<std::unique_ptr<Sequence>> rejected;
  scheduler.add(fake_sequence(1, 40));
  scheduler.add(fake_sequence(2, 16, 100));  // boundary 0: no snapshot, no cut
  auto chunks = scheduler.schedule(false, rejected);
  EXPECT_EQ(describe(chunks), "1:0+32 2:0+16");
  for (const ScheduledChunk& c : chunks) scheduler.computed(*c.seq, c.begin + c.count);
  ASSERT_EQ(scheduler.state_copies().size(), 1u) << "1's state after 32 tokens is snapshotted";
  EXPECT_EQ(scheduler.state_copies()[0].to, 2 * 4 + 0) << "snapshot buffers follow 2 per slot";
  EXPECT_EQ(scheduler.stats().state_snapshots_taken, 1);
}

TEST(Scheduler, ASequenceLargerThanTheCacheIsRejectedAndSlotsAreCapped) {
  Harness h(4, 256, /*max_seqs=*/2);
  h.scheduler.add(fake_sequence(1, 100));  // 7 blocks > 4
  h.scheduler.add(fake_sequence(2, 3));
  h.scheduler.add(fake_sequence(3, 3, 50));
  h.scheduler.add(fake_sequence(4, 3, 90));
  EXPECT_EQ(describe(h.step()), "2:0+3 3:0+3") << "two slots";
  ASSERT_EQ(h.rejected.size(), 1u);
  EXPECT_EQ(h.rejected[0]->id, 1u);
  EXPECT_EQ(h.scheduler.waiting_count(), 1);
  EXPECT_EQ(h.kv.used(), 2);
}

}  // namespace
}  // namespace sy::engine
