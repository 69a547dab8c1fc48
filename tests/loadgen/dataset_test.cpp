// The random dataset (vLLM's definition) and the arrival schedule.
#include "loadgen/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

namespace sy::loadgen {
namespace {

TokenCodec ids_only(int vocab_size, std::vector<int32_t> special = {}) {
  TokenCodec codec;
  codec.vocab_size = vocab_size;
  codec.special_ids = std::move(special);
  return codec;
}

TEST(RandomDataset, LengthsAreUniformOverVllmsBounds) {
  RandomDatasetOptions options;
  options.num_prompts = 4000;
  options.input_len = 100;
  options.output_len = 30;
  options.range_ratio = 0.25;
  options.text_prompts = false;
  auto dataset = make_random_dataset(options, ids_only(1000));
  ASSERT_TRUE(dataset) << dataset.message();
  // floor(100 * 0.75) .. ceil(100 * 1.25); floor(30 * 0.75) .. ceil(30 * 1.25)
  EXPECT_EQ(dataset->input_len_low, 75);
  EXPECT_EQ(dataset->input_len_high, 125);
  EXPECT_EQ(dataset->output_len_low, 22);
  EXPECT_EQ(dataset->output_len_high, 38);
  std::map<int, int> input_counts;
  std::map<int, int> output_counts;
  for (const DatasetRequest& request : dataset->requests) {
    ASSERT_GE(request.prompt_len, 75);
    ASSERT_LE(request.prompt_len, 125);
    ASSERT_EQ(request.prompt_len, static_cast<int>(request.prompt_ids.size()));
    ASSERT_GE(request.expected_output_len, 22);
    ASSERT_LE(request.expected_output_len, 38);
    ++input_counts[request.prompt_len];
    ++output_counts[request.expected_output_len];
  }
  EXPECT_EQ(input_counts.size(), 51u);  // every length in range is drawn: both ends included
  EXPECT_EQ(output_counts.size(), 17u);
  // Uniform: each of 51 input lengths expects ~78 draws; none should be far off.
  for (const auto& [length, count] : input_counts) {
    EXPECT_GT(count, 35) << length;
    EXPECT_LT(count, 130) << length;
  }
}

TEST(RandomDataset, PromptsAreConsecutiveNonSpecialIdsAndSeeded) {
  RandomDatasetOptions options;
  options.num_prompts = 50;
  options.input_len = 40;
  options.output_len = 8;
  options.text_prompts = false;
  options.seed = 7;
  const std::vector<int32_t> special{0, 1, 2, 50};
  auto first = make_random_dataset(options, ids_only(60, special));
  auto again = make_random_dataset(options, ids_only(60, special));
  options.seed = 8;
  auto other = make_random_dataset(options, ids_only(60, special));
  ASSERT_TRUE(first && again && other);
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < 60; ++id) {
    if (std::find(special.begin(), special.end(), id) == special.end()) allowed.push_back(id);
  }
  bool any_difference = false;
  for (size_t i = 0; i < first->requests.size(); ++i) {
    const auto& ids = first->requests[i].prompt_ids;
    EXPECT_EQ(ids, again->requests[i].prompt_ids);
    any_difference |= ids != other->requests[i].prompt_ids;
    ASSERT_EQ(ids.size(), 40u);
    // a run through the allowed ids, wrapping around
    const size_t start = std::find(allowed.begin(), allowed.end(), ids[0]) - allowed.begin();
    ASSERT_LT(start, allowed.size()) << "id " << ids[0] << " is special";
    for (size_t position = 0; position < ids.size(); ++position) {
      ASSERT_EQ(ids[position], allowed[(start + position) % allowed.size()]);
    }
  }
  EXPECT_TRUE(any_difference);
}

TEST(RandomDataset, SharedPrefix) {
  RandomDatasetOptions options;
  options.num_prompts = 5;
  options.input_len = 10;
  options.prefix_len = 6;
  options.text_prompts = false;
  auto dataset = make_random_dataset(options, ids_only(500));
  ASSERT_TRUE(dataset);
  for (const DatasetRequest& request : dataset->requests) {
    ASSERT_EQ(request.prompt_len, 16);
    EXPECT_TRUE(std::equal(request.prompt_ids.begin(), request.prompt_ids.begin() + 6,
                           dataset->requests[0].prompt_ids.begin()));
  }
}

// A tokenizer in which ids 0..9 are the digits and 10..99 are two-digit strings, and encode
// is greedy longest-match: decoding consecutive ids often re-encodes to a different length.
TokenCodec digit_codec() {
  TokenCodec codec;
  codec.vocab_size = 100;
  codec.encode = [](const std::string& text) -> Result<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      if (i + 1 < text.size() && text[i] != '0') {
        ids.push_back((text[i] - '0') * 10 + (text[i + 1] - '0'));
        i += 2;
      } else {
        ids.push_back(text[i] - '0');
        i += 1;
      }
    }
    return ids;
  };
  codec.decode = [](const std::vector<int32_t>& ids) -> Result<std::string> {
    std::string text;
    for (int32_t id : ids) text += std::to_string(id);
    return text;
  };
  return codec;
}

TEST(RandomDataset, TextPromptsReencodeToTheirLength) {
  RandomDatasetOptions options;
  options.num_prompts = 200;
  options.input_len = 30;
  options.range_ratio = 0.5;
  auto dataset = make_random_dataset(options, digit_codec());
  ASSERT_TRUE(dataset) << dataset.message();
  // The same seed draws the same target lengths before any text is fitted.
  options.text_prompts = false;
  auto targets = make_random_dataset(options, digit_codec());
  ASSERT_TRUE(targets);
  const TokenCodec codec = digit_codec();
  int exact = 0;
  long long leftover = 0;
  for (size_t i = 0; i < dataset->requests.size(); ++i) {
    const DatasetRequest& request = dataset->requests[i];
    auto reencoded = codec.encode(request.prompt_text);
    ASSERT_TRUE(reencoded);
    EXPECT_EQ(*reencoded, request.prompt_ids);  // the ids reported are the text's own
    EXPECT_EQ(request.prompt_len, static_cast<int>(reencoded->size()));
    const int target = targets->requests[i].prompt_len;
    exact += request.prompt_len == target;
    leftover += request.prompt_len - target;
  }
  // The naive decode changes the length almost always with this codec; fitting fixes nearly all.
  EXPECT_GT(exact, 180);
  EXPECT_EQ(leftover, dataset->token_mismatch);
}

TEST(RandomDataset, SpecialTokensAddedCountTowardTheLength) {
  RandomDatasetOptions options;
  options.num_prompts = 3;
  options.input_len = 20;
  TokenCodec codec = digit_codec();
  codec.special_tokens_added = 1;  // the server adds a BOS to text prompts
  auto dataset = make_random_dataset(options, codec);
  ASSERT_TRUE(dataset);
  EXPECT_EQ(dataset->input_len_low, 19);
  for (const DatasetRequest& request : dataset->requests) {
    EXPECT_EQ(request.prompt_len, static_cast<int>(request.prompt_ids.size()) + 1);
  }
}

TEST(RandomDataset, RejectsBadOptionsWithReasons) {
  RandomDatasetOptions options;
  options.text_prompts = false;
  options.range_ratio = 1.0;
  auto bad_ratio = make_random_dataset(options, ids_only(10));
  ASSERT_FALSE(bad_ratio);
  EXPECT_NE(bad_ratio.message().find("[0, 1)"), std::string::npos);
  options.range_ratio = 0;
  EXPECT_FALSE(make_random_dataset(options, ids_only(0)));  // no vocabulary
  options.num_prompts = 0;
  EXPECT_FALSE(make_random_dataset(options, ids_only(10)));
  options.num_prompts = 1;
  options.input_len = 0;
  EXPECT_FALSE(make_random_dataset(options, ids_only(10)));  // empty prompts
  options.input_len = 5;
  options.text_prompts = true;
  auto no_tokenizer = make_random_dataset(options, ids_only(10));
  ASSERT_FALSE(no_tokenizer);
  EXPECT_NE(no_tokenizer.message().find("--tokenizer"), std::string::npos);
}

TEST(UniformInt, CoversBothEndsEvenly) {
  std::mt19937_64 engine(1);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[static_cast<size_t>(uniform_int(engine, 3, 9) - 3)];
  for (int count : counts) {
    EXPECT_GT(count, 9400);
    EXPECT_LT(count, 10600);
  }
  EXPECT_EQ(uniform_int(engine, 5, 5), 5);
}

TEST(ArrivalTimes, InfiniteRateSendsAllAtOnce) {
  for (double time : arrival_times_s(100, INFINITY, 1.0, 0)) EXPECT_EQ(time, 0);
}

TEST(ArrivalTimes, PoissonScheduleSpansCountOverRate) {
  const int count = 5000;
  const double rate = 20;
  const std::vector<double> times = arrival_times_s(count, rate, 1.0, 3);
  ASSERT_EQ(times.size(), static_cast<size_t>(count));
  EXPECT_NEAR(times.back(), count / rate, 1e-9);  // vLLM rescales to exactly count/rate
  std::vector<double> gaps;
  for (size_t i = 1; i < times.size(); ++i) {
    ASSERT_GE(times[i], times[i - 1]);
    gaps.push_back(times[i] - times[i - 1]);
  }
  // Exponential gaps: coefficient of variation 1 (a gamma of shape 2 would give 0.71).
  const double average = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double squares = 0;
  for (double gap : gaps) squares += (gap - average) * (gap - average);
  const double variation = std::sqrt(squares / gaps.size()) / average;
  EXPECT_NEAR(variation, 1.0, 0.06);
  const std::vector<double> smooth = arrival_times_s(count, rate, 4.0, 3);
  std::vector<double> smooth_gaps;
  for (size_t i = 1; i < smooth.size(); ++i) smooth_gaps.push_back(smooth[i] - smooth[i - 1]);
  const double smooth_average = std::accumulate(smooth_gaps.begin(), smooth_gaps.end(), 0.0) / smooth_gaps.size();
  double smooth_squares = 0;
  for (double gap : smooth_gaps) smooth_squares += (gap - smooth_average) * (gap - smooth_average);
  EXPECT_NEAR(std::sqrt(smooth_squares / smooth_gaps.size()) / smooth_average, 0.5, 0.05);  // 1/sqrt(4)
}

}  // namespace
}  // namespace sy::loadgen
