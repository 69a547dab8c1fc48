// Routes for RL trainers over HTTP (fake engine): per-request opt-in and the server default,
// streamed route pieces on every endpoint that reassemble to the non-streamed answer (with
// routed_experts_start, routed_experts_layers and gating weights), the 400s, and /metrics'
// route counters and expert load.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <random>

#include "../test_seed.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server_fixture.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;

ServerConfig capture_on(bool by_default) {
  ServerConfig config;
  config.enable_return_routed_experts = true;
  config.return_routed_experts_default = by_default;
  return config;
}

NpyArray npy_of(const json& b64) {
  Result<std::string> bytes = base64_decode(b64.get<std::string>());
  EXPECT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(bytes ? *bytes : std::string());
  EXPECT_TRUE(array) << array.message();
  return array ? *array : NpyArray{};
}

TEST(RoutesOptIn, OffByDefaultOnWhenAskedOrWhenTheServerDefaultSaysSo) {
  for (bool by_default : {false, true}) {
    Fixture f(capture_on(by_default));
    json base = {{"prompt", "hey"}, {"max_tokens", 3}};
    json plain = post_json(f.port, "/v1/completions", base).json();
    EXPECT_EQ(plain["choices"][0].contains("routed_experts"), by_default) << plain;
    json asked = base;
    asked["return_routed_experts"] = true;
    EXPECT_TRUE(post_json(f.port, "/v1/completions", asked)
                    .json()["choices"][0]
                    .contains("routed_experts"));
    json declined = base;
    declined["return_routed_experts"] = false;
    EXPECT_FALSE(post_json(f.port, "/v1/completions", declined)
                     .json()["choices"][0]
                     .contains("routed_experts"));
    // Chat and /generate follow the same rule.
    json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
    EXPECT_EQ(post_json(f.port, "/v1/chat/completions", chat)
                  .json()["choices"][0]
                  .contains("routed_experts"),
              by_default);
    chat["return_routed_experts"] = true;
    EXPECT_TRUE(post_json(f.port, "/v1/chat/completions", chat)
                    .json()["choices"][0]
                    .contains("routed_experts"));
    json generate = {{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 2}}}};
    EXPECT_EQ(
        post_json(f.port, "/generate", generate).json()["meta_info"].contains("routed_experts"),
        by_default);
    generate["return_routed_experts"] = true;
    EXPECT_TRUE(
        post_json(f.port, "/generate", generate).json()["meta_info"].contains("routed_experts"));
  }
}

// The rows of one choice from its streamed chunks: the pieces' arrays joined in order, checking
// that each starts where the previous ended.
struct Joined {
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the arrays' data, concatenated
  int chunks_with_rows = 0;
};
void join_piece(Joined& joined, const json& npy_b64, int64_t first_row, int64_t start) {
  NpyArray array = npy_of(npy_b64);
  ASSERT_EQ(array.shape.size(), 3u);
  const int64_t rows_so_far = joined.shape.empty() ? 0 : joined.shape[0];
  EXPECT_EQ(first_row, start + rows_so_far) << "pieces are contiguous";
  if (joined.shape.empty()) {
    joined.shape = array.shape;
  } else {
    EXPECT_EQ(array.shape[1], joined.shape[1]);
    joined.shape[0] += array.shape[0];
  }
  joined.chunks_with_rows += array.shape[0] > 0;
  joined.bytes.insert(joined.bytes.end(), array.data.begin(), array.data.end());
}

struct Variant {
  const char* path;
  json body;
};

TEST(RoutesStream, PiecesReassembleToTheNonStreamedAnswerOnEveryEndpoint) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  Fixture f(capture_on(false));
  std::string prompt;
  for (int i = 0; i < 5 + static_cast<int>(rng() % 6); ++i)
    prompt += static_cast<char>('a' + rng() % 26);
  const int64_t start = static_cast<int64_t>(rng() % 4);
  for (bool weights : {false, true}) {
    for (bool moe_only : {false, true}) {
      json routes = {{"return_routed_experts", true},
                     {"routed_experts_start", start},
                     {"routed_experts_layers", moe_only ? "moe" : "all"}};
      if (weights) routes["return_routed_experts_weights"] = true;
      std::vector<Variant> variants = {
          {"/v1/completions", {{"prompt", prompt}, {"max_tokens", 7}, {"n", 2}, {"seed", 5}}},
          {"/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 6}}},
          {"/generate", {{"text", prompt}, {"sampling_params", {{"max_new_tokens", 5}}}}}};
      for (Variant& v : variants) {
        SCOPED_TRACE(std::string(v.path) + (weights ? " weights" : "") + (moe_only ? " moe" : ""));
        v.body.update(routes);
        const bool generate = std::string(v.path) == "/generate";
        HttpResponse plain = post_json(f.port, v.path, v.body);
        ASSERT_EQ(plain.status, 200) << plain.body;
        json answer = plain.json();
        v.body["stream"] = true;
        v.body["stream_routed_experts"] = true;
        HttpResponse streamed = post_json(f.port, v.path, v.body);
        ASSERT_EQ(streamed.status, 200) << streamed.body;
        std::map<int, Joined> ids, gates;
        for (const std::string& event : streamed.events()) {
          if (event == "[DONE]") continue;
          json chunk = json::parse(event);
          const json& holder = generate ? chunk["meta_info"] : chunk["choices"][0];
          const int index =
              generate ? chunk.value("index", 0) : chunk["choices"][0]["index"].get<int>();
          if (!holder.contains("routed_experts")) continue;
          ASSERT_TRUE(holder.contains("routed_experts_first_row"));
          const int64_t first_row = holder["routed_experts_first_row"];
          if (generate) {
            // SGLang's flat int32: make it a (rows, L, K) .npy to join the same way.
            Result<std::string> raw = base64_decode(holder["routed_experts"].get<std::string>());
            ASSERT_TRUE(raw);
            Joined& joined = ids[index];
            EXPECT_EQ(first_row,
                      start + static_cast<int64_t>(joined.bytes.size() / 4 / (moe_only ? 6 : 8)));
            joined.bytes.insert(joined.bytes.end(), raw->begin(), raw->end());
            joined.chunks_with_rows += !raw->empty();
          } else {
            join_piece(ids[index], holder["routed_experts"], first_row, start);
          }
          if (weights)
            join_piece(gates[index], holder["routed_experts_weights"], first_row, start);
          else
            EXPECT_FALSE(holder.contains("routed_experts_weights"));
        }
        const json whole_choices = generate ? json::array({answer}) : answer["choices"];
        ASSERT_EQ(ids.size(), whole_choices.size());
        for (size_t i = 0; i < whole_choices.size(); ++i) {
          const json& whole = generate ? whole_choices[i]["meta_info"] : whole_choices[i];
          EXPECT_GE(ids[static_cast<int>(i)].chunks_with_rows, 2) << "rows arrive as tokens stream";
          if (generate) {
            Result<std::string> raw = base64_decode(whole["routed_experts"].get<std::string>());
            ASSERT_TRUE(raw);
            EXPECT_EQ(std::string(ids[0].bytes.begin(), ids[0].bytes.end()), *raw);
          } else {
            NpyArray expected = npy_of(whole["routed_experts"]);
            EXPECT_EQ(ids[static_cast<int>(i)].shape, expected.shape);
            EXPECT_EQ(ids[static_cast<int>(i)].bytes, expected.data);
          }
          if (weights) {
            NpyArray expected = npy_of(whole["routed_experts_weights"]);
            EXPECT_EQ(expected.dtype, DType::kF16);
            EXPECT_EQ(gates[static_cast<int>(i)].shape, expected.shape);
            EXPECT_EQ(gates[static_cast<int>(i)].bytes, expected.data);
          }
        }
      }
    }
  }
}

TEST(RoutesWeights, AreFloat16OfTheEnginesWeightsInTheRoutesLayout) {
  Fixture f(capture_on(false));
  json body = post_json(f.port, "/v1/completions",
                        {{"prompt", "abcd"},
                         {"max_tokens", 3},
                         {"return_routed_experts_weights", true},
                         {"routed_experts_layers", "moe"},
                         {"routed_experts_start", 1}})
                  .json();
  ASSERT_TRUE(body["choices"][0].contains("routed_experts")) << "weights imply routes";
  NpyArray ids = npy_of(body["choices"][0]["routed_experts"]);
  NpyArray weights = npy_of(body["choices"][0]["routed_experts_weights"]);
  ASSERT_EQ(weights.dtype, DType::kF16);
  ASSERT_EQ(weights.shape, ids.shape);
  ASSERT_EQ(weights.shape, (std::vector<int64_t>{6, 3, 2}));  // BOS + 4 + 3 tokens - 1 - start 1
  const auto* half = reinterpret_cast<const uint16_t*>(weights.data.data());
  const std::vector<int> moe_layers = {1, 2, 3};
  for (int64_t row = 0; row < 6; ++row)
    for (int m = 0; m < 3; ++m)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(f16_to_f32(half[(row * 3 + m) * 2 + k]), fake_weight(row + 1, moe_layers[m], k))
            << row << " " << m << " " << k;
}

TEST(RoutesErrors, AreOpenAi400sNamingTheParameterAndWhy) {
  struct Expect {
    ServerConfig config;
    FakeEngineOptions engine;
    json body;
    std::string param, message_part;
  };
  FakeEngineOptions no_weights;
  no_weights.route_weights = false;
  const std::vector<Expect> cases = {
      {capture_on(false),
       {},
       {{"stream_routed_experts", true}},
       "stream_routed_experts",
       "stream: true"},
      {capture_on(false),
       {},
       {{"stream_routed_experts", "yes"}},
       "stream_routed_experts",
       "boolean"},
      {capture_on(false),
       {},
       {{"return_routed_experts_weights", 1}},
       "return_routed_experts_weights",
       "boolean"},
      {capture_on(false),
       {},
       {{"return_routed_experts", false}, {"return_routed_experts_weights", true}},
       "return_routed_experts_weights",
       "return_routed_experts: false"},
      {capture_on(false),
       no_weights,
       {{"return_routed_experts_weights", true}},
       "return_routed_experts_weights",
       "does not write gating weights"},
      {ServerConfig{},
       {},
       {{"stream", true}, {"stream_routed_experts", true}},
       "stream_routed_experts",
       "--enable-return-routed-experts"},
      {ServerConfig{},
       {},
       {{"return_routed_experts_weights", true}},
       "return_routed_experts_weights",
       "--enable-return-routed-experts"},
  };
  for (const Expect& c : cases) {
    Fixture f(c.config, c.engine);
    for (const char* path : {"/v1/completions", "/generate"}) {
      json body = c.body;
      if (std::string(path) == "/generate")
        body["text"] = "hi";
      else
        body["prompt"] = "hi";
      HttpResponse r = post_json(f.port, path, body);
      SCOPED_TRACE(std::string(path) + " " + body.dump());
      ASSERT_EQ(r.status, 400) << r.body;
      json error = r.json()["error"];
      EXPECT_EQ(error["param"], c.param);
      EXPECT_EQ(error["code"], 400);
      EXPECT_NE(error["message"].get<std::string>().find(c.message_part), std::string::npos)
          << error;
    }
    EXPECT_TRUE(f.healthy());
  }
  // The model card says whether weights can come back.
  Fixture with(capture_on(false)), without(capture_on(false), no_weights);
  EXPECT_EQ(http_call(with.port, "GET", "/v1/models").json()["data"][0]["routed_experts_weights"],
            true);
  EXPECT_EQ(
      http_call(without.port, "GET", "/v1/models").json()["data"][0]["routed_experts_weights"],
      false);
}

// The value of the sample `name{...labels...}` (labels given as the exact text inside braces).
double sample(const std::string& text, const std::string& name_and_labels) {
  size_t at = text.find("\n" + name_and_labels + " ");
  if (at == std::string::npos) return -1;
  at += name_and_labels.size() + 2;
  return std::stod(text.substr(at, text.find('\n', at) - at));
}

TEST(RoutesMetrics, CountersExpertLoadAndImbalanceArePrometheusText) {
  engine::EngineMetrics e;
  e.routes_captured_total = 41;
  e.routes_replayed_total = 7;
  e.routes_poisoned_total = 3;
  e.steps_total = 12;
  e.step_seconds_total = 2.5;
  e.route_host_seconds_total = 0.125;
  e.moe_layers = {1, 3};
  e.num_experts = 4;
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 8; ++i) e.expert_load_tokens.push_back(static_cast<int64_t>(rng() % 1000));
  e.expert_load_tokens[4] = e.expert_load_tokens[5] = e.expert_load_tokens[6] =
      e.expert_load_tokens[7] = 0;
  ServerMetrics metrics;
  const std::string text = metrics.render("m", e);
  const std::string l = "model_name=\"m\"";
  EXPECT_EQ(sample(text, "switchyard:routes_captured_total{" + l + "}"), 41);
  EXPECT_EQ(sample(text, "switchyard:routes_replayed_total{" + l + "}"), 7);
  EXPECT_EQ(sample(text, "switchyard:routes_poisoned_total{" + l + "}"), 3);
  EXPECT_EQ(sample(text, "switchyard:engine_steps_total{" + l + "}"), 12);
  EXPECT_EQ(sample(text, "switchyard:engine_step_seconds_total{" + l + "}"), 2.5);
  EXPECT_EQ(sample(text, "switchyard:route_host_seconds_total{" + l + "}"), 0.125);
  EXPECT_NE(text.find("# TYPE switchyard:expert_load_tokens_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE switchyard:expert_load_imbalance gauge"), std::string::npos);
  for (int m = 0; m < 2; ++m)
    for (int x = 0; x < 4; ++x)
      EXPECT_EQ(
          sample(text,
                 fmt::format("switchyard:expert_load_tokens_total{{{},layer=\"{}\",expert=\"{}\"}}",
                             l, e.moe_layers[m], x)),
          e.expert_load_tokens[m * 4 + x]);
  double max_load = 0, sum = 0;
  for (int x = 0; x < 4; ++x) {
    max_load = std::max<double>(max_load, e.expert_load_tokens[x]);
    sum += e.expert_load_tokens[x];
  }
  EXPECT_NEAR(sample(text, "switchyard:expert_load_imbalance{" + l + ",layer=\"1\"}"),
              sum > 0 ? max_load / (sum / 4) : 0, 1e-4);
  EXPECT_EQ(sample(text, "switchyard:expert_load_imbalance{" + l + ",layer=\"3\"}"), 0)
      << "no tokens yet";
  // Capture off: no expert load family at all.
  EXPECT_EQ(metrics.render("m", engine::EngineMetrics{}).find("expert_load"), std::string::npos);
}

}  // namespace
}  // namespace sy::server
