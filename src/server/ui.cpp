#include "server/ui.h"

#include <algorithm>

namespace sy::server {

namespace {

std::string_view content_type_of(std::string_view path) {
  struct Type {
    std::string_view extension;
    std::string_view content_type;
  };
  static constexpr Type kTypes[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"},
      {".json", "application/json"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".txt", "text/plain; charset=utf-8"},
  };
  for (const Type& type : kTypes) {
    if (path.ends_with(type.extension)) return type.content_type;
  }
  return "application/octet-stream";
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<UiFile> find_ui_file(std::string_view path) {
  constexpr std::string_view kPrefix = "/ui/";
  if (!path.starts_with(kPrefix)) return std::nullopt;
  std::string_view name = path.substr(kPrefix.size());
  if (name.empty()) name = "index.html";
  for (const UiAsset& asset : ui_assets()) {
    if (asset.path == name) {
      return UiFile{content_type_of(name),
                    std::string_view(reinterpret_cast<const char*>(asset.data), asset.size)};
    }
  }
  return std::nullopt;
}

std::optional<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    const int high = hex_value(text[i + 1]), low = hex_value(text[i + 2]);
    if (high < 0 || low < 0 || (high == 0 && low == 0)) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

json expert_load_json(const ServerConfig& config, const engine::ModelInfo& model,
                      const engine::EngineMetrics& metrics, const RouteStore* store) {
  json load = json::array();
  const size_t experts = static_cast<size_t>(std::max<int64_t>(0, metrics.num_experts));
  // Empty while capture is off: the engine counts expert load only from captured routes.
  if (experts > 0 && metrics.expert_load_tokens.size() == metrics.moe_layers.size() * experts) {
    for (size_t m = 0; m < metrics.moe_layers.size(); ++m) {
      load.push_back(std::vector<int64_t>(metrics.expert_load_tokens.begin() + m * experts,
                                          metrics.expert_load_tokens.begin() + (m + 1) * experts));
    }
  }
  json out = {
      {"model", config.served_model_name},
      {"architecture", model.architecture},
      {"capture", config.enable_return_routed_experts},
      {"num_hidden_layers", model.num_hidden_layers},
      {"moe_layers", model.moe_layers},
      {"num_experts", model.num_experts},
      {"top_k", model.top_k},
      {"expert_load_tokens", std::move(load)},
      {"routes_captured_total", metrics.routes_captured_total},
      {"routes_replayed_total", metrics.routes_replayed_total},
      {"routes_poisoned_total", metrics.routes_poisoned_total},
      {"running_requests", metrics.running_requests},
      {"waiting_requests", metrics.waiting_requests},
  };
  json route_store = nullptr;
  if (store) {
    route_store = {{"max_requests", store->max_requests()}, {"ids", store->ids()}};
  }
  out["route_store"] = std::move(route_store);
  return out;
}

json stored_routes_json(const StoredRoutes& routes, const ServerConfig& config,
                        const engine::ModelInfo& model, const TextCodec& codec) {
  json choices = json::array();
  for (size_t i = 0; i < routes.choices.size(); ++i) {
    const StoredChoice& choice = routes.choices[i];
    json tokens = json::array();
    for (int32_t id : choice.token_ids) tokens.push_back(codec.decode({id}, false));
    choices.push_back({{"index", i},
                       {"rows", choice.rows},
                       {"routed_experts", choice.routed_experts},
                       {"token_ids", choice.token_ids},
                       {"tokens", std::move(tokens)}});
  }
  return {{"object", "routes"},
          {"id", routes.id},
          {"created", routes.created},
          {"model", config.served_model_name},
          {"num_hidden_layers", model.num_hidden_layers},
          {"moe_layers", model.moe_layers},
          {"num_experts", model.num_experts},
          {"top_k", model.top_k},
          {"choices", std::move(choices)}};
}

}  // namespace sy::server
