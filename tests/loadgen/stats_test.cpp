// vLLM's metric definitions (vllm/benchmarks/serve.py, calculate_metrics) on hand-made outputs,
// and numpy's percentile definition on the goldens numpy itself produced (tests/loadgen/golden/).
#include "loadgen/stats.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace sy::loadgen {
namespace {

TEST(Percentile, LinearInterpolationLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], q): index (n-1)*q/100 = 3q/100, interpolated.
  const std::vector<double> values{4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(values, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(values, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(values, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(values, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(values, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);  // vLLM: np.percentile(values or 0, p)
}

TEST(Summaries, MeanMedianPopulationStd) {
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
  EXPECT_DOUBLE_EQ(median({5, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(stddev({2, 4, 4, 4, 5, 5, 7, 9}), 2);  // ddof = 0
  EXPECT_DOUBLE_EQ(mean({}), 0);
  EXPECT_DOUBLE_EQ(median({}), 0);
  EXPECT_DOUBLE_EQ(stddev({}), 0);
}

// Goldens: tests/loadgen/golden/make_numpy_stats.py ran numpy on these arrays (GPU machine).
TEST(Percentile, MatchesNumpyGoldens) {
  std::ifstream file(SY_SOURCE_DIR "/tests/loadgen/golden/numpy_stats.json");
  ASSERT_TRUE(file) << "missing tests/loadgen/golden/numpy_stats.json";
  const nlohmann::json golden = nlohmann::json::parse(file);
  ASSERT_GE(golden["cases"].size(), 10u);
  int checked = 0;
  for (const auto& item : golden["cases"]) {
    const std::vector<double> values = item["values"].get<std::vector<double>>();
    const double tolerance = 1e-12;
    auto near = [&](double ours, double theirs, const std::string& what) {
      EXPECT_NEAR(ours, theirs, tolerance * std::max(1.0, std::abs(theirs)))
          << what << " of case " << item["name"];
    };
    near(mean(values), item["mean"], "mean");
    near(median(values), item["median"], "median");
    near(stddev(values), item["std"], "std");
    for (const auto& [p, expected] : item["percentiles"].items()) {
      near(percentile(values, std::stod(p)), expected, "p" + p);
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

RequestOutput success(double start, double ttft, std::vector<double> itl, int output_tokens,
                      int prompt_tokens = 10) {
  RequestOutput output;
  output.success = true;
  output.start_time_s = start;
  output.ttft_s = ttft;
  output.itl_s = std::move(itl);
  double latency = ttft;
  for (double gap : output.itl_s) latency += gap;
  output.latency_s = latency;
  output.output_tokens = output_tokens;
  output.prompt_tokens = prompt_tokens;
  return output;
}

TEST(ComputeMetrics, VllmDefinitions) {
  std::vector<RequestOutput> outputs;
  outputs.push_back(success(0.0, 0.1, {0.02, 0.02, 0.06}, 4));  // latency 0.2
  outputs.push_back(success(0.5, 0.3, {0.1}, 3));               // latency 0.4, 3 tokens in 2 chunks
  outputs.push_back(success(1.0, 0.2, {}, 1));                  // one token: no TPOT
  RequestOutput failed;
  failed.error = "HTTP 500";
  failed.prompt_tokens = 99;
  outputs.push_back(failed);

  const BenchmarkMetrics metrics = compute_metrics(outputs, 2.0, {50, 99}, GoodputSlo{});
  EXPECT_EQ(metrics.completed, 3);
  EXPECT_EQ(metrics.failed, 1);
  EXPECT_EQ(metrics.total_input_tokens, 30);  // failures' prompts are not counted
  EXPECT_EQ(metrics.total_output_tokens, 8);
  EXPECT_EQ(metrics.output_lens, (std::vector<int>{4, 3, 1, 0}));
  EXPECT_DOUBLE_EQ(metrics.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(metrics.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(metrics.total_token_throughput, 19.0);
  EXPECT_NEAR(metrics.ttft.mean_ms, 200, 1e-9);
  // TPOT = (latency - ttft) / (output_tokens - 1): 0.1/3 and 0.1/2; the 1-token request is left out.
  EXPECT_NEAR(metrics.tpot.mean_ms, (100.0 / 3 + 50) / 2, 1e-9);
  // ITL: every gap of every request, flattened: {20, 20, 60, 100} ms.
  EXPECT_NEAR(metrics.itl.mean_ms, 50, 1e-9);
  EXPECT_NEAR(metrics.itl.median_ms, 40, 1e-9);
  EXPECT_NEAR(metrics.e2el.median_ms, 200, 1e-9);
  ASSERT_EQ(metrics.itl.percentiles_ms.size(), 2u);
  EXPECT_NEAR(metrics.itl.percentiles_ms[1].second, 60 + 40 * 0.97, 1e-9);
  // Intervals [0, .2), [.5, .9), [1, 1.2) never overlap.
  EXPECT_EQ(metrics.max_concurrent_requests, 1);
  // Chunks arrive at .1 .12 .14 .2 | .8 .9 | 1.2: bucket 0 holds 6 of them.
  EXPECT_DOUBLE_EQ(metrics.max_output_tokens_per_s, 6);
  EXPECT_DOUBLE_EQ(metrics.request_goodput, 0);  // no SLO given
}

TEST(ComputeMetrics, PeakConcurrencyUsesHalfOpenIntervals) {
  // [0, 1) and [1, 2) touch but do not overlap; [0.5, 1.5) overlaps both.
  std::vector<RequestOutput> outputs{success(0, 1, {}, 1), success(1, 1, {}, 1)};
  EXPECT_EQ(compute_metrics(outputs, 2, {}, {}).max_concurrent_requests, 1);
  outputs.push_back(success(0.5, 1, {}, 1));
  EXPECT_EQ(compute_metrics(outputs, 2, {}, {}).max_concurrent_requests, 2);
}

TEST(ComputeMetrics, OutputLengthFallsBackToTokenizerOrOne) {
  std::vector<RequestOutput> outputs{success(0, 0.1, {0.1, 0.1}, /*output_tokens=*/0)};
  outputs[0].generated_text = "a b c d e";
  EXPECT_EQ(compute_metrics(outputs, 1, {}, {}).total_output_tokens, 1);  // vLLM without tokenizer
  TokenCounter words = [](const std::string& text) {
    return static_cast<int>(std::count(text.begin(), text.end(), ' ')) + 1;
  };
  EXPECT_EQ(compute_metrics(outputs, 1, {}, {}, words).total_output_tokens, 5);
}

TEST(ComputeMetrics, GoodputCountsRequestsMeetingEverySlo) {
  std::vector<RequestOutput> outputs{
      success(0, 0.1, {0.01, 0.01}, 3),  // ttft 100 ms, tpot 10 ms
      success(0, 0.3, {0.01}, 2),        // ttft 300 ms
      success(0, 0.1, {0.09}, 2),        // tpot 90 ms
      success(0, 0.1, {}, 1),            // tpot counts as 0 for goodput
  };
  auto slo = parse_goodput("ttft:200 tpot:50");
  ASSERT_TRUE(slo) << slo.message();
  EXPECT_DOUBLE_EQ(compute_metrics(outputs, 2, {}, *slo).request_goodput, 1.0);  // 2 good / 2 s
  auto e2el_only = parse_goodput("e2el:150");
  ASSERT_TRUE(e2el_only);
  EXPECT_DOUBLE_EQ(compute_metrics(outputs, 1, {}, *e2el_only).request_goodput, 2.0);
}

TEST(ParseGoodput, RejectsWhatIsNotNameColonMilliseconds) {
  EXPECT_FALSE(parse_goodput("ttft"));
  EXPECT_FALSE(parse_goodput("latency:5"));
  EXPECT_FALSE(parse_goodput("ttft:abc"));
  EXPECT_FALSE(parse_goodput("tpot:-1"));
  auto empty = parse_goodput("");
  ASSERT_TRUE(empty);
  EXPECT_FALSE(empty->any());
  auto unknown = parse_goodput("itl:5");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.message().find("ttft, tpot, e2el"), std::string::npos);
}

}  // namespace
}  // namespace sy::loadgen
