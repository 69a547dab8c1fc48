// The routing inspector's server side (fake engine): the embedded page and its content types,
// paths that try to leave it, the API key on its data endpoints only, the expert-load JSON, and
// the bounded store of recent requests' routes (what it keeps, for how long, its 404s).
// The page itself is tested in headless Chromium by tests/ui/inspector_test.mjs.
#include <gtest/gtest.h>

#include "server/route_store.h"
#include "server/ui.h"
#include "server_fixture.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;

ServerConfig ui_on(bool capture = true, int64_t store_requests = 64) {
  ServerConfig config;
  config.ui = true;
  config.enable_return_routed_experts = capture;
  config.ui_route_store_requests = store_requests;
  return config;
}

void expect_openai_404(const HttpResponse& response, const std::string& mentions) {
  EXPECT_EQ(response.status, 404) << response.body;
  json body = response.json();
  ASSERT_TRUE(body.contains("error")) << response.body;
  EXPECT_EQ(body["error"]["code"], 404);
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_NE(body["error"]["message"].get<std::string>().find(mentions), std::string::npos) << body;
}

TEST(UiPage, IsOffByDefault) {
  Fixture f;
  EXPECT_EQ(http_call(f.port, "GET", "/ui/").status, 404);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/expert_load").status, 404);
}

TEST(UiPage, ServesTheEmbeddedFilesWithTheirContentTypes) {
  Fixture f(ui_on());
  HttpResponse index = http_call(f.port, "GET", "/ui/");
  ASSERT_EQ(index.status, 200);
  EXPECT_EQ(index.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_NE(index.body.find("Switchyard routing inspector"), std::string::npos);
  EXPECT_EQ(index.headers["x-content-type-options"], "nosniff");
  EXPECT_NE(index.headers["content-security-policy"].find("default-src 'self'"), std::string::npos);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/index.html").body, index.body);

  HttpResponse bare = http_call(f.port, "GET", "/ui");
  EXPECT_EQ(bare.status, 308);
  EXPECT_EQ(bare.headers["location"], "/ui/");

  // Every embedded file is served byte for byte, JavaScript and CSS under their own types.
  int scripts = 0, styles = 0;
  for (const UiAsset& asset : ui_assets()) {
    HttpResponse file = http_call(f.port, "GET", "/ui/" + std::string(asset.path));
    ASSERT_EQ(file.status, 200) << asset.path;
    EXPECT_EQ(file.body, std::string(reinterpret_cast<const char*>(asset.data), asset.size));
    if (asset.path.ends_with(".js")) {
      ++scripts;
      EXPECT_EQ(file.headers["content-type"], "text/javascript; charset=utf-8");
    }
    if (asset.path.ends_with(".css")) {
      ++styles;
      EXPECT_EQ(file.headers["content-type"], "text/css; charset=utf-8");
    }
  }
  EXPECT_GE(scripts, 1);
  EXPECT_GE(styles, 1);
  EXPECT_EQ(http_call(f.port, "POST", "/ui/", "{}").status, 405);
  EXPECT_TRUE(f.healthy());
}

TEST(UiPage, NoPathLeavesTheEmbeddedFiles) {
  Fixture f(ui_on());
  for (const char* path :
       {"/ui/../CMakeLists.txt", "/ui/..%2fCMakeLists.txt", "/ui/%2e%2e/%2e%2e/etc/passwd",
        "/ui//etc/passwd", "/ui/assets/../index.html", "/ui/assets/", "/ui/./index.html",
        "/ui/index.html%00", "/ui/INDEX.HTML", "/ui/api", "/ui/api/", "/ui/api/nothing"}) {
    HttpResponse response = http_call(f.port, "GET", path);
    EXPECT_EQ(response.status, 404) << path << ": " << response.body.substr(0, 200);
  }
  EXPECT_FALSE(find_ui_file("/ui/../../etc/passwd"));
  EXPECT_FALSE(find_ui_file("/etc/passwd"));
  EXPECT_TRUE(find_ui_file("/ui/"));
  EXPECT_TRUE(f.healthy());
}

TEST(UiPage, TheApiKeyGuardsTheDataNotThePage) {
  ServerConfig config = ui_on();
  config.api_key = "sesame";
  Fixture f(config);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/").status, 200);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/expert_load").status, 401);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/cmpl-x").status, 401);
  EXPECT_EQ(
      http_call(f.port, "GET", "/ui/api/expert_load", "", "Authorization: Bearer nope\r\n").status,
      401);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/expert_load", "", "Authorization: Bearer sesame\r\n")
                .status,
            200);
  // Without --ui the same paths are ordinary unknown routes, behind the key like any.
  ServerConfig off;
  off.api_key = "sesame";
  Fixture g(off);
  EXPECT_EQ(http_call(g.port, "GET", "/ui/").status, 401);
}

TEST(UiPage, ExpertLoadDescribesTheModelAndTheStore) {
  Fixture f(ui_on(true, 3));
  json load = http_call(f.port, "GET", "/ui/api/expert_load").json();
  EXPECT_EQ(load["moe_layers"], json({1, 2, 3}));
  EXPECT_EQ(load["num_experts"], 16);
  EXPECT_EQ(load["top_k"], 2);
  EXPECT_EQ(load["num_hidden_layers"], 4);
  EXPECT_EQ(load["capture"], true);
  EXPECT_EQ(load["route_store"]["max_requests"], 3);
  EXPECT_EQ(load["route_store"]["ids"], json::array());

  // The counters, as the engine keeps them (layer-major), one list per MoE layer.
  engine::ModelInfo model;
  model.moe_layers = {1, 3};
  model.num_experts = 3;
  engine::EngineMetrics metrics;
  metrics.moe_layers = {1, 3};
  metrics.num_experts = 3;
  metrics.expert_load_tokens = {1, 2, 3, 4, 5, 6};
  json counts = expert_load_json(ui_on(), model, metrics, nullptr);
  EXPECT_EQ(counts["expert_load_tokens"], json({{1, 2, 3}, {4, 5, 6}}));
  EXPECT_TRUE(counts["route_store"].is_null());
}

// The rows the fake engine routes for `tokens` (fake_route), all 4 layers, dense layer 0 zero.
std::vector<uint8_t> fake_routes(const std::vector<int32_t>& tokens) {
  std::vector<uint8_t> out;
  for (size_t row = 0; row + 1 < tokens.size(); ++row) {
    for (int layer = 0; layer < 4; ++layer) {
      int32_t ids[2] = {0, 0};
      if (layer > 0) fake_route(tokens[row], static_cast<int64_t>(row), layer, ids);
      out.push_back(static_cast<uint8_t>(ids[0]));
      out.push_back(static_cast<uint8_t>(ids[1]));
    }
  }
  return out;
}

NpyArray decode_npy(const json& b64) {
  Result<std::string> bytes = base64_decode(b64.get<std::string>());
  EXPECT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(bytes ? *bytes : std::string());
  EXPECT_TRUE(array) << array.message();
  return array ? *array : NpyArray{};
}

TEST(UiRouteStore, KeepsEveryRequestsRoutesAskedForOrNot) {
  Fixture f(ui_on());
  // Not asked: the response has no routes, the store has them all (every row, every layer).
  HttpResponse plain =
      post_json(f.port, "/v1/completions", {{"prompt", "route me"}, {"max_tokens", 4}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_FALSE(plain.json()["choices"][0].contains("routed_experts"));
  const std::string id = plain.json()["id"];
  HttpResponse stored = http_call(f.port, "GET", "/ui/api/routes/" + id);
  ASSERT_EQ(stored.status, 200) << stored.body;
  json body = stored.json();
  EXPECT_EQ(body["id"], id);
  ASSERT_EQ(body["choices"].size(), 1u);
  const json& choice = body["choices"][0];
  std::vector<int32_t> tokens = choice["token_ids"].get<std::vector<int32_t>>();
  const int64_t prompt_tokens = plain.json()["usage"]["prompt_tokens"];
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), prompt_tokens + 4) << "prompt + generated";
  const int64_t rows = prompt_tokens + 3;
  EXPECT_EQ(choice["rows"], rows);
  NpyArray routes = decode_npy(choice["routed_experts"]);
  EXPECT_EQ(routes.shape, (std::vector<int64_t>{rows, 4, 2}));
  EXPECT_EQ(std::vector<uint8_t>(routes.data.begin(), routes.data.end()), fake_routes(tokens));
  ASSERT_EQ(choice["tokens"].size(), tokens.size());
  EXPECT_EQ(choice["tokens"][prompt_tokens - 1], "e");  // the fake codec: a byte per token

  // Asked with a start offset and MoE layers only: the response follows the request, the store
  // still keeps the whole array, equal to what a plain `return_routed_experts` returns.
  json asked = {{"prompt", "route me"},
                {"max_tokens", 4},
                {"return_routed_experts", true},
                {"routed_experts_start", 3},
                {"routed_experts_layers", "moe"}};
  json answer = post_json(f.port, "/v1/completions", asked).json();
  EXPECT_EQ(decode_npy(answer["choices"][0]["routed_experts"]).shape,
            (std::vector<int64_t>{rows - 3, 3, 2}));
  json again = http_call(f.port, "GET", "/ui/api/routes/" + answer["id"].get<std::string>()).json();
  EXPECT_EQ(again["choices"][0]["routed_experts"], choice["routed_experts"]);
  json whole = {{"prompt", "route me"}, {"max_tokens", 4}, {"return_routed_experts", true}};
  EXPECT_EQ(post_json(f.port, "/v1/completions", whole).json()["choices"][0]["routed_experts"],
            choice["routed_experts"]);
}

TEST(UiRouteStore, StreamedPiecesAndEveryChoiceAreKept) {
  Fixture f(ui_on());
  json streamed = {{"prompt", "abcdef"},
                   {"max_tokens", 5},
                   {"stream", true},
                   {"n", 2},
                   {"temperature", 1.0},
                   {"seed", 7},
                   {"return_routed_experts", true},
                   {"stream_routed_experts", true}};
  HttpResponse response = post_json(f.port, "/v1/completions", streamed);
  ASSERT_EQ(response.status, 200);
  std::vector<std::string> events = response.events();
  ASSERT_GE(events.size(), 2u);
  const std::string id = json::parse(events[0])["id"];
  json stored = http_call(f.port, "GET", "/ui/api/routes/" + id).json();
  ASSERT_EQ(stored["choices"].size(), 2u) << stored;
  for (const json& choice : stored["choices"]) {
    std::vector<int32_t> tokens = choice["token_ids"].get<std::vector<int32_t>>();
    ASSERT_GE(tokens.size(), 6u + 5u);
    NpyArray routes = decode_npy(choice["routed_experts"]);
    EXPECT_EQ(routes.shape, (std::vector<int64_t>{static_cast<int64_t>(tokens.size()) - 1, 4, 2}));
    EXPECT_EQ(std::vector<uint8_t>(routes.data.begin(), routes.data.end()), fake_routes(tokens));
  }
  // Chat ids and /generate rids are keys too.
  json chat = post_json(f.port, "/v1/chat/completions",
                        {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}})
                  .json();
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/" + chat["id"].get<std::string>()).status,
            200);
  post_json(f.port, "/generate",
            {{"text", "hi"}, {"rid", "my run/7"}, {"sampling_params", {{"max_new_tokens", 2}}}});
  for (const char* path : {"/ui/api/routes/my%20run%2F7", "/ui/api/routes/my%20run%2f7"}) {
    json by_rid = http_call(f.port, "GET", path).json();
    EXPECT_EQ(by_rid["id"], "my run/7") << by_rid;
  }
}

TEST(UiRouteStore, ForgetsTheOldestAndAnswersOpenAi404s) {
  Fixture f(ui_on(true, 2));
  std::vector<std::string> ids;
  for (const char* prompt : {"one", "two", "three"}) {
    ids.push_back(
        post_json(f.port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}}).json()["id"]);
  }
  expect_openai_404(http_call(f.port, "GET", "/ui/api/routes/" + ids[0]), "last 2 finished");
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/" + ids[1]).status, 200);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/" + ids[2]).status, 200);
  json load = http_call(f.port, "GET", "/ui/api/expert_load").json();
  EXPECT_EQ(load["route_store"]["ids"], json({ids[2], ids[1]})) << "newest first";

  expect_openai_404(http_call(f.port, "GET", "/ui/api/routes/"), "no routes stored");
  expect_openai_404(http_call(f.port, "GET", "/ui/api/routes/" + std::string(5000, 'x')),
                    "no routes stored");
  HttpResponse malformed = http_call(f.port, "GET", "/ui/api/routes/%zz");
  EXPECT_EQ(malformed.status, 400);
  EXPECT_EQ(malformed.json()["error"]["param"], "id");
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/a%00b").status, 400);
  EXPECT_EQ(http_call(f.port, "GET", "/ui/api/routes/abc%4").status, 400);
  EXPECT_TRUE(f.healthy());
}

TEST(UiRouteStore, IsOffWithoutCapture) {
  Fixture f(ui_on(false));
  post_json(f.port, "/v1/completions", {{"prompt", "one"}, {"max_tokens", 1}});
  expect_openai_404(http_call(f.port, "GET", "/ui/api/routes/cmpl-x"), "route store is off");
  json load = http_call(f.port, "GET", "/ui/api/expert_load").json();
  EXPECT_EQ(load["capture"], false);
  EXPECT_EQ(load["expert_load_tokens"], json::array());
  EXPECT_TRUE(load["route_store"].is_null());
}

TEST(UiRouteStore, EvictsByBytesAndRefusesWhatCannotFit) {
  auto entry = [](std::string id, size_t payload) {
    StoredRoutes r;
    r.id = std::move(id);
    r.choices.push_back(StoredChoice{1, std::string(payload, 'A'), {}});
    return r;
  };
  RouteStore store(10, 1000);
  store.put(entry("a", 400));
  store.put(entry("b", 400));
  store.put(entry("c", 400));  // 1203 bytes with a and b: a goes
  EXPECT_EQ(store.ids(), (std::vector<std::string>{"c", "b"}));
  store.put(entry("huge", 2000));  // larger than the whole budget: not kept, nothing evicted
  EXPECT_EQ(store.ids(), (std::vector<std::string>{"c", "b"}));
  store.put(entry("b", 10));  // same id: replaced, and now newest
  EXPECT_EQ(store.ids(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(store.get("b")->choices[0].routed_experts.size(), 10u);
  EXPECT_FALSE(store.get("a"));
  RouteStore none(0, 1000);
  none.put(entry("a", 1));
  EXPECT_FALSE(none.get("a"));
}

TEST(UiPercentDecode, DecodesEscapesAndRejectsBrokenOnes) {
  EXPECT_EQ(percent_decode("a%20b%2Fc%2f"), "a b/c/");
  EXPECT_EQ(percent_decode("plain-id_1"), "plain-id_1");
  EXPECT_FALSE(percent_decode("%"));
  EXPECT_FALSE(percent_decode("%4"));
  EXPECT_FALSE(percent_decode("%g0"));
  EXPECT_FALSE(percent_decode("%00"));
}

}  // namespace
}  // namespace sy::server
