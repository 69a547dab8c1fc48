// A step's tokens as runs of one sequence at consecutive positions, from the host copies of
// positions and token_seq (AttentionBatch::host_*): how a backend splits a step by sequence (the
// CUDA backend expands MLA for runs with many query tokens). Header-only: the CUDA files (C++17)
// include it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sy::backend {

struct SequenceRun {
  int64_t first = 0;    // the run's first token of the step
  int64_t count = 0;    // its tokens
  int32_t seq = -1;     // their sequence (token_seq), -1 for padding
  int64_t context = 0;  // last position + 1: the keys its last token attends to
};

// Maximal runs of tokens with the same token_seq whose positions increase by one, in step
// order (every token in exactly one run). Vectors of different lengths: no runs.
inline std::vector<SequenceRun> sequence_runs(const std::vector<int32_t>& positions,
                                              const std::vector<int32_t>& token_seq) {
  std::vector<SequenceRun> runs;
  if (positions.size() != token_seq.size()) return runs;
  const size_t n = positions.size();
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && token_seq[j] == token_seq[i] && positions[j] == positions[j - 1] + 1) ++j;
    runs.push_back({static_cast<int64_t>(i), static_cast<int64_t>(j - i), token_seq[i],
                    static_cast<int64_t>(positions[j - 1]) + 1});
    i = j;
  }
  return runs;
}

}  // namespace sy::backend
