// The `random` dataset of `vllm bench serve` (vllm/benchmarks/datasets/random.py): per request,
// input/output lengths drawn uniformly from [floor(len*(1-r)), ceil(len*(1+r))], a prompt that is
// a run of consecutive non-special vocabulary ids starting at a random offset, and (with a
// tokenizer) its text, decoded then re-encoded and fitted until it is exactly that many tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "util/status.h"

namespace sy::loadgen {

// What the dataset needs from a tokenizer; a real one comes from sy::tokenizer (see
// make_codec in cmd_bench.cpp), tests use their own.
struct TokenCodec {
  int vocab_size = 0;
  std::vector<int32_t> special_ids;  // never sampled
  int special_tokens_added = 0;      // tokens the server adds to a text prompt (e.g. BOS)
  std::function<Result<std::vector<int32_t>>(const std::string& text)> encode;
  std::function<Result<std::string>(const std::vector<int32_t>& ids)> decode;
  bool can_text() const { return encode && decode; }
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  int prefix_len = 0;        // a shared random prefix of this many tokens
  uint64_t seed = 0;
  bool text_prompts = true;  // false: prompts are token ids (needs no decode)
};

struct DatasetRequest {
  std::string prompt_text;           // set for text prompts
  std::vector<int32_t> prompt_ids;   // the token ids (the prompt itself for id prompts)
  int prompt_len = 0;                // tokens the prompt should count on the server
  int expected_output_len = 0;       // max_tokens to ask for
};

struct RandomDataset {
  std::vector<DatasetRequest> requests;
  int input_len_low = 0, input_len_high = 0, output_len_low = 0, output_len_high = 0;
  long long token_mismatch = 0;  // sum over prompts of (re-encoded length - target) left over
};

Result<RandomDataset> make_random_dataset(const RandomDatasetOptions& options,
                                          const TokenCodec& codec);

// Uniform integer in [low, high] from a 64-bit engine, identical on every standard library
// (std::uniform_int_distribution's algorithm is implementation-defined).
int64_t uniform_int(std::mt19937_64& engine, int64_t low, int64_t high);

// Send times (seconds after the first request, non-decreasing) for `count` requests at `rate`
// requests/s: gamma-distributed gaps with shape `burstiness` (1 = Poisson), rescaled so the last
// request goes out at count/rate, as vLLM does; rate = inf sends everything at 0.
std::vector<double> arrival_times_s(int count, double rate, double burstiness, uint64_t seed);

}  // namespace sy::loadgen
