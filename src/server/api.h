// The API's request and response shapes, apart from any socket: parsing and validation of
// OpenAI / vLLM / SGLang bodies into engine requests, per-choice text (stop strings), routed-expert
// wire encoding and replay decoding, and the JSON answers. Pure functions, unit-tested directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/server.h"

namespace sy::server {

// Ordered: the client's key order survives into chat templates (tojson of tools, as Python keeps it).
using json = nlohmann::ordered_json;

// An error as the client sees it: OpenAI's {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string param;  // empty = null
};
int http_status_for(ErrorCode code);
ApiError api_error_from(const Status& status, std::string param = "");
json error_body(const ApiError& error);

template <typename T>
struct ApiResult {
  ApiResult(T v) : value(std::move(v)) {}         // NOLINT: implicit by design
  ApiResult(ApiError e) : error(std::move(e)) {}  // NOLINT
  bool is_ok() const { return value.has_value(); }
  std::optional<T> value;
  ApiError error;
};

enum class Endpoint { kCompletions, kChat, kGenerate };

struct RouteOptions {
  bool return_routes = false;
  int64_t start = 0;      // rows [start, N-1)
  bool moe_only = false;  // routed_experts_layers: "moe"
  bool stream = false;    // stream_routed_experts: each SSE chunk carries its rows
  bool weights = false;   // return_routed_experts_weights: float16 gating weights beside the ids
};

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // for echo and logprobs; decoded when the prompt came as ids
};

// One parsed request: prompts.size() * n engine requests, choice index = prompt * n + i.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::vector<PromptInput> prompts;
  bool batch_input = false;  // /generate: `text`/`input_ids` was a list -> answer a list
  int n = 1;
  engine::SamplingParams sampling;  // seed is the base seed: choice i uses seed + i
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  bool echo = false;
  bool return_token_ids = false;
  bool return_tokens_as_token_ids = false;
  bool return_logprob = false;  // /generate
  std::string echo_text;        // chat echo: the last message's content
  RouteOptions routes;
  std::optional<moe::RouteArray> replay;  // already expanded to all hidden layers
  std::string rid;                        // /generate `rid`, or the X-Request-Id header
};

struct ParseContext {
  const ServerConfig& config;
  const engine::ModelInfo& model;
  const TextCodec& codec;
};

ApiResult<ApiRequest> parse_completion_request(const json& body, const ParseContext& context);
ApiResult<ApiRequest> parse_chat_request(const json& body, const ParseContext& context);
ApiResult<ApiRequest> parse_generate_request(const json& body, const ParseContext& context);
// Parses a request body; invalid JSON (including invalid UTF-8) gives a 400 naming the position.
ApiResult<json> parse_json_body(const std::string& body);

// Routed experts on the wire (DESIGN.md): rows [start, N-1), all layers or MoE layers only.
// `all_layers` may be a streamed piece (first_row > 0): its rows before `start` are dropped and
// the result's first_row is the position of its first row. Weights follow the ids.
moe::RouteArray select_routes(const moe::RouteArray& all_layers, const RouteOptions& options,
                              const engine::ModelInfo& model);
// base64 of a float16 .npy of the weights, shape (rows, L, top_k) like the ids.
std::string encode_route_weights_npy_base64(const moe::RouteArray& routes);
// The route fields of one choice (or of one SSE chunk's piece of it): `routed_experts` and, when
// asked, `routed_experts_weights`; a streamed piece adds `routed_experts_first_row`. /generate
// uses SGLang's flat int32 ids (`int32_ids`).
void add_route_fields(const moe::RouteArray& routes, const RouteOptions& options,
                      int64_t num_experts, bool int32_ids, bool piece, json& out);
// base64 of a .npy: uint8 when num_experts <= 256, else uint16 (vLLM's format).
std::string encode_routes_npy_base64(const moe::RouteArray& routes, int64_t num_experts);
// base64 of the flat int32 ids (SGLang's format).
std::string encode_routes_int32_base64(const moe::RouteArray& routes);
// `routed_experts_replay`: base64 .npy, any integer dtype, shape (n, L, K) in the request's layer
// layout -> all hidden layers (dense entries 0). Errors name the parameter.
Result<moe::RouteArray> decode_replay(const std::string& base64_npy, bool moe_only,
                                      const engine::ModelInfo& model);

// One choice's text: incremental detokenization and stop strings. Text that could still become a
// stop string is held back so that a streamed stop string never reaches the client.
class ChoiceText {
 public:
  ChoiceText(std::unique_ptr<TokenStream> stream, std::vector<std::string> stop,
             bool include_stop_str_in_output);
  // Feeds sampled tokens; returns the text now safe to emit. After a stop string matched,
  // stopped() is true and later tokens add no text.
  std::string push(const std::vector<int32_t>& token_ids);
  // The request finished: returns whatever was held back.
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_; }

 private:
  std::string take_safe(bool final);
  std::unique_ptr<TokenStream> stream_;
  std::vector<std::string> stop_;
  bool include_stop_;
  size_t longest_stop_ = 0;
  std::string text_;     // all text so far (trimmed at a stop match)
  size_t emitted_ = 0;   // bytes of text_ already returned
  size_t searched_ = 0;  // stop strings cannot end before this offset
  bool stopped_ = false;
  std::string matched_;
};

// What one finished (or finishing) choice produced, gathered on the connection's strand.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<engine::TokenLogprob> logprobs;
  std::vector<engine::TokenLogprob> prompt_logprobs;
  int64_t cached_prompt_tokens = 0;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  json stop_reason;                       // null, the matched stop token id, or the stop string
  std::optional<moe::RouteArray> routes;  // already selected (start / layers)
  // Streaming with stream_routed_experts: the rows the chunk being written carries (selected).
  std::optional<moe::RouteArray> chunk_routes;
};

std::string finish_reason_name(engine::FinishReason reason);

struct ResponseContext {
  const ApiRequest& request;
  const ServerConfig& config;
  const engine::ModelInfo& model;
  const TextCodec& codec;
  std::string id;   // "cmpl-..." / "chatcmpl-..."
  int64_t created;  // unix seconds
};

json usage_json(const ApiRequest& request, const std::vector<ChoiceResult>& choices);
json completion_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices);
json chat_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices);
json generate_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices,
                       double e2e_latency_s);
// Streaming pieces. `first` chunk of a chat choice carries the role; `final` carries the
// finish_reason, stop_reason and (when asked, without stream_routed_experts) routed_experts.
// With stream_routed_experts, `routes` is the chunk's own rows (selected), or null for none.
json completion_chunk(const ResponseContext& context, int index, const std::string& text,
                      const std::vector<int32_t>& token_ids,
                      const std::vector<engine::TokenLogprob>& logprobs, int64_t text_offset,
                      const ChoiceResult* final, const moe::RouteArray* routes = nullptr);
json chat_chunk(const ResponseContext& context, int index, bool first, const std::string& text,
                const std::vector<int32_t>& token_ids,
                const std::vector<engine::TokenLogprob>& logprobs, const ChoiceResult* final,
                const moe::RouteArray* routes = nullptr);
json usage_chunk(const ResponseContext& context, const json& usage);

json models_response(const ServerConfig& config, const engine::ModelInfo& model, int64_t created);

// The JSON text of a value; invalid UTF-8 (a partial multi-byte token) becomes U+FFFD.
std::string dump_json(const json& value);

}  // namespace sy::server
