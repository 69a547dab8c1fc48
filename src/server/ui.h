// The routing inspector page (`serve --ui`): its static files, embedded in the binary at build
// time from ui/dist (ui/embed_assets.cmake), and the JSON its data endpoints answer.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "server/api.h"
#include "server/route_store.h"

namespace sy::server {

struct UiAsset {
  std::string_view path;  // relative to ui/dist, e.g. "index.html", "assets/index.js"
  const unsigned char* data;
  size_t size;
};
// Generated at build time (ui_assets.cpp in the build folder).
std::span<const UiAsset> ui_assets();

struct UiFile {
  std::string_view content_type;
  std::string_view body;
};
// The embedded file served at `path` ("/ui/" -> index.html, "/ui/assets/x.js"). Only exact names
// of embedded files match: nothing reads the filesystem, so no path can reach outside them.
std::optional<UiFile> find_ui_file(std::string_view path);

// "%41" -> "A"; nullopt for a malformed escape or an escaped NUL.
std::optional<std::string> percent_decode(std::string_view text);

// GET /ui/api/expert_load: the model's shape and the engine's per-layer expert load counters.
json expert_load_json(const ServerConfig& config, const engine::ModelInfo& model,
                      const engine::EngineMetrics& metrics, const RouteStore* store);
// GET /ui/api/routes/{id}: a stored request's routes (base64 .npy) and its tokens' text.
json stored_routes_json(const StoredRoutes& routes, const ServerConfig& config,
                        const engine::ModelInfo& model, const TextCodec& codec);

}  // namespace sy::server
