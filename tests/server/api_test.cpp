// The socket-free half of the server: stop strings, route wire format, replay decoding, parsing.
#include "server/api.h"

#include <gtest/gtest.h>

#include "fake_engine.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using sy::testing::FakeCodec;

std::string feed(ChoiceText& text, const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += text.push({static_cast<int32_t>(c)});
  return out;
}

TEST(ChoiceText, StopStringIsTrimmedAndNeverStreamed) {
  FakeCodec codec;
  ChoiceText text(codec.stream(true), {"STOP"}, false);
  std::string streamed = feed(text, "hello STOPworld");
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.matched_stop(), "STOP");
  streamed += text.finish();
  EXPECT_EQ(streamed, "hello ");
}

TEST(ChoiceText, HeldBackTextIsReleasedWhenNoStopMatches) {
  FakeCodec codec;
  ChoiceText text(codec.stream(true), {"STOP"}, false);
  std::string streamed = feed(text, "ab STO");
  EXPECT_EQ(streamed, "ab ");  // "STO" could still become "STOP"
  streamed += text.finish();
  EXPECT_FALSE(text.stopped());
  EXPECT_EQ(streamed, "ab STO");
}

TEST(ChoiceText, IncludeStopStringAndEarliestMatch) {
  FakeCodec codec;
  ChoiceText text(codec.stream(true), {"cd", "b"}, true);
  std::string out = feed(text, "abcd");
  out += text.finish();
  EXPECT_EQ(out, "ab");
  EXPECT_EQ(text.matched_stop(), "b");
}

TEST(ChoiceText, MultiByteCharactersAreNotSplit) {
  FakeCodec codec;
  ChoiceText text(codec.stream(true), {"xyz"}, false);
  std::string out;
  std::string snowman = "\xE2\x98\x83";  // U+2603
  out += feed(text, "a" + snowman + snowman);
  // Two bytes are held back for the 3-byte stop string; the cut moves back to a character start.
  EXPECT_EQ(out, "a" + snowman);
  out += text.finish();
  EXPECT_EQ(out, "a" + snowman + snowman);
}

engine::ModelInfo fake_info() {
  testing::FakeEngine engine;
  return engine.model_info();
}

TEST(Routes, SelectAndEncodeMatchesTheWireFormat) {
  engine::ModelInfo info = fake_info();
  moe::RouteArray all;
  all.rows = 5;
  all.layers = 4;
  all.top_k = 2;
  for (int i = 0; i < 5 * 4 * 2; ++i) all.ids.push_back(i % 16);
  moe::RouteArray selected = select_routes(all, RouteOptions{true, 2, true}, info);
  ASSERT_EQ(selected.rows, 3);
  ASSERT_EQ(selected.layers, 3);
  EXPECT_EQ(selected.at(0, 0, 0), all.at(2, 1, 0));
  EXPECT_EQ(selected.at(2, 2, 1), all.at(4, 3, 1));
  Result<std::string> bytes = base64_decode(encode_routes_npy_base64(selected, info.num_experts));
  ASSERT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(*bytes);
  ASSERT_TRUE(array) << array.message();
  EXPECT_EQ(array->dtype, DType::kU8);
  EXPECT_EQ(array->shape, (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(array->data[0], static_cast<uint8_t>(all.at(2, 1, 0)));
  // More than 256 experts: uint16.
  Result<NpyArray> wide = npy_decode(*base64_decode(encode_routes_npy_base64(selected, 300)));
  ASSERT_TRUE(wide);
  EXPECT_EQ(wide->dtype, DType::kU16);
  // A start beyond the rows gives an empty (0, L, K) array, not an error.
  EXPECT_EQ(select_routes(all, RouteOptions{true, 99, false}, info).rows, 0);
}

std::string npy_b64(DType dtype, std::vector<int64_t> shape, const void* data) {
  return base64_encode(npy_encode(dtype, shape, data));
}

TEST(Replay, DecodesAnyIntegerDtypeAndExpandsMoeLayers) {
  engine::ModelInfo info = fake_info();
  std::vector<int16_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // (2 rows, 3 MoE layers, 2)
  Result<moe::RouteArray> replay =
      decode_replay(npy_b64(DType::kI16, {2, 3, 2}, ids.data()), true, info);
  ASSERT_TRUE(replay) << replay.message();
  EXPECT_EQ(replay->layers, 4);
  EXPECT_EQ(replay->at(0, 0, 0), 0);  // dense layer
  EXPECT_EQ(replay->at(0, 1, 0), 1);
  EXPECT_EQ(replay->at(1, 3, 1), 12);
}

TEST(Replay, RejectsBadInputNamingTheParameter) {
  engine::ModelInfo info = fake_info();
  std::vector<int32_t> ids(2 * 4 * 2, 1);
  auto expect_error = [&](const std::string& b64, bool moe, const std::string& needle) {
    Result<moe::RouteArray> r = decode_replay(b64, moe, info);
    ASSERT_FALSE(r);
    EXPECT_NE(r.message().find("routed_experts_replay"), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
  };
  expect_error("not base64!!", false, "base64");
  expect_error(base64_encode("garbage bytes"), false, ".npy");
  expect_error(npy_b64(DType::kI32, {2, 4, 2}, ids.data()), true, "shape");
  expect_error(npy_b64(DType::kI32, {16}, ids.data()), false, "shape");
  std::vector<int32_t> dup = {0, 0, 3, 3, 5, 5, 7, 7};  // (1, 4, 2): layer 1 repeats expert 3
  expect_error(npy_b64(DType::kI32, {1, 4, 2}, dup.data()), false, "distinct");
  std::vector<int32_t> big = {0, 0, 1, 16, 2, 3, 4, 5};
  expect_error(npy_b64(DType::kI32, {1, 4, 2}, big.data()), false, "valid ids are 0 .. 15");
  std::vector<float> floats(8, 1.0f);
  expect_error(npy_b64(DType::kF32, {1, 4, 2}, floats.data()), false, "integer");
}

TEST(Parse, RangesFollowVllmAndNameTheParameter) {
  FakeCodec codec;
  engine::ModelInfo info = fake_info();
  ServerConfig config;
  ParseContext context{config, info, codec};
  auto error_of = [&](json body) {
    if (!body.contains("prompt")) body["prompt"] = "hi";
    ApiResult<ApiRequest> r = parse_completion_request(body, context);
    return r.is_ok() ? std::string("ok") : r.error.param + ": " + r.error.message;
  };
  EXPECT_EQ(error_of({}), "ok");
  EXPECT_EQ(error_of({{"temperature", 2.5}}),
            "temperature: temperature must be in [0, 2], got 2.5");
  EXPECT_EQ(error_of({{"top_p", 0}}), "top_p: top_p must be in (0, 1], got 0");
  EXPECT_EQ(error_of({{"top_k", -2}}), "top_k: top_k must be -1 (disable) or at least 1, got -2");
  EXPECT_EQ(error_of({{"min_p", 1.5}}), "min_p: min_p must be in [0, 1], got 1.5");
  EXPECT_EQ(error_of({{"n", 0}}), "n: n must be in [1, 128], got 0");
  EXPECT_EQ(error_of({{"max_tokens", 0}}), "max_tokens: max_tokens must be at least 1, got 0");
  EXPECT_EQ(error_of({{"logprobs", 21}}), "logprobs: logprobs must be in [0, 20], got 21");
  EXPECT_EQ(error_of({{"stop", {""}}}), "stop: stop strings must not be empty");
  EXPECT_EQ(error_of({{"temperature", "hot"}}),
            "temperature: temperature must be a number, got string");
  EXPECT_EQ(error_of({{"max_tokens", 1.5}}), "max_tokens: max_tokens must be an integer, got 1.5");
  EXPECT_EQ(error_of({{"prompt", ""}}).substr(0, 7), "prompt:");
  EXPECT_EQ(error_of({{"prompt", {1, 300}}}),
            "prompt: prompt: token id 300 is out of range; valid ids are 0 .. 299");
  EXPECT_EQ(error_of({{"best_of", 2}}).substr(0, 8), "best_of:");
  EXPECT_EQ(error_of({{"return_routed_experts", true}}),
            "return_routed_experts: return_routed_experts requires the server to be started with "
            "--enable-return-routed-experts");
  EXPECT_EQ(
      error_of({{"routed_experts_layers", "dense"}}),
      "routed_experts_layers: routed_experts_layers must be \"all\" or \"moe\", got \"dense\"");
  // Context: the fake model has 512 positions; "hi" + BOS = 3 tokens.
  EXPECT_EQ(error_of({{"max_tokens", 509}}), "ok");
  EXPECT_EQ(error_of({{"max_tokens", 510}}).substr(0, 11), "max_tokens:");
}

TEST(Parse, SeedsAliasesAndDefaults) {
  FakeCodec codec;
  engine::ModelInfo info = fake_info();
  ServerConfig config;
  config.enable_return_routed_experts = true;
  ParseContext context{config, info, codec};
  ApiResult<ApiRequest> r = parse_completion_request(
      {{"prompt", {{1, 2}, {3, 4, 5}}}, {"n", 2}, {"seed", 7}, {"routed_experts_start_len", 3}},
      context);
  ASSERT_TRUE(r.is_ok()) << r.error.message;
  EXPECT_EQ(r.value->prompts.size(), 2u);
  EXPECT_EQ(r.value->sampling.max_tokens, 16);
  EXPECT_FALSE(r.value->routes.return_routes);  // capture on, but routes are opted into
  EXPECT_EQ(r.value->routes.start, 3);
  config.return_routed_experts_default = true;
  EXPECT_TRUE(parse_completion_request({{"prompt", "hi"}}, context).value->routes.return_routes);
  EXPECT_FALSE(
      parse_completion_request({{"prompt", "hi"}, {"return_routed_experts", false}}, context)
          .value->routes.return_routes);
  config.return_routed_experts_default = false;
  ApiResult<ApiRequest> chat =
      parse_chat_request({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, context);
  ASSERT_TRUE(chat.is_ok()) << chat.error.message;
  // Chat: no BOS (the template carries special tokens) and max_tokens = rest of the context.
  EXPECT_EQ(chat.value->prompts[0].ids.size(), std::string("<|user|>hi\n<|assistant|>").size());
  EXPECT_EQ(chat.value->sampling.max_tokens,
            512 - static_cast<int>(chat.value->prompts[0].ids.size()));
}

TEST(Parse, GenerationConfigDefaultsApplyWhereTheRequestIsSilent) {
  FakeCodec codec;
  engine::ModelInfo info = fake_info();
  ServerConfig config;
  config.sampling_defaults.temperature = 0.6f;
  config.sampling_defaults.top_p = 0.95f;
  config.sampling_defaults.top_k = 20;
  ParseContext context{config, info, codec};
  ApiResult<ApiRequest> silent = parse_completion_request({{"prompt", "x"}}, context);
  ASSERT_TRUE(silent.is_ok());
  EXPECT_FLOAT_EQ(silent.value->sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(silent.value->sampling.top_p, 0.95f);
  EXPECT_EQ(silent.value->sampling.top_k, 20);
  ApiResult<ApiRequest> explicit_values =
      parse_completion_request({{"prompt", "x"}, {"temperature", 0}, {"top_k", -1}}, context);
  ASSERT_TRUE(explicit_values.is_ok());
  EXPECT_EQ(explicit_values.value->sampling.temperature, 0.0f);
  EXPECT_EQ(explicit_values.value->sampling.top_k, -1);
}

// continue_final_message as transformers' render_jinja_template does it (tests/chat/chat_goldens.json
// holds its source): the prompt ends where the final message's text ends, for string content,
// empty content and text parts; content the template drops or no content at all is a 400.
TEST(Parse, ContinueFinalMessageCutsAfterTheFinalTextOrSaysWhy) {
  FakeCodec codec;
  engine::ModelInfo info = fake_info();
  ServerConfig config;
  ParseContext context{config, info, codec};
  auto prompt_of = [&](json final_message) -> std::string {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}, final_message}},
                 {"continue_final_message", true},
                 {"add_generation_prompt", false}};
    ApiResult<ApiRequest> r = parse_chat_request(body, context);
    if (!r.is_ok()) return "error " + r.error.param + ": " + r.error.message;
    return codec.decode(r.value->prompts[0].ids, false);
  };
  EXPECT_EQ(prompt_of({{"role", "assistant"}, {"content", "Hello wor"}}), "<|user|>hi\n<|assistant|>Hello wor");
  EXPECT_EQ(prompt_of({{"role", "assistant"}, {"content", ""}}), "<|user|>hi\n<|assistant|>")
      << "empty content: the prompt ends where the assistant's text would begin";
  EXPECT_EQ(prompt_of({{"role", "assistant"},
                       {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}),
            "<|user|>hi\n<|assistant|>a\nb");
  EXPECT_EQ(prompt_of({{"role", "assistant"}, {"content", "hi"}}), "<|user|>hi\n<|assistant|>hi")
      << "the final message, not an earlier one with the same text";
  EXPECT_EQ(prompt_of({{"role", "trimmed"}, {"content", "Hi "}}), "<|user|>hi\n<|trimmed|>Hi")
      << "a template that trims trailing spaces: cut after the trimmed text";
  const std::string dropped = prompt_of({{"role", "redacted"}, {"content", "secret"}});
  EXPECT_EQ(dropped.rfind("error continue_final_message:", 0), 0u) << dropped;
  EXPECT_NE(dropped.find("does not appear"), std::string::npos) << dropped;
  const std::string missing = prompt_of({{"role", "assistant"}});
  EXPECT_EQ(missing.rfind("error continue_final_message:", 0), 0u) << missing;
  EXPECT_NE(missing.find("no content"), std::string::npos) << missing;
  const std::string no_parts = prompt_of({{"role", "assistant"}, {"content", json::array()}});
  EXPECT_EQ(no_parts.rfind("error continue_final_message:", 0), 0u) << no_parts;
  // echo returns the final message as sent (no tag).
  ApiResult<ApiRequest> echoed = parse_chat_request(
      {{"messages", {{{"role", "assistant"}, {"content", "abc"}}}},
       {"continue_final_message", true}, {"add_generation_prompt", false}, {"echo", true}},
      context);
  ASSERT_TRUE(echoed.is_ok()) << echoed.error.message;
  EXPECT_EQ(echoed.value->echo_text, "abc");
}

}  // namespace
}  // namespace sy::server
