// `switchyard routes diff A B`: how far two route arrays agree (trainer vs engine routing, R3),
// per layer and overall: rows whose expert sets differ, rows whose order alone differs.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "moe/route_diff.h"

namespace sy::cli {
namespace {

struct RoutesDiffArgs {
  std::string a, b;
  std::string shape;
  bool json = false;
};

double fraction(int64_t part, int64_t whole) {
  return whole > 0 ? double(part) / double(whole) : 0.0;
}

int run_routes_diff(const RoutesDiffArgs& args) {
  std::optional<moe::RouteShape> shape;
  if (!args.shape.empty()) {
    Result<moe::RouteShape> parsed = moe::parse_route_shape(args.shape);
    if (!parsed) {
      std::fprintf(stderr, "switchyard routes diff: %s\n", parsed.message().c_str());
      return 1;
    }
    shape = *parsed;
  }
  Result<moe::RouteArray> a = moe::read_route_file(args.a, shape);
  Result<moe::RouteArray> b =
      a ? moe::read_route_file(args.b, shape) : Result<moe::RouteArray>(a.status());
  Result<moe::RouteDiff> diff = b ? moe::diff_routes(*a, *b) : Result<moe::RouteDiff>(b.status());
  if (!diff) {
    std::fprintf(stderr, "switchyard routes diff: %s\n", diff.message().c_str());
    return 1;
  }
  const moe::RouteDiff& d = *diff;
  if (args.json) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const moe::LayerAgreement& l : d.per_layer) {
      if (l.dense) {
        layers.push_back({{"layer", l.layer}, {"dense", true}});
        continue;
      }
      layers.push_back({{"layer", l.layer},
                        {"rows", l.rows},
                        {"set_differs", l.set_differs},
                        {"order_differs", l.order_differs},
                        {"set_differs_fraction", fraction(l.set_differs, l.rows)},
                        {"order_differs_fraction", fraction(l.order_differs, l.rows)}});
    }
    nlohmann::ordered_json out = {
        {"shape", {d.rows, d.layers, d.top_k}},
        {"compared", d.compared},
        {"set_differs", d.set_differs},
        {"order_differs", d.order_differs},
        {"set_differs_fraction", fraction(d.set_differs, d.compared)},
        {"order_differs_fraction", fraction(d.order_differs, d.compared)},
        {"rows_with_set_difference", d.rows_with_set_difference},
        {"rows_with_set_difference_fraction", fraction(d.rows_with_set_difference, d.rows)},
        {"layers", std::move(layers)}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("routes: %lld rows x %lld layers x top_k %lld\n", static_cast<long long>(d.rows),
              static_cast<long long>(d.layers), static_cast<long long>(d.top_k));
  std::printf("%-6s %8s %12s %14s\n", "layer", "rows", "set differs", "order differs");
  for (const moe::LayerAgreement& l : d.per_layer) {
    if (l.dense) {
      std::printf("%-6lld %8s\n", static_cast<long long>(l.layer), "dense");
      continue;
    }
    std::printf("%-6lld %8lld %11.4f%% %13.4f%%\n", static_cast<long long>(l.layer),
                static_cast<long long>(l.rows), 100 * fraction(l.set_differs, l.rows),
                100 * fraction(l.order_differs, l.rows));
  }
  std::printf("%-6s %8lld %11.4f%% %13.4f%%\n", "all", static_cast<long long>(d.compared),
              100 * fraction(d.set_differs, d.compared),
              100 * fraction(d.order_differs, d.compared));
  std::printf("token rows with any layer's set differing: %lld of %lld (%.4f%%)\n",
              static_cast<long long>(d.rows_with_set_difference), static_cast<long long>(d.rows),
              100 * fraction(d.rows_with_set_difference, d.rows));
  return 0;
}

}  // namespace

void add_routes_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("routes", "Tools for routed-expert arrays");
  command->require_subcommand(1);
  auto args = std::make_shared<RoutesDiffArgs>();
  auto* diff = command->add_subcommand(
      "diff",
      "Per-layer and overall fraction of rows whose expert sets differ, and whose order alone "
      "differs, between two route arrays (.npy, JSON list, or SGLang's flat int32, raw or base64)");
  diff->add_option("a", args->a, "first routes file")->required();
  diff->add_option("b", args->b, "second routes file")->required();
  diff->add_option("--shape", args->shape,
                   "N,L,K or L,K for flat inputs (SGLang's int32, a flat JSON list, a 1-D .npy)");
  diff->add_flag("--json", args->json, "print one JSON object");
  diff->callback([args, &exit_code] { exit_code = run_routes_diff(*args); });
}

}  // namespace sy::cli
