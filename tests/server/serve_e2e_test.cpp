// `switchyard serve` end to end on a tiny random model (CPU backend): real clients, routes equal to
// `switchyard generate`'s, concurrency, prefix-cache hits, cancellation, replay rescoring, weight
// updates, preemption and a graceful SIGTERM.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "http_client.h"
#include "process_util.h"
#include "serve_process.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;
namespace fs = std::filesystem;

std::string model_dir(int seed) {
  return std::string(SY_BINARY_DIR) + "/serve_e2e_tiny_" + std::to_string(seed);
}

// Makes (once) a tiny random model with the given weight seed.
std::string make_model(int seed) {
  std::string dir = model_dir(seed);
  if (fs::exists(dir + "/config.json")) return dir;
  CommandResult r =
      run_command(shell_quote(switchyard_binary()) + " make-model --preset tiny --seed " +
                  std::to_string(seed) + " --out " + shell_quote(dir));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
}

// The value of the first sample of `name` (a Prometheus text line "name{labels} value").
double metric_value(const std::string& metrics, const std::string& name) {
  size_t line = 0;
  while (line < metrics.size()) {
    size_t eol = metrics.find('\n', line);
    if (eol == std::string::npos) eol = metrics.size();
    std::string text = metrics.substr(line, eol - line);
    if (text.rfind(name, 0) == 0 && text.size() > name.size() &&
        (text[name.size()] == '{' || text[name.size()] == ' ')) {
      return std::stod(text.substr(text.rfind(' ') + 1));
    }
    line = eol + 1;
  }
  return -1;
}

NpyArray decode_npy(const json& b64) {
  Result<std::string> bytes = base64_decode(b64.get<std::string>());
  EXPECT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(bytes ? *bytes : std::string());
  EXPECT_TRUE(array) << array.message();
  return array ? *array : NpyArray{};
}

std::vector<int64_t> routes_of(const json& choice) {
  Result<std::vector<int64_t>> values = npy_to_int64(decode_npy(choice["routed_experts"]));
  return values ? *values : std::vector<int64_t>{};
}

class ServeE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = make_model(1);
    serve_ = new ServeProcess();
    std::string error = serve_->start(
        {"--model", model_, "--served-model-name", "tiny", "--enable-return-routed-experts",
         "--return-routed-experts-default", "--max-num-batched-tokens", "64"});
    if (!error.empty()) {
      start_error_ = error;
      return;
    }
    json models = http_call(serve_->port(), "GET", "/v1/models").json();
    card_ = models["data"][0];
  }
  static void TearDownTestSuite() {
    if (serve_) {
      int status = serve_->terminate();
      EXPECT_EQ(status, 0) << "SIGTERM must drain and exit 0:\n" << serve_->output();
      delete serve_;
      serve_ = nullptr;
    }
  }
  void SetUp() override { ASSERT_TRUE(start_error_.empty()) << start_error_; }

  uint16_t port() const { return serve_->port(); }
  json complete(json body) {
    body["model"] = "tiny";
    HttpResponse r = post_json(port(), "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json();
  }
  std::string metrics() { return http_call(port(), "GET", "/metrics").body; }

  static inline std::string model_;
  static inline ServeProcess* serve_ = nullptr;
  static inline std::string start_error_;
  static inline json card_;
};

TEST_F(ServeE2E, ModelCardAndHealth) {
  EXPECT_EQ(http_call(port(), "GET", "/health").status, 200);
  EXPECT_EQ(card_["id"], "tiny");
  EXPECT_GT(card_["num_experts"].get<int>(), 0);
  EXPECT_GT(card_["moe_layers"].size(), 0u);
}

TEST_F(ServeE2E, OpenAiNodeClient) {
  std::string deps = node_deps_dir();
  ASSERT_FALSE(deps.empty()) << "deps/node_modules/openai is missing: run scripts/setup.sh";
  // Every build has the chat module: a chat request that does not succeed is a failure, never a
  // reason to skip the client's chat checks.
  HttpResponse chat =
      post_json(port(), "/v1/chat/completions",
                {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}});
  ASSERT_EQ(chat.status, 200) << "chat completions must work in this build: " << chat.body;
  CommandResult r = run_command(
      "node " + shell_quote(std::string(SY_SOURCE_DIR) + "/tests/server/openai_client.mjs") +
      " --base-url http://127.0.0.1:" + std::to_string(port()) + "/v1 --deps " + shell_quote(deps));
  EXPECT_EQ(r.output.find("skipped (--no-chat)"), std::string::npos) << "the chat checks must run";
  std::cout << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

std::vector<int> token_prompt(int length, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < length; ++i) ids.push_back(1000 + (i * 37 + salt * 101) % 20000);
  return ids;
}

struct Outcome {
  std::vector<int> tokens;
  std::vector<int64_t> routes;
  int64_t cached_tokens = 0;
  bool operator==(const Outcome& other) const {
    return tokens == other.tokens && routes == other.routes;
  }
};

Outcome outcome_of(const json& body) {
  Outcome o;
  const json& choice = body["choices"][0];
  for (const json& t : choice["token_ids"]) o.tokens.push_back(t.get<int>());
  o.routes = routes_of(choice);
  o.cached_tokens = body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  return o;
}

// Streams the request and rebuilds the same Outcome from the chunks.
Outcome streamed_outcome(uint16_t port, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  HttpResponse r = post_json(port, "/v1/completions", body);
  Outcome o;
  EXPECT_EQ(r.status, 200) << r.body;
  for (const std::string& event : r.events()) {
    if (event == "[DONE]") continue;
    json chunk = json::parse(event);
    if (chunk.contains("usage") && chunk["choices"].empty()) {
      o.cached_tokens = chunk["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
      continue;
    }
    const json& choice = chunk["choices"][0];
    for (const json& t : choice["token_ids"]) o.tokens.push_back(t.get<int>());
    if (choice.contains("routed_experts")) o.routes = routes_of(choice);
  }
  return o;
}

json greedy_request(const std::vector<int>& prompt, int max_tokens) {
  return json{{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", max_tokens},
              {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

TEST_F(ServeE2E, RoutesCoverPromptAndCompletion) {
  std::vector<int> prompt = token_prompt(20, 1);
  json body = complete(greedy_request(prompt, 5));
  NpyArray routes = decode_npy(body["choices"][0]["routed_experts"]);
  ASSERT_EQ(routes.shape.size(), 3u);
  EXPECT_EQ(routes.shape[0], 20 + 5 - 1);
  EXPECT_EQ(routes.shape[1], card_["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(routes.shape[2], card_["top_k"].get<int64_t>());
}

// stream_routed_experts on the real engine: the chunks' pieces (ids and float16 gating weights)
// reassemble to the non-streamed answer, also past the prefill chunk size and from a start row.
TEST_F(ServeE2E, StreamedRoutesAndWeightsEqualTheNonStreamedAnswer) {
  ASSERT_EQ(card_["routed_experts_weights"], true);
  const int64_t layers = card_["num_hidden_layers"], top_k = card_["top_k"];
  std::vector<int> moe_layers = card_["moe_layers"].get<std::vector<int>>();
  for (int length : {7, 90}) {  // 90 > the 64-token prefill chunk
    json body = greedy_request(token_prompt(length, 9000 + length), 6);
    body["return_routed_experts_weights"] = true;
    body["routed_experts_start"] = 3;
    json whole = complete(body)["choices"][0];
    NpyArray ids = decode_npy(whole["routed_experts"]);
    NpyArray weights = decode_npy(whole["routed_experts_weights"]);
    ASSERT_EQ(ids.shape, (std::vector<int64_t>{length + 6 - 1 - 3, layers, top_k}));
    ASSERT_EQ(weights.dtype, DType::kF16);
    ASSERT_EQ(weights.shape, ids.shape);
    // Gating weights: positive on MoE layers, in the ids' (descending score) order, 0 on dense.
    const auto* half = reinterpret_cast<const uint16_t*>(weights.data.data());
    for (int64_t row = 0; row < ids.shape[0]; ++row)
      for (int64_t layer = 0; layer < layers; ++layer) {
        const bool is_moe =
            std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end();
        for (int64_t k = 0; k < top_k; ++k) {
          const float w = f16_to_f32(half[(row * layers + layer) * top_k + k]);
          if (!is_moe) {
            EXPECT_EQ(w, 0.0f);
          } else {
            EXPECT_GT(w, 0.0f);
            if (k > 0) {
              EXPECT_LE(w, f16_to_f32(half[(row * layers + layer) * top_k + k - 1]));
            }
          }
        }
      }
    body["stream"] = true;
    body["stream_routed_experts"] = true;
    HttpResponse r = post_json(port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<uint8_t> joined_ids, joined_weights;
    int64_t rows = 0;
    int pieces = 0;
    for (const std::string& event : r.events()) {
      if (event == "[DONE]") continue;
      json choice = json::parse(event)["choices"][0];
      if (!choice.contains("routed_experts")) continue;
      EXPECT_EQ(choice["routed_experts_first_row"].get<int64_t>(), 3 + rows);
      NpyArray piece = decode_npy(choice["routed_experts"]);
      NpyArray piece_weights = decode_npy(choice["routed_experts_weights"]);
      EXPECT_EQ(piece.shape, piece_weights.shape);
      rows += piece.shape[0];
      pieces += piece.shape[0] > 0;
      joined_ids.insert(joined_ids.end(), piece.data.begin(), piece.data.end());
      joined_weights.insert(joined_weights.end(), piece_weights.data.begin(),
                            piece_weights.data.end());
    }
    EXPECT_GE(pieces, 5) << "the prompt's piece, then a row with each token";
    EXPECT_EQ(rows, ids.shape[0]);
    EXPECT_EQ(joined_ids, ids.data);
    EXPECT_EQ(joined_weights, weights.data);
  }
}

// Samples of a labelled family, by their label text ("layer=\"1\",expert=\"3\"").
std::map<std::string, double> family(const std::string& metrics, const std::string& name) {
  std::map<std::string, double> out;
  std::istringstream lines(metrics);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t close = line.find('}');
    std::string labels = line.substr(name.size() + 1, close - name.size() - 1);
    labels = labels.substr(labels.find(',') + 1);  // drop model_name
    out[labels] = std::stod(line.substr(close + 2));
  }
  return out;
}

// /metrics: a request that misses the prefix cache adds its rows to routes captured, and its
// routes to each layer's expert load; imbalance is max/mean of the load.
TEST_F(ServeE2E, MetricsCountRoutesAndExpertLoad) {
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  const std::string before = metrics();
  json body = greedy_request(token_prompt(21, 7777), 4);
  json choice = complete(body)["choices"][0];
  const std::vector<int64_t> ids = routes_of(choice);
  const std::string after = metrics();
  const int64_t layers = card_["num_hidden_layers"], top_k = card_["top_k"],
                experts = card_["num_experts"];
  const int64_t rows = 21 + 4 - 1;
  ASSERT_EQ(static_cast<int64_t>(ids.size()), rows * layers * top_k);
  EXPECT_EQ(metric_value(after, "switchyard:routes_captured_total") -
                metric_value(before, "switchyard:routes_captured_total"),
            rows);
  EXPECT_EQ(metric_value(after, "switchyard:routes_poisoned_total"), 0);
  // The request's steps (its prefill and 3 decode steps) are counted and timed, and their route
  // work on the host is a part of that time. A step's counters land after it delivered its events,
  // so the last step may not be in `after` yet.
  auto grew = [&](const char* name) { return metric_value(after, name) - metric_value(before, name); };
  EXPECT_GE(grew("switchyard:engine_steps_total"), 3);
  EXPECT_GT(grew("switchyard:engine_step_seconds_total"), 0);
  EXPECT_GT(grew("switchyard:route_host_seconds_total"), 0);
  EXPECT_LT(grew("switchyard:route_host_seconds_total"), grew("switchyard:engine_step_seconds_total"));
  auto load_before = family(before, "switchyard:expert_load_tokens_total");
  auto load_after = family(after, "switchyard:expert_load_tokens_total");
  auto imbalance = family(after, "switchyard:expert_load_imbalance");
  for (int layer : card_["moe_layers"].get<std::vector<int>>()) {
    std::vector<int64_t> expected(static_cast<size_t>(experts), 0);
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t k = 0; k < top_k; ++k) ++expected[ids[(row * layers + layer) * top_k + k]];
    double max_load = 0, sum = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const std::string key = fmt::format("layer=\"{}\",expert=\"{}\"", layer, e);
      ASSERT_TRUE(load_after.count(key)) << key;
      EXPECT_EQ(load_after[key] - load_before[key], expected[e]) << key;
      max_load = std::max(max_load, load_after[key]);
      sum += load_after[key];
    }
    EXPECT_NEAR(imbalance[fmt::format("layer=\"{}\"", layer)], max_load / (sum / experts), 1e-3);
  }
}

// Under concurrency (32 mixed requests, streaming and not, prompts longer than the 64-token
// chunk), every request's tokens and routes equal those it gets alone.
TEST_F(ServeE2E, ConcurrentRequestsEqualAlone) {
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(token_prompt(5 + i * 23, i));
  std::vector<Outcome> alone;
  for (auto& p : prompts) {
    ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
    alone.push_back(outcome_of(complete(greedy_request(p, 6))));
    ASSERT_EQ(alone.back().tokens.size(), 6u);
  }
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  std::vector<Outcome> together(32);
  std::vector<std::thread> clients;
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&, i] {
      json request = greedy_request(prompts[i % 8], 6);
      together[i] = i % 2 ? streamed_outcome(port(), request)
                          : outcome_of(post_json(port(), "/v1/completions", request).json());
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(together[i].tokens, alone[i % 8].tokens) << "request " << i;
    EXPECT_TRUE(together[i].routes == alone[i % 8].routes) << "request " << i;
  }
}

// Repeating a finished request is a full prefix-cache hit: the metrics show the hit and the
// skipped prefill, and the restored routes equal the computed ones.
TEST_F(ServeE2E, RepeatedRequestHitsThePrefixCacheWithRoutes) {
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  std::vector<int> prompt = token_prompt(100, 7);
  Outcome first = outcome_of(complete(greedy_request(prompt, 4)));
  std::string before = metrics();
  Outcome second = outcome_of(complete(greedy_request(prompt, 4)));
  std::string after = metrics();
  EXPECT_GE(second.cached_tokens, 64) << "a 100-token prompt has at least 6 full 16-token blocks";
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_TRUE(first.routes == second.routes);
  double hits = metric_value(after, "vllm:prefix_cache_hits_total") -
                metric_value(before, "vllm:prefix_cache_hits_total");
  double computed = metric_value(after, "switchyard:prompt_tokens_computed_total") -
                    metric_value(before, "switchyard:prompt_tokens_computed_total");
  EXPECT_EQ(hits, static_cast<double>(second.cached_tokens));
  EXPECT_EQ(computed, 100.0 - static_cast<double>(second.cached_tokens));
  // Shared prefix, different suffix: equals the same request on a cold cache.
  std::vector<int> other = prompt;
  other.resize(90);
  for (int t : token_prompt(15, 9)) other.push_back(t);
  Outcome warm = outcome_of(complete(greedy_request(other, 4)));
  EXPECT_GT(warm.cached_tokens, 0);
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  Outcome cold = outcome_of(complete(greedy_request(other, 4)));
  EXPECT_EQ(cold.cached_tokens, 0);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_TRUE(warm.routes == cold.routes);
}

// A client that hangs up (mid-prefill or mid-decode, streaming or not) frees its KV blocks.
TEST_F(ServeE2E, ClosedConnectionFreesKvBlocks) {
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  double used_before = metric_value(metrics(), "switchyard:kv_blocks_used");
  struct Case {
    const char* name;
    int prompt_tokens;
    bool stream;
    bool wait_for_decode;
  };
  for (Case c :
       {Case{"mid-decode", 30, false, true}, Case{"mid-decode stream", 30, true, true},
        Case{"mid-prefill", 1500, false, false}, Case{"mid-prefill stream", 1500, true, false}}) {
    json body = greedy_request(token_prompt(c.prompt_tokens, 3), 500);
    body["stream"] = c.stream;
    int fd = connect_to(port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, build_request("POST", "/v1/completions", body.dump())));
    if (c.wait_for_decode) {
      for (int i = 0; i < 400 && metric_value(metrics(), "vllm:num_requests_running") < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::close(fd);
    bool freed = false;
    for (int i = 0; i < 400 && !freed; ++i) {
      std::string m = metrics();
      freed = metric_value(m, "switchyard:kv_blocks_used") == used_before &&
              metric_value(m, "vllm:num_requests_running") == 0 &&
              metric_value(m, "vllm:num_requests_waiting") == 0;
      if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(freed) << c.name << ": kv_blocks_used "
                       << metric_value(metrics(), "switchyard:kv_blocks_used") << " vs "
                       << used_before;
  }
}

// R3: rescoring a rollout under its own routes gives the rollout's logprobs.
TEST_F(ServeE2E, ReplayRescoresTheRollout) {
  std::vector<int> prompt = token_prompt(12, 11);
  json rollout = complete({{"prompt", prompt},
                           {"max_tokens", 6},
                           {"temperature", 1},
                           {"seed", 5},
                           {"logprobs", 0},
                           {"ignore_eos", true},
                           {"return_token_ids", true}});
  const json& choice = rollout["choices"][0];
  std::vector<int> full = prompt;
  for (const json& t : choice["token_ids"]) full.push_back(t.get<int>());
  ASSERT_EQ(full.size(), 18u);
  json rescore = complete({{"prompt", full},
                           {"max_tokens", 1},
                           {"temperature", 0},
                           {"prompt_logprobs", 0},
                           {"routed_experts_replay", choice["routed_experts"]}});
  const json& prompt_logprobs = rescore["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(prompt_logprobs.size(), full.size());
  // The CPU computes a prompt row and a decode row alike (1e-5); CUDA's prefill GEMMs round
  // activations to bf16 where decode's GEMV keeps f32, so there the rescored logprob can move by
  // a few 1e-4 (seen up to 6e-4 on the H200): 2e-3 there. The routes must still come back as given.
  const char* serve_args = std::getenv("SY_SERVE_ARGS");
  const double tolerance = serve_args && std::string(serve_args).find("cuda") != std::string::npos ? 2e-3 : 1e-5;
  for (size_t j = 0; j < 6; ++j) {
    int token = full[12 + j];
    double expected = choice["logprobs"]["token_logprobs"][j].get<double>();
    double got = prompt_logprobs[12 + j][std::to_string(token)]["logprob"].get<double>();
    EXPECT_NEAR(got, expected, tolerance) << "position " << 12 + j;
  }
  // The replayed rows come back as given.
  std::vector<int64_t> given = routes_of(choice);
  std::vector<int64_t> returned = routes_of(rescore["choices"][0]);
  ASSERT_GE(returned.size(), given.size());
  EXPECT_TRUE(std::equal(given.begin(), given.end(), returned.begin()));
}

// New weights change outputs; the old weights' cached routes are never served.
TEST_F(ServeE2E, WeightUpdateChangesOutputsAndFlushesCachedRoutes) {
  std::string other = make_model(2);
  std::vector<int> prompt = token_prompt(40, 13);
  Outcome old_weights = outcome_of(complete(greedy_request(prompt, 5)));
  HttpResponse bad =
      post_json(port(), "/update_weights_from_disk", {{"model_path", "/nonexistent/model"}});
  EXPECT_GE(bad.status, 400);
  EXPECT_EQ(bad.json()["success"], false);
  EXPECT_TRUE(outcome_of(complete(greedy_request(prompt, 5))) == old_weights)
      << "old weights must stay in service";
  HttpResponse update = post_json(port(), "/update_weights_from_disk", {{"model_path", other}});
  ASSERT_EQ(update.status, 200) << update.body;
  Outcome new_weights = outcome_of(complete(greedy_request(prompt, 5)));
  EXPECT_EQ(new_weights.cached_tokens, 0) << "the prefix cache must be flushed with the weights";
  EXPECT_FALSE(new_weights == old_weights);
  ASSERT_EQ(post_json(port(), "/update_weights_from_disk", {{"model_path", model_}}).status, 200);
  Outcome back = outcome_of(complete(greedy_request(prompt, 5)));
  EXPECT_EQ(back.cached_tokens, 0);
  EXPECT_TRUE(back == old_weights);
}

// A KV cache so small that requests must be preempted: results still equal those computed alone.
// A long request runs first (the server's running gauge says so) and the six others arrive while
// it grows: the cache cannot hold it beside them whatever the client threads' timing (six threads
// alone might not overlap on a loaded machine, as one engine test's requests once did not).
TEST_F(ServeE2E, PreemptionKeepsRoutesExact) {
  std::vector<std::vector<int>> prompts;
  std::vector<int> lengths;
  std::vector<Outcome> alone;
  for (int i = 0; i < 7; ++i) {
    prompts.push_back(token_prompt(40, 20 + i));
    lengths.push_back(i == 0 ? 100 : 24);  // the first: 140 tokens, 9 of the 10 blocks
    alone.push_back(outcome_of(complete(greedy_request(prompts.back(), lengths.back()))));
  }
  ServeProcess small;
  std::string error =
      small.start({"--model", model_, "--served-model-name", "tiny",
                   "--enable-return-routed-experts", "--return-routed-experts-default",
                   "--kv-cache-tokens", "160", "--max-num-batched-tokens", "64"});
  ASSERT_TRUE(error.empty()) << error;
  std::vector<Outcome> squeezed(7);
  auto run = [&](int i) {
    squeezed[i] = outcome_of(
        post_json(small.port(), "/v1/completions", greedy_request(prompts[i], lengths[i])).json());
  };
  std::vector<std::thread> clients;
  clients.emplace_back(run, 0);
  bool running = false;
  for (int i = 0; i < 2000 && !running; ++i) {
    running = metric_value(http_call(small.port(), "GET", "/metrics").body,
                           "vllm:num_requests_running") >= 1;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(running) << "the long request never showed as running";
  for (int i = 1; i < 7; ++i) clients.emplace_back(run, i);
  for (auto& c : clients) c.join();
  double preemptions =
      metric_value(http_call(small.port(), "GET", "/metrics").body, "vllm:num_preemptions_total");
  EXPECT_GT(preemptions, 0) << "the test must actually preempt";
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(squeezed[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_TRUE(squeezed[i].routes == alone[i].routes) << "request " << i;
  }
  EXPECT_EQ(small.terminate(), 0) << small.output();
}

// The server's tokens and routes equal `switchyard generate`'s for the same prompt (greedy):
// alone, after a full prefix-cache hit, and for a prompt longer than the 64-token chunk.
TEST_F(ServeE2E, EqualsGenerate) {
  for (int length : {3, 20, 150}) {
    std::vector<int> prompt = token_prompt(length, length);
    std::string ids;
    for (int t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::string routes_path = std::string(SY_BINARY_DIR) + "/serve_e2e_generate_routes.npy";
    CommandResult g =
        run_command(shell_quote(switchyard_binary()) + " generate --model " + shell_quote(model_) +
                    " --prompt-ids " + ids +
                    " --max-tokens 6 --temperature 0 --ignore-eos --json --routes-out " +
                    shell_quote(routes_path) + " 2>/dev/null");
    ASSERT_EQ(g.exit_code, 0) << g.output;
    json generated = json::parse(g.output.substr(g.output.find('{')), nullptr, false);
    ASSERT_TRUE(generated.is_object()) << g.output;
    Result<NpyArray> file = npy_read_file(routes_path);
    ASSERT_TRUE(file) << file.message();
    std::vector<int64_t> generate_routes = *npy_to_int64(*file);
    for (int round = 0; round < 2; ++round) {  // round 1 is a prefix-cache hit
      json body = complete(greedy_request(prompt, 6));
      Outcome served = outcome_of(body);
      EXPECT_EQ(json(served.tokens), generated["completion_token_ids"])
          << "length " << length << " round " << round;
      EXPECT_TRUE(served.routes == generate_routes) << "length " << length << " round " << round;
      NpyArray wire = decode_npy(body["choices"][0]["routed_experts"]);
      EXPECT_EQ(wire.dtype, file->dtype);
      EXPECT_EQ(wire.shape, file->shape);
      if (round == 1 && length >= 20) EXPECT_GT(served.cached_tokens, 0) << "length " << length;
    }
    std::filesystem::remove(routes_path);
  }
}

int64_t rss_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Every MoE row a set of distinct valid ids, dense rows zero, rows = prompt + completion - 1.
bool routes_complete(const json& choice, int64_t rows, const json& card) {
  NpyArray routes = decode_npy(choice["routed_experts"]);
  int64_t layers = card["num_hidden_layers"].get<int64_t>(), k = card["top_k"].get<int64_t>();
  if (routes.shape != std::vector<int64_t>{rows, layers, k}) return false;
  std::vector<int64_t> ids = *npy_to_int64(routes);
  std::vector<bool> moe(static_cast<size_t>(layers), false);
  for (const json& l : card["moe_layers"]) moe[l.get<size_t>()] = true;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t* row = ids.data() + (r * layers + l) * k;
      for (int64_t a = 0; a < k; ++a) {
        if (!moe[l] && row[a] != 0) return false;
        if (moe[l] && (row[a] < 0 || row[a] >= card["num_experts"].get<int64_t>())) return false;
        for (int64_t b = 0; moe[l] && b < a; ++b) {
          if (row[a] == row[b]) return false;
        }
      }
    }
  }
  return true;
}

// Bounded load (loopback, fixed clients and time; SY_LOAD_SECONDS per round, default 30, and
// SY_LOAD_ROUNDS, default 2, after a warm-up round): 64 clients with
// mixed lengths, streaming and not. Zero failures, every route complete, RSS back to baseline.
TEST_F(ServeE2E, LoadSixtyFourClients) {
  int seconds = std::getenv("SY_LOAD_SECONDS") ? std::atoi(std::getenv("SY_LOAD_SECONDS")) : 30;
  auto run_clients = [&](int clients_count, std::chrono::steady_clock::time_point deadline,
                         std::atomic<int>& ok, std::atomic<int>& failed, std::string& first_failure,
                         std::mutex& mutex) {
    std::vector<std::thread> clients;
    for (int c = 0; c < clients_count; ++c) {
      clients.emplace_back([&, c] {
        for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
          std::vector<int> prompt = token_prompt(1 + (c * 17 + i * 5) % 120, c * 1000 + i);
          int max_tokens = 1 + (c + i * 3) % 16;
          json request = greedy_request(prompt, max_tokens);
          bool good = false;
          std::string what;
          if ((c + i) % 2) {
            Outcome o = streamed_outcome(port(), request);
            good = static_cast<int>(o.tokens.size()) == max_tokens &&
                   o.routes.size() == (prompt.size() + max_tokens - 1) *
                                          card_["num_hidden_layers"].get<size_t>() *
                                          card_["top_k"].get<size_t>();
            what = "stream";
          } else {
            HttpResponse r = post_json(port(), "/v1/completions", request);
            json body = r.json();
            good = r.status == 200 &&
                   body["choices"][0]["token_ids"].size() == static_cast<size_t>(max_tokens) &&
                   routes_complete(body["choices"][0],
                                   static_cast<int64_t>(prompt.size()) + max_tokens - 1, card_);
            what = std::to_string(r.status) + " " + r.body.substr(0, 200);
          }
          if (good) {
            ++ok;
          } else {
            ++failed;
            std::lock_guard lock(mutex);
            if (first_failure.empty()) first_failure = what;
          }
        }
      });
    }
    for (auto& t : clients) t.join();
  };
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::mutex mutex;
  // Warm-up round as long as a measured one: the KV cache, per-thread malloc arenas and buffers
  // reach their working size (measured: RSS then stays flat over further rounds).
  run_clients(64, std::chrono::steady_clock::now() + std::chrono::seconds(seconds), ok, failed,
              first_failure, mutex);
  ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int64_t baseline = rss_kib(serve_->pid());
  int rounds = std::getenv("SY_LOAD_ROUNDS") ? std::atoi(std::getenv("SY_LOAD_ROUNDS")) : 2;
  int64_t after = 0;
  for (int round = 0; round < rounds; ++round) {
    run_clients(64, std::chrono::steady_clock::now() + std::chrono::seconds(seconds), ok, failed,
                first_failure, mutex);
    ASSERT_EQ(post_json(port(), "/flush_cache", json::object()).status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    after = rss_kib(serve_->pid());
    std::cout << "load round " << round << ": RSS " << after / 1024 << " MiB\n";
  }
  EXPECT_EQ(failed.load(), 0) << first_failure;
  std::string m = metrics();
  EXPECT_EQ(metric_value(m, "vllm:num_requests_running"), 0);
  std::cout << "load: " << ok.load() << " requests ok, " << failed.load() << " failed; RSS "
            << baseline / 1024 << " MiB -> " << after / 1024 << " MiB\n";
  EXPECT_LE(after, baseline + baseline / 20 + 8 * 1024)
      << "RSS grew from " << baseline << " KiB to " << after << " KiB";
}

// Chat goes through the model's own template, tokenized without special tokens: the same prompt
// ids, tokens and routes as `switchyard generate --chat`.
TEST_F(ServeE2E, ChatEqualsGenerate) {
  json messages = {{{"role", "system"}, {"content", "You are terse."}},
                   {{"role", "user"}, {"content", "Name a colour. ünïcödé ✓"}}};
  HttpResponse r = post_json(port(), "/v1/chat/completions",
                             {{"model", "tiny"},
                              {"messages", messages},
                              {"max_tokens", 6},
                              {"temperature", 0},
                              {"ignore_eos", true},
                              {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  std::string routes_path = std::string(SY_BINARY_DIR) + "/serve_e2e_chat_routes.npy";
  CommandResult g =
      run_command(shell_quote(switchyard_binary()) + " generate --model " + shell_quote(model_) +
                  " --chat " + shell_quote(messages.dump()) +
                  " --max-tokens 6 --temperature 0 --ignore-eos --json --routes-out " +
                  shell_quote(routes_path) + " 2>/dev/null");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  json generated = json::parse(g.output.substr(g.output.find('{')), nullptr, false);
  ASSERT_TRUE(generated.is_object()) << g.output;
  EXPECT_EQ(body["prompt_token_ids"], generated["prompt_token_ids"]);
  EXPECT_EQ(body["choices"][0]["token_ids"], generated["completion_token_ids"]);
  EXPECT_EQ(body["choices"][0]["message"]["content"], generated["text"]);
  Result<NpyArray> file = npy_read_file(routes_path);
  ASSERT_TRUE(file) << file.message();
  EXPECT_TRUE(routes_of(body["choices"][0]) == *npy_to_int64(*file));
  std::filesystem::remove(routes_path);
}

// Tools reach the template in the client's key order (Qwen3 renders them with tojson, and
// transformers keeps Python's dict order): "type" before "function", as sent.
TEST_F(ServeE2E, ChatToolsKeepTheClientsKeyOrder) {
  const std::string request_text =
      R"({"model": "tiny", "max_tokens": 1, "temperature": 0, "return_token_ids": true,)"
      R"( "messages": [{"role": "user", "content": "Weather?"}],)"
      R"( "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})";
  // Sent as written (a json object here would be re-serialised with sorted keys).
  HttpResponse r = http_call(port(), "POST", "/v1/chat/completions", request_text);
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.json();
  HttpResponse text = post_json(port(), "/detokenize", {{"model", "tiny"}, {"tokens", body["prompt_token_ids"]}});
  ASSERT_EQ(text.status, 200) << text.body;
  const std::string prompt = text.json()["prompt"].get<std::string>();
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_weather")"), std::string::npos) << prompt;
  // generate --chat with the same JSON text renders the same prompt.
  CommandResult g = run_command(shell_quote(switchyard_binary()) + " generate --model " + shell_quote(model_) +
                                " --chat " + shell_quote(request_text) +
                                " --max-tokens 1 --temperature 0 --json 2>/dev/null");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  json generated = json::parse(g.output.substr(g.output.find('{')), nullptr, false);
  EXPECT_EQ(body["prompt_token_ids"], generated["prompt_token_ids"]);
}

// Cached prefix blocks evicted by later requests (a 256-token KV cache): a repeat still gets the
// tokens and routes it got the first time, whatever part of its prefix survived.
TEST_F(ServeE2E, PartialEvictionKeepsRoutesExact) {
  ServeProcess small;
  std::string error =
      small.start({"--model", model_, "--served-model-name", "tiny",
                   "--enable-return-routed-experts", "--return-routed-experts-default",
                   "--kv-cache-tokens", "256", "--max-num-batched-tokens", "64"});
  ASSERT_TRUE(error.empty()) << error;
  auto run = [&](const std::vector<int>& prompt) {
    return outcome_of(post_json(small.port(), "/v1/completions", greedy_request(prompt, 4)).json());
  };
  std::vector<int> a = token_prompt(100, 31), b = token_prompt(200, 32);
  Outcome first = run(a);
  Outcome hit = run(a);
  EXPECT_GT(hit.cached_tokens, 0);
  // d shares a's first 40 tokens: their blocks become the most recently used, so b (which
  // needs most of the cache) evicts a's later blocks and a's repeat is a partial hit.
  std::vector<int> d(a.begin(), a.begin() + 40);
  for (int t : token_prompt(10, 34)) d.push_back(t);
  EXPECT_GE(run(d).cached_tokens, 32);
  run(b);
  Outcome again = run(a);
  std::cout << "cached tokens: full hit " << hit.cached_tokens << ", after eviction "
            << again.cached_tokens << "\n";
  EXPECT_LT(again.cached_tokens, hit.cached_tokens) << "the test must evict some of a's blocks";
  EXPECT_GT(again.cached_tokens, 0) << "and keep some";
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_TRUE(again.routes == first.routes);
  EXPECT_TRUE(hit.routes == first.routes);
  EXPECT_EQ(small.terminate(), 0) << small.output();
}

}  // namespace
}  // namespace sy::server
