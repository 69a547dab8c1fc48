#include "backend/sequence_runs.h"

#include <gtest/gtest.h>

namespace sy::backend {
namespace {

struct Expected {
  int64_t first, count;
  int32_t seq;
  int64_t context;
};

void expect_runs(const std::vector<int32_t>& positions, const std::vector<int32_t>& seqs,
                 const std::vector<Expected>& expected) {
  const std::vector<SequenceRun> runs = sequence_runs(positions, seqs);
  ASSERT_EQ(runs.size(), expected.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(runs[i].first, expected[i].first);
    EXPECT_EQ(runs[i].count, expected[i].count);
    EXPECT_EQ(runs[i].seq, expected[i].seq);
    EXPECT_EQ(runs[i].context, expected[i].context);
  }
}

TEST(SequenceRuns, DecodeTokensArePerSequenceRunsOfOne) {
  expect_runs({7, 3, 99}, {0, 1, 2}, {{0, 1, 0, 8}, {1, 1, 1, 4}, {2, 1, 2, 100}});
}

TEST(SequenceRuns, AChunkOfOneSequenceIsOneRunEndingAtItsLastPosition) {
  // Two decode tokens, then a prefill chunk at positions 40..44 of sequence 2, then a decode token.
  expect_runs({10, 20, 40, 41, 42, 43, 44, 5}, {0, 1, 2, 2, 2, 2, 2, 3},
              {{0, 1, 0, 11}, {1, 1, 1, 21}, {2, 5, 2, 45}, {7, 1, 3, 6}});
}

TEST(SequenceRuns, APositionGapOrARepeatedSequenceStartsANewRun) {
  // Sequence 0 at 0..2 then (not consecutive) 5..6; sequence 1 twice, apart.
  expect_runs({0, 1, 2, 5, 6, 3, 8, 4}, {0, 0, 0, 0, 0, 1, 2, 1},
              {{0, 3, 0, 3}, {3, 2, 0, 7}, {5, 1, 1, 4}, {6, 1, 2, 9}, {7, 1, 1, 5}});
}

TEST(SequenceRuns, PaddingTokensFormTheirOwnRuns) {
  // Graph padding: token_seq -1, position -1 (the backend leaves such runs to the general path).
  expect_runs({3, 4, -1, -1}, {0, 0, -1, -1}, {{0, 2, 0, 5}, {2, 1, -1, 0}, {3, 1, -1, 0}});
}

TEST(SequenceRuns, EmptyOrMismatchedInputsGiveNoRuns) {
  EXPECT_TRUE(sequence_runs({}, {}).empty());
  EXPECT_TRUE(sequence_runs({1, 2}, {0}).empty());
}

}  // namespace
}  // namespace sy::backend
