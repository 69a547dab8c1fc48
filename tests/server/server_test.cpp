// The HTTP layer over a fake engine: shapes of answers, streaming, routes, cancellation on
// disconnect, limits, and bad input (each answered with the right status, server healthy after).
#include "server/server.h"

#include <gtest/gtest.h>

#include <thread>

#include "fake_engine.h"
#include "http_client.h"
#include "server_fixture.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;

ServerConfig with_routes() {
  ServerConfig config;
  config.enable_return_routed_experts = true;
  config.return_routed_experts_default = true;  // these tests predate the per-request opt-in
  return config;
}

NpyArray decode_routes(const json& b64) {
  Result<std::string> bytes = base64_decode(b64.get<std::string>());
  EXPECT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(*bytes);
  EXPECT_TRUE(array) << array.message();
  return *array;
}

std::string expected_text(const std::vector<int32_t>& prompt, int count,
                          std::optional<uint64_t> seed = std::nullopt, float temperature = 1.0f) {
  std::string out;
  for (int j = 0; j < count; ++j)
    out += static_cast<char>(fake_token(prompt, j, seed, temperature));
  return out;
}

TEST(Server, HealthModelsAndNotFound) {
  Fixture f;
  EXPECT_TRUE(f.healthy());
  HttpResponse models = http_call(f.port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  json card = models.json()["data"][0];
  EXPECT_EQ(card["id"], "fake");
  EXPECT_EQ(card["moe_layers"], json({1, 2, 3}));
  EXPECT_EQ(card["num_experts"], 16);
  EXPECT_EQ(card["top_k"], 2);
  HttpResponse missing = http_call(f.port, "GET", "/v1/nothing");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["error"]["code"], 404);
  HttpResponse wrong_model =
      post_json(f.port, "/v1/completions", {{"model", "other"}, {"prompt", "x"}});
  EXPECT_EQ(wrong_model.status, 404);
  EXPECT_EQ(wrong_model.json()["error"]["param"], "model");
  EXPECT_EQ(http_call(f.port, "GET", "/v1/completions").status, 405);
  EXPECT_EQ(post_json(f.port, "/v1/embeddings", {{"input", "x"}}).status, 400);
}

TEST(Server, LoadingAnswers503) {
  ServerConfig config;
  config.port = 0;
  Server server(config);
  ASSERT_TRUE(server.start());
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 503);
  HttpResponse r = post_json(server.port(), "/v1/completions", {{"prompt", "x"}});
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.json()["error"]["type"], "ServiceUnavailableError");
}

TEST(Server, CompletionWithRoutes) {
  Fixture f(with_routes());
  HttpResponse r = post_json(f.port, "/v1/completions",
                             {{"model", "fake"},
                              {"prompt", "hello"},
                              {"max_tokens", 5},
                              {"temperature", 0},
                              {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  std::vector<int32_t> prompt = {FakeCodec::kBos, 'h', 'e', 'l', 'l', 'o'};
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], expected_text(prompt, 5));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["prompt_token_ids"], json(prompt));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 11);
  // Routes: rows 0 .. N-2 over all 4 layers; dense layer 0 zero; MoE rows distinct valid ids.
  NpyArray routes = decode_routes(body["choices"][0]["routed_experts"]);
  EXPECT_EQ(routes.dtype, DType::kU8);
  ASSERT_EQ(routes.shape, (std::vector<int64_t>{10, 4, 2}));
  std::vector<int32_t> all = prompt;
  for (char c : body["choices"][0]["text"].get<std::string>()) all.push_back(c);
  for (int64_t row = 0; row < 10; ++row) {
    EXPECT_EQ(routes.data[row * 8 + 0], 0);
    EXPECT_EQ(routes.data[row * 8 + 1], 0);
    for (int layer = 1; layer < 4; ++layer) {
      int32_t want[2];
      fake_route(all[row], row, layer, want);
      EXPECT_EQ(routes.data[row * 8 + layer * 2], want[0]);
      EXPECT_EQ(routes.data[row * 8 + layer * 2 + 1], want[1]);
    }
  }
  // Start offset and MoE layers only.
  HttpResponse moe = post_json(f.port, "/v1/completions",
                               {{"prompt", "hello"},
                                {"max_tokens", 5},
                                {"routed_experts_start", 6},
                                {"routed_experts_layers", "moe"}});
  NpyArray sliced = decode_routes(moe.json()["choices"][0]["routed_experts"]);
  ASSERT_EQ(sliced.shape, (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(sliced.data[0], routes.data[6 * 8 + 2]);
  // Asked not to: no routes.
  HttpResponse none =
      post_json(f.port, "/v1/completions",
                {{"prompt", "hello"}, {"max_tokens", 2}, {"return_routed_experts", false}});
  EXPECT_FALSE(none.json()["choices"][0].contains("routed_experts"));
}

TEST(Server, RoutesWithoutTheFlagAre400NamingTheFlag) {
  Fixture f;
  HttpResponse r =
      post_json(f.port, "/v1/completions", {{"prompt", "hi"}, {"return_routed_experts", true}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("--enable-return-routed-experts"),
            std::string::npos);
  EXPECT_EQ(r.json()["error"]["param"], "return_routed_experts");
  HttpResponse plain = post_json(f.port, "/v1/completions", {{"prompt", "hi"}});
  EXPECT_EQ(plain.status, 200);
  EXPECT_FALSE(plain.json()["choices"][0].contains("routed_experts"));
}

TEST(Server, NChoicesUseSeedPlusIndex) {
  Fixture f(with_routes());
  HttpResponse r = post_json(f.port, "/v1/completions",
                             {{"prompt", {5, 6, 7}}, {"max_tokens", 4}, {"n", 3}, {"seed", 100}});
  ASSERT_EQ(r.status, 200) << r.body;
  json choices = r.json()["choices"];
  ASSERT_EQ(choices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(choices[i]["index"], i);
    EXPECT_EQ(choices[i]["text"], expected_text({5, 6, 7}, 4, 100 + i));
    // Prompt rows identical across choices.
    NpyArray routes = decode_routes(choices[i]["routed_experts"]);
    NpyArray first = decode_routes(choices[0]["routed_experts"]);
    EXPECT_TRUE(std::equal(routes.data.begin(), routes.data.begin() + 2 * 8, first.data.begin()));
  }
  EXPECT_EQ(r.json()["usage"]["prompt_tokens"], 3);  // once per prompt, as vLLM counts
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 12);
}

TEST(Server, StopStringTrimsTextButRoutesCoverAllTokens) {
  Fixture f(with_routes());
  std::vector<int32_t> prompt = {1, 2, 3};
  std::string full = expected_text(prompt, 12, std::nullopt, 0);
  std::string stop = full.substr(5, 2);
  size_t cut = full.find(stop);
  for (bool stream : {false, true}) {
    HttpResponse r = post_json(f.port, "/v1/completions",
                               {{"prompt", prompt},
                                {"max_tokens", 12},
                                {"temperature", 0},
                                {"stop", stop},
                                {"stream", stream},
                                {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text;
    json final_choice;
    if (stream) {
      auto events = r.events();
      ASSERT_GE(events.size(), 2u);
      EXPECT_EQ(events.back(), "[DONE]");
      for (size_t i = 0; i + 1 < events.size(); ++i) {
        json chunk = json::parse(events[i]);
        text += chunk["choices"][0]["text"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) final_choice = chunk["choices"][0];
      }
    } else {
      final_choice = r.json()["choices"][0];
      text = final_choice["text"];
    }
    EXPECT_EQ(text, full.substr(0, cut)) << "stream=" << stream;
    EXPECT_EQ(final_choice["finish_reason"], "stop");
    EXPECT_EQ(final_choice["stop_reason"], stop);
    size_t tokens = cut + stop.size();  // generation stopped on the token completing the match
    NpyArray routes = decode_routes(final_choice["routed_experts"]);
    EXPECT_EQ(routes.shape[0], static_cast<int64_t>(prompt.size() + tokens - 1))
        << "stream=" << stream;
  }
}

TEST(Server, StreamingMatchesNonStreaming) {
  Fixture f(with_routes());
  json request = {{"prompt", "abc"}, {"max_tokens", 8}, {"n", 2}, {"seed", 3}, {"logprobs", 2}};
  json plain = post_json(f.port, "/v1/completions", request).json();
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  HttpResponse streamed = post_json(f.port, "/v1/completions", request);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
  auto events = streamed.events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["choices"].size(), 0u);
  EXPECT_EQ(usage["usage"], plain["usage"]);
  std::string texts[2];
  json finals[2];
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    int index = chunk["choices"][0]["index"];
    texts[index] += chunk["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(chunk["choices"][0]["logprobs"]["tokens"].size(),
              chunk["choices"][0]["text"].get<std::string>().size());
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      finals[index] = chunk["choices"][0];
    } else {
      EXPECT_FALSE(chunk["choices"][0].contains("routed_experts"));
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(texts[i], plain["choices"][i]["text"]);
    EXPECT_EQ(finals[i]["routed_experts"], plain["choices"][i]["routed_experts"]);
    EXPECT_EQ(finals[i]["finish_reason"], "length");
  }
}

TEST(Server, ChatCompletionAndStream) {
  Fixture f(with_routes());
  json request = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"max_completion_tokens", 6},
                  {"temperature", 0},
                  {"logprobs", true},
                  {"top_logprobs", 2}};
  HttpResponse r = post_json(f.port, "/v1/chat/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  std::string rendered = "<|user|>hi\n<|assistant|>";
  std::vector<int32_t> prompt(rendered.begin(), rendered.end());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], expected_text(prompt, 6, std::nullopt, 0));
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"].size(), 6u);
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(decode_routes(body["choices"][0]["routed_experts"]).shape[0],
            static_cast<int64_t>(prompt.size() + 6 - 1));
  request["stream"] = true;
  auto events = post_json(f.port, "/v1/chat/completions", request).events();
  ASSERT_GE(events.size(), 2u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    text += json::parse(events[i])["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, body["choices"][0]["message"]["content"]);
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["routed_experts"], body["choices"][0]["routed_experts"]);
  // Multimodal parts and tool-call parsing are out of scope: a clear 400.
  json image = {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}};
  EXPECT_EQ(post_json(f.port, "/v1/chat/completions", image).status, 400);
  json tools = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tool_choice", "auto"}};
  EXPECT_EQ(post_json(f.port, "/v1/chat/completions", tools).json()["error"]["param"],
            "tool_choice");
  json bad_template = {{"messages", {{{"role", "invalid"}, {"content", "x"}}}}};
  EXPECT_EQ(post_json(f.port, "/v1/chat/completions", bad_template).status, 400);
}

TEST(Server, SglangGenerate) {
  Fixture f(with_routes());
  HttpResponse r = post_json(f.port, "/generate",
                             {{"input_ids", {10, 11, 12}},
                              {"sampling_params", {{"max_new_tokens", 4}, {"temperature", 0}}},
                              {"return_logprob", true},
                              {"rid", "my-rid"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  EXPECT_EQ(body["text"], expected_text({10, 11, 12}, 4, std::nullopt, 0));
  EXPECT_EQ(body["output_ids"].size(), 4u);
  EXPECT_EQ(body["meta_info"]["id"], "my-rid");
  EXPECT_EQ(body["meta_info"]["prompt_tokens"], 3);
  EXPECT_EQ(body["meta_info"]["completion_tokens"], 4);
  EXPECT_EQ(body["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(body["meta_info"]["output_token_logprobs"].size(), 4u);
  EXPECT_EQ(body["meta_info"]["output_token_logprobs"][0][1], body["output_ids"][0]);
  // Flat int32 routes: (3 + 4 - 1) rows x 4 layers x 2.
  Result<std::string> bytes = base64_decode(body["meta_info"]["routed_experts"].get<std::string>());
  ASSERT_TRUE(bytes);
  EXPECT_EQ(bytes->size(), 6u * 4 * 2 * 4);
  // A list of texts answers a list.
  HttpResponse batch = post_json(
      f.port, "/generate", {{"text", {"a", "b"}}, {"sampling_params", {{"max_new_tokens", 2}}}});
  ASSERT_EQ(batch.status, 200);
  EXPECT_TRUE(batch.json().is_array());
  EXPECT_EQ(batch.json().size(), 2u);
}

TEST(Server, ReplayedRoutesComeBackAsGiven) {
  Fixture f(with_routes());
  std::vector<int32_t> prompt = {20, 21, 22, 23};
  // Replay rows 0..2 on the MoE layers: (3, 3, 2).
  std::vector<uint8_t> replay = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 1};
  std::string b64 = base64_encode(npy_encode(DType::kU8, {3, 3, 2}, replay.data()));
  HttpResponse r = post_json(f.port, "/v1/completions",
                             {{"prompt", prompt},
                              {"max_tokens", 2},
                              {"routed_experts_layers", "moe"},
                              {"routed_experts_replay", b64}});
  ASSERT_EQ(r.status, 200) << r.body;
  NpyArray routes = decode_routes(r.json()["choices"][0]["routed_experts"]);
  ASSERT_EQ(routes.shape, (std::vector<int64_t>{5, 3, 2}));
  EXPECT_TRUE(std::equal(replay.begin(), replay.end(), routes.data.begin()));
}

TEST(Server, BadInputEachAnsweredAndServerStaysHealthy) {
  ServerConfig config = with_routes();
  config.max_request_bytes = 4 << 20;
  Fixture f(config);
  auto check = [&](const std::string& name, const HttpResponse& r, int status,
                   const std::string& param) {
    EXPECT_EQ(r.status, status) << name << ": " << r.body;
    json body = r.json();
    ASSERT_TRUE(body.contains("error")) << name << ": " << r.body;
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << name;
    EXPECT_EQ(body["error"]["code"], status) << name;
    if (!param.empty()) {
      EXPECT_EQ(body["error"]["param"], param) << name << ": " << r.body;
    }
    EXPECT_TRUE(f.healthy()) << "after " << name;
  };
  auto completion = [&](json extra) {
    json body = {{"prompt", "hello"}, {"max_tokens", 4}};
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
    return post_json(f.port, "/v1/completions", body);
  };
  check("non-JSON", http_call(f.port, "POST", "/v1/completions", "this is not json"), 400, "");
  check("truncated JSON", http_call(f.port, "POST", "/v1/completions", R"({"prompt": "hel)"), 400,
        "");
  check("JSON array body", http_call(f.port, "POST", "/v1/completions", "[1,2]"), 400, "");
  check("invalid UTF-8", http_call(f.port, "POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}"),
        400, "");
  check("prompt wrong type", completion({{"prompt", 5}}), 400, "prompt");
  check("max_tokens wrong type", completion({{"max_tokens", "ten"}}), 400, "max_tokens");
  check("stream wrong type", completion({{"stream", "yes"}}), 400, "stream");
  check("stop wrong type", completion({{"stop", 3}}), 400, "stop");
  check("empty prompt", completion({{"prompt", ""}}), 400, "prompt");
  check("empty prompt list", completion({{"prompt", json::array()}}), 400, "prompt");
  check("token id >= vocab", completion({{"prompt", {1, 2, 300}}}), 400, "prompt");
  check("negative token id", completion({{"prompt", {-1}}}), 400, "prompt");
  check("stop token >= vocab", completion({{"stop_token_ids", {1000}}}), 400, "stop_token_ids");
  check("logit_bias key", completion({{"logit_bias", {{"abc", 1}}}}), 400, "logit_bias");
  check("logit_bias range", completion({{"logit_bias", {{"5", 101}}}}), 400, "logit_bias");
  for (auto [name, value] :
       std::vector<std::pair<std::string, json>>{{"temperature", -0.1},
                                                 {"temperature", 2.01},
                                                 {"top_p", 0.0},
                                                 {"top_p", 1.1},
                                                 {"top_k", -5},
                                                 {"min_p", -0.1},
                                                 {"min_p", 1.1},
                                                 {"n", 0},
                                                 {"n", 1000000},
                                                 {"max_tokens", 0},
                                                 {"max_tokens", -3},
                                                 {"max_tokens", 100000},
                                                 {"logprobs", 21},
                                                 {"logprobs", -1},
                                                 {"prompt_logprobs", 21},
                                                 {"presence_penalty", 2.5},
                                                 {"frequency_penalty", -2.5},
                                                 {"repetition_penalty", 0.0},
                                                 {"min_tokens", -1},
                                                 {"min_tokens", 10},
                                                 {"routed_experts_start", -1}}) {
    check(name + "=" + value.dump(), completion({{name, value}}), 400, name);
  }
  check("empty stop string", completion({{"stop", {"ok", ""}}}), 400, "stop");
  check("best_of", completion({{"best_of", 3}}), 400, "best_of");
  check("response_format", completion({{"response_format", {{"type", "json_object"}}}}), 400,
        "response_format");
  check("guided_json", completion({{"guided_json", {{"type", "object"}}}}), 400, "guided_json");
  check("stream_options without stream",
        completion({{"stream_options", {{"include_usage", true}}}}), 400, "stream_options");
  // A 1 MB stop string is valid (never matches here); it must not hurt.
  HttpResponse stop_ok = completion({{"stop", std::string(1 << 20, 'q')}});
  EXPECT_EQ(stop_ok.status, 200) << stop_ok.body.substr(0, 300);
  EXPECT_EQ(stop_ok.json()["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(f.healthy());
  // Replay: shape, base64, ids out of range, duplicates, more rows than the prompt.
  std::vector<int32_t> ids(2 * 4 * 2, 1);
  for (size_t i = 0; i < ids.size(); i += 2) ids[i] = 0;
  check("replay base64", completion({{"routed_experts_replay", "@@@"}}), 400,
        "routed_experts_replay");
  check("replay not npy", completion({{"routed_experts_replay", base64_encode("hello")}}), 400,
        "routed_experts_replay");
  check("replay shape",
        completion({{"routed_experts_replay",
                     base64_encode(npy_encode(DType::kI32, {4, 4}, ids.data()))}}),
        400, "routed_experts_replay");
  std::vector<int32_t> big = ids;
  big[3] = 16;
  check("replay id >= experts",
        completion({{"routed_experts_replay",
                     base64_encode(npy_encode(DType::kI32, {2, 4, 2}, big.data()))}}),
        400, "routed_experts_replay");
  std::vector<int32_t> long_replay(10 * 4 * 2);
  for (size_t i = 0; i < long_replay.size(); ++i) long_replay[i] = static_cast<int32_t>(i % 2);
  check("replay rows > prompt",
        completion({{"routed_experts_replay",
                     base64_encode(npy_encode(DType::kI32, {10, 4, 2}, long_replay.data()))}}),
        400, "routed_experts_replay");
  check("replay wrong type", completion({{"routed_experts_replay", 12}}), 400,
        "routed_experts_replay");
  // Body over the limit and a huge header: answered, then the connection is closed.
  HttpResponse too_big = http_call(f.port, "POST", "/v1/completions", std::string(5 << 20, ' '));
  EXPECT_EQ(too_big.status, 413);
  EXPECT_TRUE(f.healthy());
  HttpResponse huge_header =
      http_call(f.port, "GET", "/health", "", "X-Big: " + std::string(200 << 10, 'h') + "\r\n");
  EXPECT_EQ(huge_header.status, 431);
  EXPECT_TRUE(f.healthy());
  std::string garbage = raw_exchange(f.port, "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(parse_response(garbage).status, 400);
  EXPECT_TRUE(f.healthy());
  // Chat and /generate validate too.
  check("chat messages type", post_json(f.port, "/v1/chat/completions", {{"messages", "hi"}}), 400,
        "messages");
  check("chat empty messages",
        post_json(f.port, "/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  check("generate both", post_json(f.port, "/generate", {{"text", "a"}, {"input_ids", {1}}}), 400,
        "");
  check("generate sampling type",
        post_json(f.port, "/generate", {{"text", "a"}, {"sampling_params", 3}}), 400,
        "sampling_params");
  check("generate temperature",
        post_json(f.port, "/generate", {{"text", "a"}, {"sampling_params", {{"temperature", 9}}}}),
        400, "temperature");
  EXPECT_EQ(f.engine.active_count(), 0);
}

TEST(Server, ApiKeyOnEveryRouteButHealth) {
  ServerConfig config;
  config.api_key = "sekret";
  Fixture f(config);
  EXPECT_TRUE(f.healthy());
  for (std::string path : {"/v1/models", "/metrics", "/v1/nothing"}) {
    HttpResponse r = http_call(f.port, "GET", path);
    EXPECT_EQ(r.status, 401) << path;
    EXPECT_EQ(r.json()["error"]["code"], 401);
  }
  EXPECT_EQ(post_json(f.port, "/v1/completions", {{"prompt", "x"}}).status, 401);
  EXPECT_EQ(
      post_json(f.port, "/v1/completions", {{"prompt", "x"}}, "Authorization: Bearer wrong\r\n")
          .status,
      401);
  EXPECT_EQ(
      post_json(f.port, "/v1/completions", {{"prompt", "x"}}, "Authorization: Bearer sekret\r\n")
          .status,
      200);
}

TEST(Server, QueueFullIs429) {
  FakeEngineOptions options;
  options.max_waiting_requests = 0;
  Fixture f({}, options);
  HttpResponse r = post_json(f.port, "/v1/completions", {{"prompt", "x"}});
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.json()["error"]["type"], "RateLimitError");
}

TEST(Server, RouteCaptureFailureIs500AndNeverData) {
  Fixture f(with_routes());
  HttpResponse r =
      post_json(f.port, "/v1/completions", {{"prompt", {1, FakeEngine::kPoisonToken}}});
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("layer 2"), std::string::npos);
  auto events = post_json(f.port, "/v1/completions",
                          {{"prompt", {1, FakeEngine::kPoisonToken}}, {"stream", true}})
                    .events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(json::parse(events[0]).contains("error"));
  EXPECT_EQ(events[1], "[DONE]");
  EXPECT_TRUE(f.healthy());
}

// A client that hangs up mid-request must free its engine request at once, streaming or not.
TEST(Server, ClosedConnectionCancelsTheEngineRequest) {
  Fixture f;
  f.engine.set_step_delay_ms(20);
  for (bool stream : {false, true}) {
    int64_t cancelled_before = f.engine.cancelled_total();
    json body = {{"prompt", "long one"}, {"max_tokens", 400}, {"stream", stream}};
    int fd = connect_to(f.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, build_request("POST", "/v1/completions", body.dump())));
    for (int i = 0; i < 100 && f.engine.active_count() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(f.engine.active_count(), 1) << "stream=" << stream;
    ::close(fd);
    auto closed_at = std::chrono::steady_clock::now();
    EXPECT_TRUE(f.engine_drains()) << "stream=" << stream;
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - closed_at)
            .count();
    EXPECT_LT(ms, 500) << "stream=" << stream;
    EXPECT_EQ(f.engine.cancelled_total(), cancelled_before + 1) << "stream=" << stream;
  }
  EXPECT_TRUE(f.healthy());
}

TEST(Server, AbortRequestByRid) {
  Fixture f;
  f.engine.set_step_delay_ms(20);
  std::thread client([&] {
    HttpResponse r = post_json(
        f.port, "/generate",
        {{"text", "abc"}, {"rid", "rollout-7"}, {"sampling_params", {{"max_new_tokens", 400}}}});
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.json()["meta_info"]["finish_reason"]["type"], "abort");
  });
  for (int i = 0; i < 100 && f.engine.active_count() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  HttpResponse abort = post_json(f.port, "/abort_request", {{"rid", "rollout-7"}});
  EXPECT_EQ(abort.status, 200) << abort.body;
  client.join();
  EXPECT_TRUE(f.engine_drains());
  EXPECT_EQ(post_json(f.port, "/abort_request", {{"rid", "unknown"}}).status, 404);
}

TEST(Server, SglangGenerateStreamIsCumulativeAndEndsWithTheWholeAnswer) {
  Fixture f(with_routes());
  json request = {{"input_ids", {10, 11, 12}},
                  {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 0}}},
                  {"return_logprob", true},
                  {"return_routed_experts", true}};
  json plain = post_json(f.port, "/generate", request).json();
  request["stream"] = true;
  HttpResponse streamed = post_json(f.port, "/generate", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
  auto events = streamed.events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  size_t previous_ids = 0;
  std::string previous_text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    const bool last = i + 2 == events.size();
    // SGLang: every chunk carries the text and ids so far, not a delta.
    EXPECT_GE(chunk["output_ids"].size(), previous_ids);
    EXPECT_EQ(chunk["text"].get<std::string>().rfind(previous_text, 0), 0u) << "cumulative text";
    previous_ids = chunk["output_ids"].size();
    previous_text = chunk["text"];
    EXPECT_EQ(chunk["meta_info"]["completion_tokens"], chunk["output_ids"].size());
    if (!last) {
      EXPECT_TRUE(chunk["meta_info"]["finish_reason"].is_null()) << chunk.dump();
      EXPECT_FALSE(chunk["meta_info"].contains("routed_experts")) << "routes come with the end";
    } else {
      EXPECT_EQ(chunk["text"], plain["text"]);
      EXPECT_EQ(chunk["output_ids"], plain["output_ids"]);
      EXPECT_EQ(chunk["meta_info"]["finish_reason"], plain["meta_info"]["finish_reason"]);
      EXPECT_EQ(chunk["meta_info"]["output_token_logprobs"], plain["meta_info"]["output_token_logprobs"]);
      ASSERT_TRUE(plain["meta_info"].contains("routed_experts"));
      EXPECT_EQ(chunk["meta_info"]["routed_experts"], plain["meta_info"]["routed_experts"]);
    }
  }
  EXPECT_EQ(previous_ids, 5u);
}

TEST(Server, ContinuousUsageStatsOnEveryChunk) {
  Fixture f;
  json request = {{"prompt", "abcd"},
                  {"max_tokens", 6},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  auto events = post_json(f.port, "/v1/completions", request).events();
  ASSERT_GE(events.size(), 3u);
  ASSERT_EQ(events.back(), "[DONE]");
  json final_usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(final_usage["choices"].size(), 0u);
  EXPECT_EQ(final_usage["usage"]["completion_tokens"], 6);
  const int64_t prompt_tokens = final_usage["usage"]["prompt_tokens"];
  EXPECT_GE(prompt_tokens, 4);
  int64_t previous = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    ASSERT_TRUE(chunk.contains("usage")) << chunk.dump();
    const int64_t completion = chunk["usage"]["completion_tokens"];
    EXPECT_EQ(chunk["usage"]["prompt_tokens"], prompt_tokens);
    EXPECT_GE(completion, previous) << "usage so far never goes back";
    EXPECT_GT(completion, 0) << "a chunk carries at least one new token";
    EXPECT_EQ(chunk["usage"]["total_tokens"], prompt_tokens + completion);
    previous = completion;
  }
  EXPECT_EQ(previous, 6) << "the last content chunk's usage is the whole answer's";
}

TEST(Server, AbortAllEndsEveryRequestInFlight) {
  Fixture f;
  f.engine.set_step_delay_ms(20);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i)
    clients.emplace_back([&, i] {
      HttpResponse r = post_json(f.port, "/generate",
                                 {{"text", "abc"},
                                  {"rid", "rollout-" + std::to_string(i)},
                                  {"sampling_params", {{"max_new_tokens", 400}}}});
      EXPECT_EQ(r.status, 200);
      EXPECT_EQ(r.json()["meta_info"]["finish_reason"]["type"], "abort") << r.body;
    });
  for (int i = 0; i < 200 && f.engine.active_count() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.engine.active_count(), 3u);
  HttpResponse abort = post_json(f.port, "/abort_request", {{"abort_all", true}});
  EXPECT_EQ(abort.status, 200) << abort.body;
  for (auto& c : clients) c.join();
  EXPECT_TRUE(f.engine_drains());
  EXPECT_EQ(http_call(f.port, "GET", "/health").status, 200);
}

TEST(Server, ChatPromptLogprobsCoverTheRenderedPrompt) {
  Fixture f;
  json request = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"max_completion_tokens", 2},
                  {"prompt_logprobs", 1}};
  HttpResponse r = post_json(f.port, "/v1/chat/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  const std::string rendered = "<|user|>hi\n<|assistant|>";
  ASSERT_TRUE(body.contains("prompt_logprobs")) << body.dump();
  ASSERT_EQ(body["prompt_logprobs"].size(), rendered.size()) << "one per prompt position";
  EXPECT_TRUE(body["prompt_logprobs"][0].is_null()) << "position 0 has no logprob";
  for (size_t p = 1; p < rendered.size(); ++p) {
    const json& entry = body["prompt_logprobs"][p];
    const std::string actual = std::to_string(static_cast<unsigned char>(rendered[p]));
    ASSERT_TRUE(entry.contains(actual)) << "position " << p << ": " << entry.dump();
    EXPECT_LE(entry.size(), 2u) << "the prompt token plus at most 1 top entry";
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], rendered.size());
}

TEST(Server, TokenizeDetokenizeMetricsAndRlRoutes) {
  Fixture f;
  HttpResponse tok = post_json(f.port, "/tokenize", {{"prompt", "ab"}});
  ASSERT_EQ(tok.status, 200);
  EXPECT_EQ(tok.json()["tokens"], json({FakeCodec::kBos, 'a', 'b'}));
  EXPECT_EQ(tok.json()["count"], 3);
  HttpResponse chat_tok =
      post_json(f.port, "/tokenize", {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(chat_tok.json()["count"], std::string("<|user|>x\n<|assistant|>").size());
  HttpResponse detok = post_json(f.port, "/detokenize", {{"tokens", {'h', 'i'}}});
  EXPECT_EQ(detok.json()["prompt"], "hi");
  EXPECT_EQ(post_json(f.port, "/detokenize", {{"tokens", {999}}}).status, 400);
  post_json(f.port, "/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}});
  HttpResponse metrics = http_call(f.port, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_sum", "switchyard:kv_blocks_used",
        "switchyard:kv_blocks_cached", "switchyard:kv_blocks_free",
        "switchyard:route_capture_errors_total"}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(metrics.body.find(
                "vllm:request_success_total{model_name=\"fake\",finished_reason=\"length\"} 1"),
            std::string::npos)
      << metrics.body;
  HttpResponse update =
      post_json(f.port, "/update_weights_from_disk", {{"model_path", "/some/dir"}});
  EXPECT_EQ(update.status, 200);
  EXPECT_EQ(update.json()["success"], true);
  HttpResponse bad_update =
      post_json(f.port, "/update_weights_from_disk", {{"model_path", "/nonexistent"}});
  EXPECT_EQ(bad_update.status, 404);
  EXPECT_EQ(bad_update.json()["success"], false);
  EXPECT_EQ(post_json(f.port, "/update_weights_from_disk", json::object()).status, 400);
  EXPECT_EQ(post_json(f.port, "/flush_cache", json::object()).status, 200);
}

TEST(Server, GracefulDrainFinishesInFlightThenStops) {
  Fixture f;
  f.engine.set_step_delay_ms(5);
  std::thread client([&] {
    HttpResponse r = post_json(f.port, "/v1/completions", {{"prompt", "abc"}, {"max_tokens", 40}});
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "length");
  });
  for (int i = 0; i < 100 && f.engine.active_count() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  f.server->request_shutdown();
  EXPECT_EQ(http_call(f.port, "GET", "/health").status, 503);
  EXPECT_EQ(post_json(f.port, "/v1/completions", {{"prompt", "x"}}).status, 503);
  f.server->wait();
  client.join();
}

TEST(Server, KeepAliveServesSeveralRequestsOnOneConnection) {
  Fixture f;
  int fd = connect_to(f.port);
  ASSERT_GE(fd, 0);
  std::string body = json{{"prompt", "ab"}, {"max_tokens", 2}}.dump();
  std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_TRUE(send_all(fd, request + request));  // pipelined
  std::string received;
  char buffer[4096];
  while (received.find("text_completion", received.find("text_completion") + 1) ==
         std::string::npos) {
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t first = received.find("HTTP/1.1 200");
  ASSERT_NE(first, std::string::npos);
  EXPECT_NE(received.find("HTTP/1.1 200", first + 1), std::string::npos) << received;
}

}  // namespace
}  // namespace sy::server

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;

// Bounded load: 64 concurrent clients, streaming and not, mixed lengths, for a fixed time.
// Every request must succeed with complete routes, and the engine must end idle.
TEST(Load, SixtyFourConcurrentClients) {
  ServerConfig config;
  config.enable_return_routed_experts = true;
  config.return_routed_experts_default = true;
  config.io_threads = 2;
  Fixture f(config);
  std::atomic<int> ok{0}, failed{0};
  std::mutex failure_mutex;
  std::string first_failure;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<std::thread> clients;
  for (int c = 0; c < 64; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
        int max_tokens = 1 + (c * 7 + i * 3) % 24;
        std::string prompt(1 + (c * 13 + i) % 40, static_cast<char>('a' + c % 26));
        bool stream = (c + i) % 2 == 0;
        HttpResponse r =
            post_json(f.port, "/v1/completions",
                      {{"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}});
        std::string routes;
        int64_t tokens = 0;
        if (r.status == 200 && stream) {
          for (const std::string& event : r.events()) {
            if (event == "[DONE]") continue;
            json chunk = json::parse(event, nullptr, false);
            if (chunk.is_discarded() || chunk["choices"].empty()) continue;
            tokens += static_cast<int64_t>(chunk["choices"][0]["text"].get<std::string>().size());
            if (chunk["choices"][0].contains("routed_experts"))
              routes = chunk["choices"][0]["routed_experts"];
          }
        } else if (r.status == 200) {
          json body = r.json();
          tokens = static_cast<int64_t>(body["choices"][0]["text"].get<std::string>().size());
          routes = body["choices"][0].value("routed_experts", "");
        }
        bool good = r.status == 200 && tokens == max_tokens && !routes.empty();
        if (good) {
          Result<std::string> bytes = base64_decode(routes);
          Result<NpyArray> array = bytes ? npy_decode(*bytes) : Result<NpyArray>(bytes.status());
          good =
              array && array->shape[0] == static_cast<int64_t>(prompt.size() + 1 + max_tokens - 1);
        }
        if (good) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard lock(failure_mutex);
          if (first_failure.empty())
            first_failure = std::to_string(r.status) + " " + r.body.substr(0, 300);
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GT(ok.load(), 64);
  EXPECT_TRUE(f.engine_drains());
  EXPECT_TRUE(f.healthy());
  std::printf("load: %d requests ok in 3 s with 64 clients\n", ok.load());
}

}  // namespace
}  // namespace sy::server
