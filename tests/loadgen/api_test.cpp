// Request bodies and the reading of streamed chunks, on payloads shaped like vLLM's and SGLang's.
#include "loadgen/api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sy::loadgen {
namespace {

using nlohmann::json;

DatasetRequest sample_request() {
  DatasetRequest request;
  request.prompt_text = "hello world";
  request.prompt_ids = {5, 6, 7};
  request.prompt_len = 3;
  request.expected_output_len = 12;
  return request;
}

TEST(RequestBody, CompletionsWithIdsAndRoutes) {
  RequestOptions options{"m", /*ignore_eos=*/true, /*routed_experts=*/true};
  auto body = build_request_body(Endpoint::kCompletions, sample_request(), false, options);
  ASSERT_TRUE(body);
  const json parsed = json::parse(*body);
  EXPECT_EQ(parsed["model"], "m");
  EXPECT_EQ(parsed["prompt"], json::array({5, 6, 7}));
  EXPECT_EQ(parsed["max_tokens"], 12);
  EXPECT_EQ(parsed["stream"], true);
  EXPECT_EQ(parsed["stream_options"]["include_usage"], true);
  EXPECT_EQ(parsed["ignore_eos"], true);
  EXPECT_EQ(parsed["return_routed_experts"], true);
}

TEST(RequestBody, ChatNeedsTextAndUsesMaxCompletionTokens) {
  RequestOptions options{"m", false, false};
  EXPECT_FALSE(build_request_body(Endpoint::kChat, sample_request(), false, options));
  auto body = build_request_body(Endpoint::kChat, sample_request(), true, options);
  ASSERT_TRUE(body);
  const json parsed = json::parse(*body);
  EXPECT_EQ(parsed["messages"][0]["content"], "hello world");
  EXPECT_EQ(parsed["messages"][0]["role"], "user");
  EXPECT_EQ(parsed["max_completion_tokens"], 12);
  EXPECT_FALSE(parsed.contains("ignore_eos"));
  EXPECT_FALSE(parsed.contains("return_routed_experts"));
}

TEST(RequestBody, SglangGenerate) {
  RequestOptions options{"m", true, true};
  const json ids = json::parse(*build_request_body(Endpoint::kGenerate, sample_request(), false, options));
  EXPECT_EQ(ids["input_ids"], json::array({5, 6, 7}));
  EXPECT_EQ(ids["sampling_params"]["max_new_tokens"], 12);
  EXPECT_EQ(ids["sampling_params"]["ignore_eos"], true);
  EXPECT_EQ(ids["return_routed_experts"], true);
  EXPECT_FALSE(ids.contains("model"));
  const json text = json::parse(*build_request_body(Endpoint::kGenerate, sample_request(), true, options));
  EXPECT_EQ(text["text"], "hello world");
}

TEST(ParseEndpoint, NamesAndPaths) {
  EXPECT_EQ(*parse_endpoint("chat"), Endpoint::kChat);
  EXPECT_EQ(*parse_endpoint("/v1/completions"), Endpoint::kCompletions);
  EXPECT_EQ(*parse_endpoint("generate"), Endpoint::kGenerate);
  auto bad = parse_endpoint("embeddings");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("completions, chat, generate"), std::string::npos);
}

TEST(StreamReader, CompletionsLikeVllm) {
  StreamReader reader(Endpoint::kCompletions);
  EXPECT_TRUE(*reader.on_data(R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":"Hel","finish_reason":null}]})"));
  // text may be empty (a special token) and still counts as a chunk with a choice
  EXPECT_TRUE(*reader.on_data(R"({"choices":[{"index":0,"text":"","finish_reason":null}]})"));
  EXPECT_TRUE(*reader.on_data(R"({"choices":[{"index":0,"text":"lo","finish_reason":"length","routed_experts":"QUJD"}]})"));
  EXPECT_FALSE(*reader.on_data(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})"));
  EXPECT_FALSE(reader.saw_done());
  EXPECT_FALSE(*reader.on_data("[DONE]"));
  EXPECT_TRUE(reader.saw_done());
  EXPECT_EQ(reader.text(), "Hello");
  EXPECT_EQ(reader.choice_chunks(), 3);
  EXPECT_EQ(reader.prompt_tokens(), 7);
  EXPECT_EQ(reader.completion_tokens(), 3);
  EXPECT_EQ(reader.routed_experts(), "QUJD");
}

TEST(StreamReader, ChatDeltas) {
  StreamReader reader(Endpoint::kChat);
  EXPECT_TRUE(*reader.on_data(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"));
  EXPECT_TRUE(*reader.on_data(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})"));
  EXPECT_TRUE(*reader.on_data(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"));
  EXPECT_EQ(reader.text(), "Hi");
  EXPECT_FALSE(reader.completion_tokens().has_value());
}

TEST(StreamReader, SglangCumulativeText) {
  StreamReader reader(Endpoint::kGenerate);
  EXPECT_TRUE(*reader.on_data(R"({"text":"a","meta_info":{"prompt_tokens":4,"completion_tokens":1,"finish_reason":null}})"));
  EXPECT_TRUE(*reader.on_data(R"({"text":"ab","meta_info":{"prompt_tokens":4,"completion_tokens":2,"finish_reason":{"type":"length"},"routed_experts":"AAAA"}})"));
  EXPECT_EQ(reader.text(), "ab");
  EXPECT_EQ(reader.completion_tokens(), 2);
  EXPECT_EQ(reader.routed_experts(), "AAAA");
}

TEST(StreamReader, ErrorsAreErrors) {
  StreamReader reader(Endpoint::kCompletions);
  auto error = reader.on_data(R"({"error":{"message":"KV cache full","type":"InternalServerError","code":500}})");
  ASSERT_FALSE(error);
  EXPECT_NE(error.message().find("KV cache full"), std::string::npos);
  EXPECT_FALSE(reader.on_data("{not json"));
  EXPECT_FALSE(reader.on_data("[1, 2]"));
}

}  // namespace
}  // namespace sy::loadgen
