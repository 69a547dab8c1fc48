// Route payload size on the wire for Qwen3-30B-A3B's shapes (48 layers, all MoE, 128 experts,
// top-8), per token of a rollout: vLLM's base64 .npy ids, SGLang's base64 flat int32, float16
// gating weights, and the per-chunk cost of stream_routed_experts (one row per decode chunk, plus
// the prompt's rows in the first). Bytes are those of the JSON fields the server writes
// (add_route_fields), so they include base64's 4/3 and the .npy header. Also times the encoding.
//   route_payload_bench [--prompt 1024] [--completion 512] [--out FILE.json]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api.h"

namespace {

using sy::server::json;

struct Shape {
  int64_t layers = 48, top_k = 8, experts = 128;
};

sy::moe::RouteArray random_rows(std::mt19937_64& rng, const Shape& s, int64_t first, int64_t rows,
                                bool weights) {
  sy::moe::RouteArray r;
  r.first_row = first;
  r.rows = rows;
  r.layers = s.layers;
  r.top_k = s.top_k;
  r.ids.resize(static_cast<size_t>(rows * s.layers * s.top_k));
  for (auto& id : r.ids) id = static_cast<int32_t>(rng() % s.experts);
  if (weights) {
    r.weights.resize(r.ids.size());
    for (auto& w : r.weights) w = static_cast<float>(rng() % 1000) / 1000.0f;
  }
  return r;
}

// Bytes the route fields add to a JSON object (keys, quotes, separators included).
int64_t field_bytes(const sy::moe::RouteArray& r, const sy::server::RouteOptions& options,
                    const Shape& s, bool int32_ids, bool piece) {
  json with = json::object();
  sy::server::add_route_fields(r, options, s.experts, int32_ids, piece, with);
  return static_cast<int64_t>(with.dump().size()) - 2;  // less the braces
}

}  // namespace

int main(int argc, char** argv) {
  int64_t prompt = 1024, completion = 512;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--prompt"))
      prompt = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--completion"))
      completion = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out"))
      out_path = argv[i + 1];
  }
  const Shape shape;
  std::mt19937_64 rng(7);
  const int64_t rows = prompt + completion - 1, tokens = prompt + completion;
  sy::server::RouteOptions ids_only{true, 0, false, false, false};
  sy::server::RouteOptions with_weights{true, 0, false, false, true};
  sy::server::RouteOptions streamed{true, 0, false, true, false};
  sy::server::RouteOptions streamed_weights{true, 0, false, true, true};

  const sy::moe::RouteArray whole = random_rows(rng, shape, 0, rows, true);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t npy_ids = field_bytes(whole, ids_only, shape, false, false);
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t npy_ids_weights = field_bytes(whole, with_weights, shape, false, false);
  const auto t2 = std::chrono::steady_clock::now();
  const int64_t sglang_ids = field_bytes(whole, ids_only, shape, true, false);
  // Only the completion's rows (routed_experts_start = prompt: the trainer has the prompt's).
  const sy::moe::RouteArray tail = random_rows(rng, shape, prompt, completion - 1, false);
  const int64_t completion_only = field_bytes(tail, ids_only, shape, false, false);

  // Streamed: the first chunk carries the prompt's rows, each later chunk one row.
  int64_t stream_ids =
      field_bytes(random_rows(rng, shape, 0, prompt, true), streamed, shape, false, true);
  int64_t stream_weights =
      field_bytes(random_rows(rng, shape, 0, prompt, true), streamed_weights, shape, false, true);
  const int64_t one_row_ids =
      field_bytes(random_rows(rng, shape, prompt, 1, true), streamed, shape, false, true);
  const int64_t one_row_weights =
      field_bytes(random_rows(rng, shape, prompt, 1, true), streamed_weights, shape, false, true);
  stream_ids += (completion - 1) * one_row_ids;
  stream_weights += (completion - 1) * one_row_weights;

  const double raw_ids = double(shape.layers * shape.top_k);  // one uint8 per id
  const double encode_ids_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double encode_both_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  std::printf(
      "Qwen3-30B-A3B shapes: %lld layers (all MoE) x top-%lld of %lld experts; %lld prompt + %lld "
      "completion "
      "tokens = %lld route rows\n",
      (long long)shape.layers, (long long)shape.top_k, (long long)shape.experts, (long long)prompt,
      (long long)completion, (long long)rows);
  std::printf("raw ids: %.0f B/token (uint8)\n", raw_ids);
  auto line = [&](const char* what, int64_t bytes) {
    std::printf("%-58s %10lld B  %8.1f B/token\n", what, (long long)bytes,
                double(bytes) / double(tokens));
  };
  line("routed_experts (base64 .npy uint8), whole response", npy_ids);
  line("  + routed_experts_weights (base64 .npy float16)", npy_ids_weights);
  line("SGLang meta_info.routed_experts (base64 int32)", sglang_ids);
  line("routed_experts_start = prompt (completion rows only)", completion_only);
  line("stream_routed_experts, all chunks' route fields", stream_ids);
  line("stream_routed_experts + weights, all chunks' fields", stream_weights);
  std::printf("one decode chunk's route fields: %lld B (ids), %lld B (ids + weights)\n",
              (long long)one_row_ids, (long long)one_row_weights);
  std::printf("encode (select-free, one response): ids %.2f ms, ids + weights %.2f ms\n",
              encode_ids_ms, encode_both_ms);
  if (!out_path.empty()) {
    nlohmann::ordered_json record = {
        {"bench", "route_payload"},
        {"shape", {{"layers", shape.layers}, {"top_k", shape.top_k}, {"experts", shape.experts}}},
        {"prompt", prompt},
        {"completion", completion},
        {"bytes",
         {{"npy_ids", npy_ids},
          {"npy_ids_and_weights", npy_ids_weights},
          {"sglang_int32_ids", sglang_ids},
          {"completion_rows_only", completion_only},
          {"streamed_ids", stream_ids},
          {"streamed_ids_and_weights", stream_weights},
          {"decode_chunk_ids", one_row_ids},
          {"decode_chunk_ids_and_weights", one_row_weights}}},
        {"encode_ms", {{"ids", encode_ids_ms}, {"ids_and_weights", encode_both_ms}}}};
    std::ofstream(out_path) << record.dump(2) << "\n";
  }
  return 0;
}
