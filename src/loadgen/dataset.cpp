#include "loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace sy::loadgen {

int64_t uniform_int(std::mt19937_64& engine, int64_t low, int64_t high) {
  const uint64_t span = static_cast<uint64_t>(high - low) + 1;  // 0 means the whole 64-bit range
  if (span == 0) return static_cast<int64_t>(engine());
  // Rejection sampling: drop draws from the incomplete last copy of [0, span).
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % span;
  uint64_t draw;
  do {
    draw = engine();
  } while (draw >= limit);
  return low + static_cast<int64_t>(draw % span);
}

namespace {

// Decode, re-encode, then pad with allowed ids or truncate, until the text re-encodes to exactly
// `target` tokens or the retries run out (vLLM's gen_prompt_decode_to_target_len).
Result<std::pair<std::string, std::vector<int32_t>>> fit_text_to_length(
    std::vector<int32_t> ids, int target, const TokenCodec& codec,
    const std::vector<int32_t>& allowed, std::mt19937_64& engine, long long& mismatch) {
  constexpr int kMaxRetries = 10;
  std::string text;
  for (int retry = 0;; ++retry) {
    SY_ASSIGN(text, codec.decode(ids));
    SY_ASSIGN(ids, codec.encode(text));
    const int length = static_cast<int>(ids.size());
    if (length == target) break;
    if (retry == kMaxRetries) {
      mismatch += length - target;
      break;
    }
    if (length < target) {
      for (int i = length; i < target; ++i) {
        ids.push_back(allowed[uniform_int(engine, 0, static_cast<int64_t>(allowed.size()) - 1)]);
      }
    } else {
      ids.resize(static_cast<size_t>(target));
    }
  }
  return std::make_pair(std::move(text), std::move(ids));
}

}  // namespace

Result<RandomDataset> make_random_dataset(const RandomDatasetOptions& options,
                                          const TokenCodec& codec) {
  if (options.num_prompts < 1) {
    return Status::errorf("--num-prompts must be >= 1, got {}", options.num_prompts);
  }
  if (!(options.range_ratio >= 0.0 && options.range_ratio < 1.0)) {
    return Status::errorf("--range-ratio must be in [0, 1), got {}", options.range_ratio);
  }
  if (options.input_len < 0 || options.output_len < 1 || options.prefix_len < 0) {
    return Status::errorf(
        "--input-len and --prefix-len must be >= 0 and --output-len >= 1, got {}, {} and {}",
        options.input_len, options.prefix_len, options.output_len);
  }
  if (codec.vocab_size < 1) {
    return Status::error(
        "the random dataset needs a vocabulary: give --tokenizer DIR or --vocab-size N");
  }
  if (options.text_prompts && !codec.can_text()) {
    return Status::error(
        "text prompts need a tokenizer (--tokenizer DIR); without one, prompts can only be token "
        "ids (--endpoint completions or generate)");
  }

  RandomDataset dataset;
  const double ratio = options.range_ratio;
  const int special = options.text_prompts ? codec.special_tokens_added : 0;
  const int real_input_len = std::max(0, options.input_len - special);
  dataset.input_len_low = static_cast<int>(std::floor(real_input_len * (1 - ratio)));
  dataset.input_len_high = static_cast<int>(std::ceil(real_input_len * (1 + ratio)));
  dataset.output_len_low = std::max(1, static_cast<int>(std::floor(options.output_len * (1 - ratio))));
  dataset.output_len_high = std::max(1, static_cast<int>(std::ceil(options.output_len * (1 + ratio))));
  if (options.prefix_len + dataset.input_len_low < 1) {
    return Status::errorf(
        "--input-len {} is too small: with range ratio {} and {} special token(s) a prompt could "
        "have no tokens; raise --input-len or --prefix-len, or lower --range-ratio",
        options.input_len, ratio, special);
  }

  std::unordered_set<int32_t> special_ids(codec.special_ids.begin(), codec.special_ids.end());
  std::vector<int32_t> allowed;
  allowed.reserve(static_cast<size_t>(codec.vocab_size));
  for (int32_t id = 0; id < codec.vocab_size; ++id) {
    if (!special_ids.count(id)) allowed.push_back(id);
  }
  if (allowed.empty()) return Status::error("every vocabulary id is a special token");
  const int64_t allowed_count = static_cast<int64_t>(allowed.size());

  std::mt19937_64 engine(options.seed);
  std::vector<int> input_lens, output_lens;
  std::vector<int64_t> offsets;
  for (int i = 0; i < options.num_prompts; ++i) {
    input_lens.push_back(static_cast<int>(uniform_int(engine, dataset.input_len_low, dataset.input_len_high)));
  }
  for (int i = 0; i < options.num_prompts; ++i) {
    output_lens.push_back(static_cast<int>(uniform_int(engine, dataset.output_len_low, dataset.output_len_high)));
  }
  for (int i = 0; i < options.num_prompts; ++i) {
    offsets.push_back(uniform_int(engine, 0, codec.vocab_size - 1));
  }
  std::vector<int32_t> prefix;
  for (int i = 0; i < options.prefix_len; ++i) {
    prefix.push_back(allowed[uniform_int(engine, 0, allowed_count - 1)]);
  }

  for (int i = 0; i < options.num_prompts; ++i) {
    DatasetRequest request;
    request.prompt_ids = prefix;
    for (int position = 0; position < input_lens[i]; ++position) {
      request.prompt_ids.push_back(allowed[(offsets[i] + i + position) % allowed_count]);
    }
    const int target = options.prefix_len + input_lens[i];
    if (options.text_prompts) {
      SY_ASSIGN(auto fitted, fit_text_to_length(std::move(request.prompt_ids), target, codec,
                                                allowed, engine, dataset.token_mismatch));
      request.prompt_text = std::move(fitted.first);
      request.prompt_ids = std::move(fitted.second);
    }
    request.prompt_len = static_cast<int>(request.prompt_ids.size()) + special;
    request.expected_output_len = output_lens[i];
    dataset.requests.push_back(std::move(request));
  }
  return dataset;
}

std::vector<double> arrival_times_s(int count, double rate, double burstiness, uint64_t seed) {
  std::vector<double> times(static_cast<size_t>(std::max(count, 0)), 0.0);
  if (count <= 0 || std::isinf(rate)) return times;
  std::mt19937_64 engine(seed ^ 0x9e3779b97f4a7c15ULL);  // a stream apart from the dataset's
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double elapsed = 0;
  for (double& time : times) {
    elapsed += gap(engine);
    time = elapsed;
  }
  // Rescale so the whole schedule spans count/rate exactly: the sum of random gaps is a few
  // percent off otherwise, which makes throughput depend on the seed.
  if (times.back() > 0) {
    const double scale = (count / rate) / times.back();
    for (double& time : times) time *= scale;
  }
  return times;
}

}  // namespace sy::loadgen
