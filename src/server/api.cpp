// Request parsing/validation (vLLM's parameter names, defaults and ranges), per-choice text, route
// wire format and response JSON. Parsing fails fast: a ParamError thrown inside a parse_* function
// is caught at its boundary and returned as an ApiError; nothing escapes.
#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {

int http_status_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return 200;
    case ErrorCode::kInvalidArgument:
      return 400;
    case ErrorCode::kUnsupported:
      return 400;
    case ErrorCode::kNotFound:
      return 404;
    case ErrorCode::kResourceExhausted:
      return 429;
    case ErrorCode::kUnavailable:
      return 503;
    case ErrorCode::kInternal:
      return 500;
  }
  return 500;
}

ApiError api_error_from(const Status& status, std::string param) {
  return ApiError{http_status_for(status.code()), status.message(), std::move(param)};
}

static std::string error_type_for(int http_status) {
  switch (http_status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowed";
    case 413:
      return "RequestEntityTooLarge";
    case 429:
      return "RateLimitError";
    case 431:
      return "RequestHeaderFieldsTooLarge";
    case 503:
      return "ServiceUnavailableError";
    default:
      return http_status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

json error_body(const ApiError& error) {
  json inner = {{"message", error.message},
                {"type", error_type_for(error.http_status)},
                {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                {"code", error.http_status}};
  return json{{"error", std::move(inner)}};
}

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiResult<json> parse_json_body(const std::string& body) {
  if (body.empty()) return ApiError{400, "request body is empty; expected a JSON object", ""};
  try {
    json value = json::parse(body);
    if (!value.is_object()) {
      return ApiError{
          400, fmt::format("request body must be a JSON object, got {}", value.type_name()), ""};
    }
    return value;
  } catch (const json::exception& e) {
    return ApiError{400, fmt::format("request body is not valid JSON: {}", e.what()), ""};
  }
}

// ---------------------------------------------------------------------------------------------
// Field readers. Absent and null mean "use the default", as pydantic does for Optional fields.

namespace {

struct ParamError {
  ApiError error;
};

[[noreturn]] void fail(const std::string& param, std::string message, int status = 400) {
  throw ParamError{ApiError{status, std::move(message), param}};
}

const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

double read_number(const json& object, const char* name, double fallback) {
  const json* value = field(object, name);
  if (!value) return fallback;
  if (!value->is_number())
    fail(name, fmt::format("{} must be a number, got {}", name, value->type_name()));
  double number = value->get<double>();
  if (!std::isfinite(number)) fail(name, fmt::format("{} must be finite", name));
  return number;
}

int64_t to_integer(const json& value, const std::string& name) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX)) {
      fail(name, fmt::format("{} is too large", name));
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    double number = value.get<double>();
    if (std::isfinite(number) && number == std::floor(number) && std::fabs(number) < 9e15) {
      return static_cast<int64_t>(number);
    }
  }
  fail(name, fmt::format("{} must be an integer, got {}", name,
                         value.is_number() ? value.dump() : std::string(value.type_name())));
}

std::optional<int64_t> read_integer(const json& object, const char* name) {
  const json* value = field(object, name);
  if (!value) return std::nullopt;
  return to_integer(*value, name);
}

bool read_bool(const json& object, const char* name, bool fallback) {
  const json* value = field(object, name);
  if (!value) return fallback;
  if (!value->is_boolean())
    fail(name, fmt::format("{} must be a boolean, got {}", name, value->type_name()));
  return value->get<bool>();
}

std::optional<std::string> read_string(const json& object, const char* name) {
  const json* value = field(object, name);
  if (!value) return std::nullopt;
  if (!value->is_string())
    fail(name, fmt::format("{} must be a string, got {}", name, value->type_name()));
  return value->get<std::string>();
}

void check_range(const char* name, double value, double low, bool low_open, double high,
                 bool high_open) {
  bool ok = (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
  if (!ok) {
    fail(name, fmt::format("{} must be in {}{}, {}{}, got {}", name, low_open ? "(" : "[", low,
                           high, high_open ? ")" : "]", value));
  }
}

int32_t checked_token(const json& value, const std::string& name, int64_t vocab_size) {
  int64_t id = to_integer(value, name);
  if (id < 0 || id >= vocab_size) {
    fail(name, fmt::format("{}: token id {} is out of range; valid ids are 0 .. {}", name, id,
                           vocab_size - 1));
  }
  return static_cast<int32_t>(id);
}

std::vector<int32_t> read_token_list(const json& value, const std::string& name, int64_t vocab) {
  if (!value.is_array()) fail(name, fmt::format("{} must be a list of token ids", name));
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const json& element : value) ids.push_back(checked_token(element, name, vocab));
  return ids;
}

// Parameters that exist in the OpenAI/vLLM schema but that this server does not implement.
void reject_unsupported(const json& body) {
  auto unsupported = [](const char* name, const std::string& what) {
    fail(name, fmt::format("{} is not supported by this server ({})", name, what));
  };
  for (const char* name :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
        "guided_decoding_backend", "prompt_embeds", "multi_modal_data", "lora_request", "suffix"}) {
    if (field(body, name))
      unsupported(name, "structured output, multimodal, LoRA and suffix are out of scope");
  }
  if (const json* format = field(body, "response_format")) {
    bool plain_text = format->is_object() && format->value("type", "") == "text";
    if (!plain_text) unsupported("response_format", "only {\"type\": \"text\"}");
  }
  if (read_bool(body, "use_beam_search", false)) unsupported("use_beam_search", "no beam search");
  if (auto best_of = read_integer(body, "best_of"); best_of && *best_of > 1) {
    unsupported("best_of", "best_of must be 1");
  }
}

std::vector<std::string> read_stop(const json& object, const char* name) {
  std::vector<std::string> stop;
  const json* value = field(object, name);
  if (!value) return stop;
  if (value->is_string()) {
    stop.push_back(value->get<std::string>());
  } else if (value->is_array()) {
    for (const json& element : *value) {
      if (!element.is_string())
        fail(name, fmt::format("{} must be a string or a list of strings", name));
      stop.push_back(element.get<std::string>());
    }
  } else {
    fail(name,
         fmt::format("{} must be a string or a list of strings, got {}", name, value->type_name()));
  }
  for (const std::string& s : stop) {
    if (s.empty()) fail(name, fmt::format("{} strings must not be empty", name));
  }
  return stop;
}

// Sampling fields shared by /v1/completions, /v1/chat/completions and SGLang's sampling_params.
// `names` maps the engine's notion onto each API's spelling.
struct SamplingNames {
  const char* max_tokens = "max_tokens";
  const char* min_tokens = "min_tokens";
  const char* seed = "seed";
};

void read_sampling(const json& object, const ParseContext& context, const SamplingNames& names,
                   ApiRequest& request) {
  engine::SamplingParams& s = request.sampling;
  const engine::SamplingParams& defaults = context.config.sampling_defaults;
  s.top_k = defaults.top_k;
  s.temperature = static_cast<float>(read_number(object, "temperature", defaults.temperature));
  check_range("temperature", s.temperature, 0, false, 2, false);
  s.top_p = static_cast<float>(read_number(object, "top_p", defaults.top_p));
  check_range("top_p", s.top_p, 0, true, 1, false);
  if (auto top_k = read_integer(object, "top_k")) {
    if (*top_k == 0) *top_k = -1;  // vLLM: 0 also disables
    if (*top_k < -1 || *top_k > std::numeric_limits<int32_t>::max()) {
      fail("top_k", fmt::format("top_k must be -1 (disable) or at least 1, got {}", *top_k));
    }
    s.top_k = static_cast<int>(*top_k);
  }
  s.min_p = static_cast<float>(read_number(object, "min_p", defaults.min_p));
  check_range("min_p", s.min_p, 0, false, 1, false);
  s.presence_penalty = static_cast<float>(read_number(object, "presence_penalty", 0.0));
  check_range("presence_penalty", s.presence_penalty, -2, false, 2, false);
  s.frequency_penalty = static_cast<float>(read_number(object, "frequency_penalty", 0.0));
  check_range("frequency_penalty", s.frequency_penalty, -2, false, 2, false);
  s.repetition_penalty =
      static_cast<float>(read_number(object, "repetition_penalty", defaults.repetition_penalty));
  check_range("repetition_penalty", s.repetition_penalty, 0, true, 2, false);
  if (auto seed = read_integer(object, names.seed)) s.seed = static_cast<uint64_t>(*seed);
  s.ignore_eos = read_bool(object, "ignore_eos", false);
  if (const json* ids = field(object, "stop_token_ids")) {
    s.stop_token_ids = read_token_list(*ids, "stop_token_ids", context.model.vocab_size);
  }
  if (const json* bias = field(object, "logit_bias")) {
    if (!bias->is_object())
      fail("logit_bias", "logit_bias must be an object mapping token ids to biases");
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      int64_t id = 0;
      try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        fail("logit_bias", fmt::format("logit_bias key '{}' is not a token id", it.key()));
      }
      if (id < 0 || id >= context.model.vocab_size) {
        fail("logit_bias",
             fmt::format("logit_bias: token id {} is out of range; valid ids are 0 .. {}", id,
                         context.model.vocab_size - 1));
      }
      if (!it->is_number()) fail("logit_bias", "logit_bias values must be numbers");
      double value = it->get<double>();
      if (!(value >= -100 && value <= 100)) {
        fail("logit_bias", fmt::format("logit_bias values must be in [-100, 100], got {}", value));
      }
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(value));
    }
  }
  if (auto min_tokens = read_integer(object, names.min_tokens)) {
    if (*min_tokens < 0 || *min_tokens > INT32_MAX) {
      fail(names.min_tokens,
           fmt::format("{} must be at least 0, got {}", names.min_tokens, *min_tokens));
    }
    s.min_tokens = static_cast<int>(*min_tokens);
  }
  request.stop = read_stop(object, "stop");
  request.skip_special_tokens = read_bool(object, "skip_special_tokens", true);
  request.include_stop_str_in_output = read_bool(object, "include_stop_str_in_output", false);
}

void read_n(const json& object, const ParseContext& context, ApiRequest& request) {
  if (auto n = read_integer(object, "n")) {
    if (*n < 1 || *n > context.config.max_n) {
      fail("n", fmt::format("n must be in [1, {}], got {}", context.config.max_n, *n));
    }
    request.n = static_cast<int>(*n);
  }
}

// max_tokens: `fallback` < 0 means "the rest of the context" (chat's default).
void resolve_max_tokens(const json& object, const ParseContext& context,
                        std::initializer_list<const char*> names, int64_t fallback,
                        ApiRequest& request) {
  std::optional<int64_t> max_tokens;
  const char* used = *names.begin();
  for (const char* name : names) {
    if (auto value = read_integer(object, name)) {
      max_tokens = value;
      used = name;
      break;
    }
  }
  int64_t longest_prompt = 0;
  for (const PromptInput& p : request.prompts)
    longest_prompt = std::max<int64_t>(longest_prompt, p.ids.size());
  int64_t context_len = context.model.max_model_len;
  if (longest_prompt >= context_len) {
    fail("prompt", fmt::format("This model's maximum context length is {} tokens. However, your "
                               "prompt has {} tokens; it must be shorter than the context.",
                               context_len, longest_prompt));
  }
  if (max_tokens) {
    if (*max_tokens < 1)
      fail(used, fmt::format("{} must be at least 1, got {}", used, *max_tokens));
    if (longest_prompt + *max_tokens > context_len) {
      fail(used, fmt::format("This model's maximum context length is {} tokens. However, you "
                             "requested {} tokens ({} in the prompt, {} in the completion). "
                             "Please reduce the prompt or {}.",
                             context_len, longest_prompt + *max_tokens, longest_prompt, *max_tokens,
                             used));
    }
  } else {
    max_tokens = fallback < 0 ? context_len - longest_prompt
                              : std::min<int64_t>(fallback, context_len - longest_prompt);
  }
  request.sampling.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
  if (request.sampling.min_tokens > request.sampling.max_tokens) {
    fail("min_tokens", fmt::format("min_tokens must be at most max_tokens ({}), got {}",
                                   request.sampling.max_tokens, request.sampling.min_tokens));
  }
}

void read_logprob_count(const json& object, const char* name, int& out) {
  if (auto value = read_integer(object, name)) {
    if (*value < 0 || *value > 20)
      fail(name, fmt::format("{} must be in [0, 20], got {}", name, *value));
    out = static_cast<int>(*value);
  }
}

// Route capture and replay options, on any endpoint.
void read_route_options(const json& object, const ParseContext& context, ApiRequest& request) {
  const bool flag = context.config.enable_return_routed_experts;
  const bool by_default = flag && context.config.return_routed_experts_default;
  const json* asked = field(object, "return_routed_experts");
  request.routes.return_routes = read_bool(object, "return_routed_experts", by_default);
  // Streamed routes and gating weights are routes too: asking for them asks for routes, unless
  // the request said return_routed_experts: false.
  request.routes.stream = read_bool(object, "stream_routed_experts", false);
  request.routes.weights = read_bool(object, "return_routed_experts_weights", false);
  for (auto [name, on] : {std::pair{"stream_routed_experts", request.routes.stream},
                          std::pair{"return_routed_experts_weights", request.routes.weights}}) {
    if (!on) continue;
    if (asked && !request.routes.return_routes)
      fail(name, fmt::format("{} needs the routes: it cannot be combined with "
                             "return_routed_experts: false",
                             name));
    request.routes.return_routes = true;
  }
  if (request.routes.return_routes && !flag) {
    const char* name = request.routes.weights  ? "return_routed_experts_weights"
                       : request.routes.stream ? "stream_routed_experts"
                                               : "return_routed_experts";
    fail(name, fmt::format("{} requires the server to be started with "
                           "--enable-return-routed-experts",
                           name));
  }
  if (request.routes.stream && !request.stream)
    fail("stream_routed_experts", "stream_routed_experts requires stream: true");
  if (request.routes.weights && !context.model.route_weights)
    fail("return_routed_experts_weights",
         context.model.route_weights_unavailable.empty()
             ? std::string("this server cannot return gating weights")
             : context.model.route_weights_unavailable);
  for (const char* name :
       {"routed_experts_start", "routed_experts_prompt_start", "routed_experts_start_len"}) {
    if (auto start = read_integer(object, name)) {
      if (*start < 0) fail(name, fmt::format("{} must be at least 0, got {}", name, *start));
      request.routes.start = *start;
      break;
    }
  }
  if (auto layers = read_string(object, "routed_experts_layers")) {
    if (*layers == "moe") {
      request.routes.moe_only = true;
    } else if (*layers != "all") {
      fail("routed_experts_layers",
           fmt::format("routed_experts_layers must be \"all\" or \"moe\", got \"{}\"", *layers));
    }
  }
  if (auto replay = read_string(object, "routed_experts_replay")) {
    Result<moe::RouteArray> routes = decode_replay(*replay, request.routes.moe_only, context.model);
    if (!routes) fail("routed_experts_replay", routes.message());
    if (request.prompts.size() != 1) {
      fail("routed_experts_replay", "routed_experts_replay needs exactly one prompt");
    }
    if (routes->rows > static_cast<int64_t>(request.prompts[0].ids.size())) {
      fail("routed_experts_replay",
           fmt::format("routed_experts_replay has {} rows but the prompt has only {} tokens; "
                       "rows must be at most the prompt length",
                       routes->rows, request.prompts[0].ids.size()));
    }
    request.replay = std::move(routes).value();
  } else if (field(object, "routed_experts_replay")) {
    fail("routed_experts_replay", "routed_experts_replay must be a base64 string of a .npy file");
  }
}

void check_model(const json& body, const ParseContext& context) {
  if (auto model = read_string(body, "model")) {
    if (*model != context.config.served_model_name) {
      fail("model",
           fmt::format("The model `{}` does not exist; this server serves `{}`.", *model,
                       context.config.served_model_name),
           404);
    }
  }
}

PromptInput prompt_from_text(const std::string& text, bool add_special, const ParseContext& context,
                             const char* param) {
  if (text.empty()) fail(param, fmt::format("{} must not be empty", param));
  Result<std::vector<int32_t>> ids = context.codec.encode(text, add_special);
  if (!ids) fail(param, fmt::format("{}: {}", param, ids.message()));
  return PromptInput{std::move(ids).value(), text};
}

PromptInput prompt_from_ids(const json& value, const ParseContext& context, const char* param) {
  PromptInput prompt;
  prompt.ids = read_token_list(value, param, context.model.vocab_size);
  prompt.text = context.codec.decode(prompt.ids, false);
  return prompt;
}

void check_prompts_nonempty(const ApiRequest& request, const char* param) {
  if (request.prompts.empty()) fail(param, fmt::format("{} must not be empty", param));
  for (const PromptInput& p : request.prompts) {
    if (p.ids.empty())
      fail(param, fmt::format("{} must not be empty (it encodes to zero tokens)", param));
  }
}

void check_choice_count(const ApiRequest& request, const ParseContext& context) {
  int64_t total = static_cast<int64_t>(request.prompts.size()) * request.n;
  if (total > context.config.max_n) {
    fail("n", fmt::format("{} prompts times n = {} is {} choices; at most {} per request",
                          request.prompts.size(), request.n, total, context.config.max_n));
  }
}

void read_stream_options(const json& body, ApiRequest& request) {
  request.stream = read_bool(body, "stream", false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) fail("stream_options", "stream_options must be an object");
    if (!request.stream)
      fail("stream_options", "stream_options is only allowed when stream is true");
    request.include_usage = read_bool(*options, "include_usage", false);
    request.continuous_usage_stats = read_bool(*options, "continuous_usage_stats", false);
  }
}

template <typename F>
ApiResult<ApiRequest> guarded(F&& parse) {
  try {
    return parse();
  } catch (const ParamError& e) {
    return e.error;
  } catch (const json::exception& e) {
    return ApiError{400, fmt::format("invalid request: {}", e.what()), ""};
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ApiResult<ApiRequest> parse_completion_request(const json& body, const ParseContext& context) {
  return guarded([&] {
    ApiRequest request;
    request.endpoint = Endpoint::kCompletions;
    check_model(body, context);
    reject_unsupported(body);
    bool add_special = read_bool(body, "add_special_tokens", true);
    const json* prompt = field(body, "prompt");
    if (!prompt)
      fail("prompt", "prompt is required: a string, a list of token ids, or a list of either");
    if (prompt->is_string()) {
      request.prompts.push_back(
          prompt_from_text(prompt->get<std::string>(), add_special, context, "prompt"));
    } else if (prompt->is_array()) {
      if (prompt->empty()) fail("prompt", "prompt must not be empty");
      const json& first = prompt->front();
      if (first.is_number()) {
        request.prompts.push_back(prompt_from_ids(*prompt, context, "prompt"));
      } else {
        if (prompt->size() > static_cast<size_t>(context.config.max_n)) {
          fail("prompt", fmt::format("at most {} prompts per request, got {}", context.config.max_n,
                                     prompt->size()));
        }
        for (const json& element : *prompt) {
          if (element.is_string()) {
            request.prompts.push_back(
                prompt_from_text(element.get<std::string>(), add_special, context, "prompt"));
          } else if (element.is_array()) {
            request.prompts.push_back(prompt_from_ids(element, context, "prompt"));
          } else {
            fail("prompt", "prompt must be a string, a list of token ids, or a list of either");
          }
        }
      }
    } else {
      fail("prompt",
           fmt::format("prompt must be a string, a list of token ids, or a list of either, got {}",
                       prompt->type_name()));
    }
    check_prompts_nonempty(request, "prompt");
    read_n(body, context, request);
    check_choice_count(request, context);
    read_sampling(body, context, SamplingNames{}, request);
    resolve_max_tokens(body, context, {"max_tokens"}, 16, request);
    read_logprob_count(body, "logprobs", request.sampling.logprobs);
    read_logprob_count(body, "prompt_logprobs", request.sampling.prompt_logprobs);
    request.echo = read_bool(body, "echo", false);
    if (request.echo && request.sampling.logprobs >= 0) {
      fail("echo", "echo together with logprobs is not supported; use prompt_logprobs");
    }
    request.return_token_ids = read_bool(body, "return_token_ids", false);
    request.return_tokens_as_token_ids = read_bool(body, "return_tokens_as_token_ids", false);
    read_stream_options(body, request);
    read_route_options(body, context, request);
    if (auto id = read_string(body, "request_id")) request.rid = *id;
    return request;
  });
}

// Message content may be a string or a list of text parts (joined by "\n", as vLLM does).
static json normalize_messages(const json& messages) {
  if (!messages.is_array() || messages.empty()) {
    fail("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects");
  }
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& message = messages[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!message.is_object()) fail("messages", where + " must be an object");
    const json* role = field(message, "role");
    if (!role || !role->is_string()) fail("messages", where + ".role must be a string");
    json normalized = message;
    if (const json* content = field(message, "content")) {
      if (content->is_array()) {
        std::string text;
        for (const json& part : *content) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            fail("messages", where +
                                 ".content: only text parts are supported (multimodal input is "
                                 "not supported by this server)");
          }
          if (!text.empty()) text += "\n";
          text += part["text"].get<std::string>();
        }
        normalized["content"] = text;
      } else if (!content->is_string()) {
        fail("messages", where + ".content must be a string or a list of text parts");
      }
    }
    out.push_back(std::move(normalized));
  }
  return out;
}

ApiResult<ApiRequest> parse_chat_request(const json& body, const ParseContext& context) {
  return guarded([&] {
    ApiRequest request;
    request.endpoint = Endpoint::kChat;
    check_model(body, context);
    reject_unsupported(body);
    const json* raw_messages = field(body, "messages");
    if (!raw_messages) fail("messages", "messages is required");
    json messages = normalize_messages(*raw_messages);
    json tools = nullptr;
    if (const json* t = field(body, "tools")) {
      if (!t->is_array()) fail("tools", "tools must be a list");
      tools = *t;
    }
    if (const json* choice = field(body, "tool_choice")) {
      if (!(choice->is_string() && choice->get<std::string>() == "none")) {
        fail("tool_choice",
             "tool_choice other than \"none\" is not supported (no tool-call parser); "
             "tools are rendered into the prompt only");
      }
    }
    bool add_generation_prompt = read_bool(body, "add_generation_prompt", true);
    bool continue_final = read_bool(body, "continue_final_message", false);
    if (continue_final && add_generation_prompt) {
      fail("continue_final_message",
           "continue_final_message and add_generation_prompt cannot both be true");
    }
    json kwargs = json::object();
    if (const json* k = field(body, "chat_template_kwargs")) {
      if (!k->is_object()) fail("chat_template_kwargs", "chat_template_kwargs must be an object");
      kwargs = *k;
    }
    if (field(body, "chat_template")) {
      fail("chat_template",
           "a per-request chat_template is not supported; the model's own is used");
    }
    // continue_final_message as transformers does it: render the final message's text with a
    // tag appended, then cut the prompt at the tag (which drops the message's end marker).
    static constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";
    std::string final_text;
    if (continue_final) {
      const json* content = field(raw_messages->back(), "content");
      if (!content || content->is_null())
        fail("continue_final_message",
             "continue_final_message is set but the final message has no content to continue");
      if (content->is_array() && content->empty())
        fail("continue_final_message",
             "continue_final_message is set but the final message has no text part to continue");
      json& last = messages.back()["content"];  // normalized: the parts joined into one string
      final_text = last.get<std::string>();
      last = final_text + std::string(kContinueTag);
    }
    Result<std::string> rendered =
        context.codec.render_chat(messages, tools, add_generation_prompt, kwargs);
    if (!rendered) fail("messages", fmt::format("chat template: {}", rendered.message()));
    std::string prompt_text = std::move(rendered).value();
    if (continue_final) {
      messages.back()["content"] = final_text;  // echo returns the message as sent
      auto strip = [](std::string_view text) {
        const char* space = " \t\n\r\v\f";
        const size_t begin = text.find_first_not_of(space);
        if (begin == std::string_view::npos) return std::string_view();
        return text.substr(begin, text.find_last_not_of(space) - begin + 1);
      };
      const std::string_view tag = strip(kContinueTag);
      if (prompt_text.find(strip(final_text)) == std::string::npos || prompt_text.find(tag) == std::string::npos)
        fail("continue_final_message",
             "continue_final_message is set but the final message does not appear in the prompt the "
             "chat template rendered (the template changes or drops it), so it cannot be continued");
      const size_t at = prompt_text.rfind(tag);
      const bool spacing_kept = prompt_text.compare(at, kContinueTag.size(), kContinueTag) == 0;
      prompt_text.resize(at);
      if (!spacing_kept) prompt_text.resize(prompt_text.find_last_not_of(" \t\n\r\v\f") + 1);
    }
    bool add_special = read_bool(body, "add_special_tokens", false);
    request.prompts.push_back(prompt_from_text(prompt_text, add_special, context, "messages"));
    check_prompts_nonempty(request, "messages");
    read_n(body, context, request);
    read_sampling(body, context, SamplingNames{}, request);
    resolve_max_tokens(body, context, {"max_completion_tokens", "max_tokens"}, -1, request);
    if (read_bool(body, "logprobs", false)) {
      request.sampling.logprobs = 0;
      read_logprob_count(body, "top_logprobs", request.sampling.logprobs);
    } else if (auto top = read_integer(body, "top_logprobs"); top && *top > 0) {
      fail("top_logprobs", "top_logprobs requires logprobs to be true");
    }
    read_logprob_count(body, "prompt_logprobs", request.sampling.prompt_logprobs);
    request.echo = read_bool(body, "echo", false);
    if (request.echo && messages.back().contains("content") &&
        messages.back()["content"].is_string()) {
      request.echo_text = messages.back()["content"].get<std::string>();
    }
    request.return_token_ids = read_bool(body, "return_token_ids", false);
    request.return_tokens_as_token_ids = read_bool(body, "return_tokens_as_token_ids", false);
    read_stream_options(body, request);
    read_route_options(body, context, request);
    if (auto id = read_string(body, "request_id")) request.rid = *id;
    return request;
  });
}

ApiResult<ApiRequest> parse_generate_request(const json& body, const ParseContext& context) {
  return guarded([&] {
    ApiRequest request;
    request.endpoint = Endpoint::kGenerate;
    const json* text = field(body, "text");
    const json* input_ids = field(body, "input_ids");
    if ((text != nullptr) == (input_ids != nullptr)) {
      fail(text ? "text" : "input_ids", "exactly one of text and input_ids is required");
    }
    for (const char* name :
         {"image_data", "audio_data", "video_data", "input_embeds", "lora_path"}) {
      if (field(body, name)) fail(name, fmt::format("{} is not supported by this server", name));
    }
    if (text) {
      if (text->is_string()) {
        request.prompts.push_back(
            prompt_from_text(text->get<std::string>(), true, context, "text"));
      } else if (text->is_array() && !text->empty()) {
        request.batch_input = true;
        if (text->size() > static_cast<size_t>(context.config.max_n)) {
          fail("text", fmt::format("at most {} prompts per request", context.config.max_n));
        }
        for (const json& element : *text) {
          if (!element.is_string()) fail("text", "text must be a string or a list of strings");
          request.prompts.push_back(
              prompt_from_text(element.get<std::string>(), true, context, "text"));
        }
      } else {
        fail("text", "text must be a string or a non-empty list of strings");
      }
    } else {
      if (!input_ids->is_array() || input_ids->empty()) {
        fail("input_ids", "input_ids must be a non-empty list of token ids or of lists of them");
      }
      if (input_ids->front().is_array()) {
        request.batch_input = true;
        if (input_ids->size() > static_cast<size_t>(context.config.max_n)) {
          fail("input_ids", fmt::format("at most {} prompts per request", context.config.max_n));
        }
        for (const json& element : *input_ids)
          request.prompts.push_back(prompt_from_ids(element, context, "input_ids"));
      } else {
        request.prompts.push_back(prompt_from_ids(*input_ids, context, "input_ids"));
      }
    }
    check_prompts_nonempty(request, text ? "text" : "input_ids");
    json sampling = json::object();
    if (const json* s = field(body, "sampling_params")) {
      if (!s->is_object()) fail("sampling_params", "sampling_params must be an object");
      sampling = *s;
    }
    read_n(sampling, context, request);
    check_choice_count(request, context);
    read_sampling(sampling, context,
                  SamplingNames{"max_new_tokens", "min_new_tokens", "sampling_seed"}, request);
    if (!request.sampling.seed) {
      if (auto seed = read_integer(sampling, "seed"))
        request.sampling.seed = static_cast<uint64_t>(*seed);
    }
    if (read_bool(sampling, "no_stop_trim", false)) request.include_stop_str_in_output = true;
    resolve_max_tokens(sampling, context, {"max_new_tokens"}, 128, request);
    request.return_logprob = read_bool(body, "return_logprob", false);
    if (request.return_logprob) {
      request.sampling.logprobs = 0;
      read_logprob_count(body, "top_logprobs_num", request.sampling.logprobs);
      if (auto start = read_integer(body, "logprob_start_len"); start && *start >= 0) {
        request.sampling.prompt_logprobs = request.sampling.logprobs;
      }
    }
    request.stream = read_bool(body, "stream", false);
    read_route_options(body, context, request);
    if (auto rid = read_string(body, "rid")) request.rid = *rid;
    return request;
  });
}

// ---------------------------------------------------------------------------------------------
// Routes on the wire.

moe::RouteArray select_routes(const moe::RouteArray& all, const RouteOptions& options,
                              const engine::ModelInfo& model) {
  moe::RouteArray out;
  // Row index (within `all`) of the first row at or past position options.start.
  int64_t start = std::clamp<int64_t>(options.start - all.first_row, 0, all.rows);
  out.first_row = all.first_row + start;
  out.rows = all.rows - start;
  out.top_k = all.top_k;
  const bool weights = !all.weights.empty();
  std::vector<int64_t> layers;
  if (options.moe_only) {
    for (int layer : model.moe_layers) layers.push_back(layer);
  } else {
    for (int64_t layer = 0; layer < all.layers; ++layer) layers.push_back(layer);
  }
  out.layers = static_cast<int64_t>(layers.size());
  out.ids.reserve(static_cast<size_t>(out.rows * out.layers * out.top_k));
  if (weights) out.weights.reserve(out.ids.capacity());
  for (int64_t row = start; row < all.rows; ++row) {
    for (int64_t layer : layers) {
      for (int64_t k = 0; k < all.top_k; ++k) {
        out.ids.push_back(all.at(row, layer, k));
        if (weights)
          out.weights.push_back(
              all.weights[static_cast<size_t>((row * all.layers + layer) * all.top_k + k)]);
      }
    }
  }
  return out;
}

std::string encode_route_weights_npy_base64(const moe::RouteArray& routes) {
  std::vector<uint16_t> half(routes.weights.size());
  for (size_t i = 0; i < half.size(); ++i) half[i] = f32_to_f16(routes.weights[i]);
  return base64_encode(
      npy_encode(DType::kF16, {routes.rows, routes.layers, routes.top_k}, half.data()));
}

void add_route_fields(const moe::RouteArray& routes, const RouteOptions& options,
                      int64_t num_experts, bool int32_ids, bool piece, json& out) {
  out["routed_experts"] = int32_ids ? encode_routes_int32_base64(routes)
                                    : encode_routes_npy_base64(routes, num_experts);
  if (options.weights) out["routed_experts_weights"] = encode_route_weights_npy_base64(routes);
  if (piece) out["routed_experts_first_row"] = routes.first_row;
}

std::string encode_routes_npy_base64(const moe::RouteArray& routes, int64_t num_experts) {
  std::vector<int64_t> shape = {routes.rows, routes.layers, routes.top_k};
  if (num_experts <= 256) {
    std::vector<uint8_t> narrow(routes.ids.begin(), routes.ids.end());
    return base64_encode(npy_encode(DType::kU8, shape, narrow.data()));
  }
  std::vector<uint16_t> narrow(routes.ids.begin(), routes.ids.end());
  return base64_encode(npy_encode(DType::kU16, shape, narrow.data()));
}

std::string encode_routes_int32_base64(const moe::RouteArray& routes) {
  return base64_encode(std::string_view(reinterpret_cast<const char*>(routes.ids.data()),
                                        routes.ids.size() * sizeof(int32_t)));
}

Result<moe::RouteArray> decode_replay(const std::string& base64_npy, bool moe_only,
                                      const engine::ModelInfo& model) {
  const char* name = "routed_experts_replay";
  Result<std::string> bytes = base64_decode(base64_npy);
  if (!bytes) return Status::errorf("{} is not valid base64: {}", name, bytes.message());
  Result<NpyArray> array = npy_decode(*bytes);
  if (!array) return Status::errorf("{} is not a valid .npy file: {}", name, array.message());
  int64_t layers =
      moe_only ? static_cast<int64_t>(model.moe_layers.size()) : model.num_hidden_layers;
  const std::vector<int64_t>& shape = array->shape;
  if (shape.size() != 3 || shape[1] != layers || shape[2] != model.top_k) {
    std::string got;
    for (size_t i = 0; i < shape.size(); ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
    return Status::errorf("{} must have shape (n, {}, {}) ({} layers, top_k {}), got ({})", name,
                          layers, model.top_k, moe_only ? "MoE" : "all hidden", model.top_k, got);
  }
  Result<std::vector<int64_t>> values = npy_to_int64(*array);
  if (!values) return Status::errorf("{} must hold integers: {}", name, values.message());
  std::vector<bool> is_moe(static_cast<size_t>(model.num_hidden_layers), false);
  for (int layer : model.moe_layers) {
    if (layer >= 0 && layer < model.num_hidden_layers) is_moe[static_cast<size_t>(layer)] = true;
  }
  moe::RouteArray out;
  out.rows = shape[0];
  out.layers = model.num_hidden_layers;
  out.top_k = model.top_k;
  out.ids.assign(static_cast<size_t>(out.rows * out.layers * out.top_k), 0);
  const int64_t k_count = model.top_k;
  for (int64_t row = 0; row < out.rows; ++row) {
    for (int64_t j = 0; j < layers; ++j) {
      int64_t layer = moe_only ? model.moe_layers[static_cast<size_t>(j)] : j;
      if (!is_moe[static_cast<size_t>(layer)]) continue;  // dense layers' entries are ignored
      const int64_t* ids = values->data() + (row * layers + j) * k_count;
      for (int64_t k = 0; k < k_count; ++k) {
        if (ids[k] < 0 || ids[k] >= model.num_experts) {
          return Status::errorf("{}[{}, {}, {}] = {} is not an expert id; valid ids are 0 .. {}",
                                name, row, j, k, ids[k], model.num_experts - 1);
        }
        for (int64_t earlier = 0; earlier < k; ++earlier) {
          if (ids[earlier] == ids[k]) {
            return Status::errorf("{}[{}, {}] repeats expert {}; a row's experts must be distinct",
                                  name, row, j, ids[k]);
          }
        }
        out.ids[static_cast<size_t>((row * out.layers + layer) * k_count + k)] =
            static_cast<int32_t>(ids[k]);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Per-choice text.

ChoiceText::ChoiceText(std::unique_ptr<TokenStream> stream, std::vector<std::string> stop,
                       bool include_stop_str_in_output)
    : stream_(std::move(stream)),
      stop_(std::move(stop)),
      include_stop_(include_stop_str_in_output) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

static void find_stop(std::string& text, size_t& searched, const std::vector<std::string>& stop,
                      size_t longest, bool include, bool& stopped, std::string& matched) {
  if (stop.empty() || text.size() == searched) return;
  // A match not found before must end after `searched`, so it starts after searched - longest.
  size_t from = searched + 1 > longest ? searched + 1 - longest : 0;
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stop) {
    size_t at = text.find(s, from);
    if (at != std::string::npos && at < best) {
      best = at;
      best_stop = &s;
    }
  }
  if (best_stop) {
    stopped = true;
    matched = *best_stop;
    text.resize(include ? best + best_stop->size() : best);
  }
  searched = text.size();
}

std::string ChoiceText::push(const std::vector<int32_t>& token_ids) {
  if (stopped_) return "";
  for (int32_t id : token_ids) {
    text_ += stream_->push(id);
    find_stop(text_, searched_, stop_, longest_stop_, include_stop_, stopped_, matched_);
    if (stopped_) break;
  }
  return take_safe(false);
}

std::string ChoiceText::finish() {
  if (!stopped_) {
    text_ += stream_->flush();
    find_stop(text_, searched_, stop_, longest_stop_, include_stop_, stopped_, matched_);
  }
  return take_safe(true);
}

std::string ChoiceText::take_safe(bool final) {
  size_t end = text_.size();
  if (!final && !stopped_ && longest_stop_ > 1) {
    size_t hold = longest_stop_ - 1;
    end = end > hold ? end - hold : 0;
    // Never split a UTF-8 character.
    while (end > emitted_ && end < text_.size() &&
           (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) {
      --end;
    }
  }
  if (end <= emitted_) return "";
  std::string out = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Responses.

std::string finish_reason_name(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kAbort:
      return "abort";
    case engine::FinishReason::kError:
      return "error";
    case engine::FinishReason::kNone:
      return "";
  }
  return "";
}

static json finish_json(engine::FinishReason reason) {
  return reason == engine::FinishReason::kNone ? json(nullptr) : json(finish_reason_name(reason));
}

static std::string token_string(const ResponseContext& context, int32_t id) {
  if (context.request.return_tokens_as_token_ids) return fmt::format("token_id:{}", id);
  return context.codec.decode({id}, false);
}

static json bytes_of(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// OpenAI completions logprobs: parallel lists plus a dict of alternatives per position.
static json completion_logprobs(const ResponseContext& context,
                                const std::vector<engine::TokenLogprob>& logprobs,
                                int64_t text_offset) {
  json out = {{"text_offset", json::array()},
              {"token_logprobs", json::array()},
              {"tokens", json::array()},
              {"top_logprobs", json::array()}};
  int64_t offset = text_offset;
  for (const engine::TokenLogprob& lp : logprobs) {
    std::string token = token_string(context, lp.token_id);
    out["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(token.size());
    out["token_logprobs"].push_back(lp.logprob);
    out["tokens"].push_back(token);
    json top = json::object();
    for (const engine::TopLogprob& alt : lp.top)
      top[token_string(context, alt.token_id)] = alt.logprob;
    out["top_logprobs"].push_back(std::move(top));
  }
  return out;
}

static json chat_logprobs(const ResponseContext& context,
                          const std::vector<engine::TokenLogprob>& logprobs) {
  json content = json::array();
  for (const engine::TokenLogprob& lp : logprobs) {
    std::string token = token_string(context, lp.token_id);
    json top = json::array();
    for (const engine::TopLogprob& alt : lp.top) {
      std::string alt_token = token_string(context, alt.token_id);
      top.push_back(
          {{"token", alt_token}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt_token)}});
    }
    content.push_back({{"token", token},
                       {"logprob", lp.logprob},
                       {"bytes", bytes_of(token)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}};
}

// vLLM's prompt_logprobs: null for position 0, then {token_id: {logprob, rank, decoded_token}}.
static json prompt_logprobs_json(const ResponseContext& context,
                                 const std::vector<engine::TokenLogprob>& logprobs) {
  json out = json::array();
  out.push_back(nullptr);
  for (const engine::TokenLogprob& lp : logprobs) {
    json position = json::object();
    json rank = nullptr;
    for (size_t i = 0; i < lp.top.size(); ++i) {
      if (lp.top[i].token_id == lp.token_id) rank = static_cast<int>(i + 1);
      position[std::to_string(lp.top[i].token_id)] = {
          {"logprob", lp.top[i].logprob},
          {"rank", static_cast<int>(i + 1)},
          {"decoded_token", token_string(context, lp.top[i].token_id)}};
    }
    position[std::to_string(lp.token_id)] = {{"logprob", lp.logprob},
                                             {"rank", rank},
                                             {"decoded_token", token_string(context, lp.token_id)}};
    out.push_back(std::move(position));
  }
  return out;
}

static const PromptInput& prompt_of(const ApiRequest& request, size_t choice) {
  return request.prompts[choice / static_cast<size_t>(request.n)];
}

json usage_json(const ApiRequest& request, const std::vector<ChoiceResult>& choices) {
  int64_t prompt_tokens = 0;
  for (const PromptInput& p : request.prompts) prompt_tokens += static_cast<int64_t>(p.ids.size());
  int64_t completion_tokens = 0;
  int64_t cached = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    completion_tokens += static_cast<int64_t>(choices[i].token_ids.size());
    if (i % static_cast<size_t>(request.n) == 0) cached += choices[i].cached_prompt_tokens;
  }
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

static void add_final_fields(const ResponseContext& context, const ChoiceResult& result,
                             json& choice) {
  choice["finish_reason"] = finish_json(result.finish_reason);
  choice["stop_reason"] = result.stop_reason;
  if (context.request.routes.return_routes && result.routes && !context.request.routes.stream) {
    add_route_fields(*result.routes, context.request.routes, context.model.num_experts, false,
                     false, choice);
  }
}

// A streamed chunk's own rows (stream_routed_experts).
static void add_chunk_routes(const ResponseContext& context, const moe::RouteArray* routes,
                             json& choice) {
  if (routes && context.request.routes.stream)
    add_route_fields(*routes, context.request.routes, context.model.num_experts, false, true,
                     choice);
}

json completion_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices) {
  const ApiRequest& request = context.request;
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& result = choices[i];
    const PromptInput& prompt = prompt_of(request, i);
    std::string text = request.echo ? prompt.text + result.text : result.text;
    json choice = {{"index", i}, {"text", text}};
    choice["logprobs"] = request.sampling.logprobs >= 0
                             ? completion_logprobs(context, result.logprobs, 0)
                             : json(nullptr);
    add_final_fields(context, result, choice);
    choice["prompt_logprobs"] = request.sampling.prompt_logprobs >= 0
                                    ? prompt_logprobs_json(context, result.prompt_logprobs)
                                    : json(nullptr);
    if (request.return_token_ids) {
      choice["prompt_token_ids"] = prompt.ids;
      choice["token_ids"] = result.token_ids;
    }
    out_choices.push_back(std::move(choice));
  }
  return json{{"id", context.id},
              {"object", "text_completion"},
              {"created", context.created},
              {"model", context.config.served_model_name},
              {"choices", std::move(out_choices)},
              {"usage", usage_json(request, choices)},
              {"system_fingerprint", nullptr}};
}

json chat_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices) {
  const ApiRequest& request = context.request;
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& result = choices[i];
    std::string text = request.echo ? request.echo_text + result.text : result.text;
    json message = {{"role", "assistant"},
                    {"content", text},
                    {"reasoning_content", nullptr},
                    {"tool_calls", json::array()}};
    json choice = {{"index", i}, {"message", std::move(message)}};
    choice["logprobs"] =
        request.sampling.logprobs >= 0 ? chat_logprobs(context, result.logprobs) : json(nullptr);
    add_final_fields(context, result, choice);
    if (request.return_token_ids) choice["token_ids"] = result.token_ids;
    out_choices.push_back(std::move(choice));
  }
  json out = {{"id", context.id},
              {"object", "chat.completion"},
              {"created", context.created},
              {"model", context.config.served_model_name},
              {"choices", std::move(out_choices)},
              {"usage", usage_json(request, choices)},
              {"system_fingerprint", nullptr}};
  if (request.sampling.prompt_logprobs >= 0 && !choices.empty()) {
    out["prompt_logprobs"] = prompt_logprobs_json(context, choices[0].prompt_logprobs);
  }
  if (request.return_token_ids) out["prompt_token_ids"] = request.prompts[0].ids;
  return out;
}

// SGLang: {"type": "stop", "matched": id | "str"} / {"type": "length", "length": n} / abort.
static json sglang_finish_reason(const ChoiceResult& result) {
  switch (result.finish_reason) {
    case engine::FinishReason::kStop:
      return json{{"type", "stop"}, {"matched", result.stop_reason}};
    case engine::FinishReason::kLength:
      return json{{"type", "length"}, {"length", result.token_ids.size()}};
    case engine::FinishReason::kAbort:
      return json{{"type", "abort"}, {"message", "aborted"}};
    case engine::FinishReason::kError:
      return json{{"type", "abort"}, {"message", "error"}};
    case engine::FinishReason::kNone:
      return nullptr;
  }
  return nullptr;
}

json generate_response(const ResponseContext& context, const std::vector<ChoiceResult>& choices,
                       double e2e_latency_s) {
  const ApiRequest& request = context.request;
  json items = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& result = choices[i];
    const PromptInput& prompt = prompt_of(request, i);
    json meta = {{"id", choices.size() > 1 ? fmt::format("{}-{}", context.id, i) : context.id},
                 {"finish_reason", sglang_finish_reason(result)},
                 {"prompt_tokens", prompt.ids.size()},
                 {"completion_tokens", result.token_ids.size()},
                 {"cached_tokens", result.cached_prompt_tokens},
                 {"e2e_latency", e2e_latency_s}};
    if (request.return_logprob) {
      json output = json::array();
      for (const engine::TokenLogprob& lp : result.logprobs)
        output.push_back({lp.logprob, lp.token_id, nullptr});
      meta["output_token_logprobs"] = std::move(output);
      if (request.sampling.prompt_logprobs >= 0) {
        json input = json::array();
        input.push_back(
            {nullptr, prompt.ids.empty() ? json(nullptr) : json(prompt.ids[0]), nullptr});
        for (const engine::TokenLogprob& lp : result.prompt_logprobs)
          input.push_back({lp.logprob, lp.token_id, nullptr});
        meta["input_token_logprobs"] = std::move(input);
      }
    }
    if (request.routes.return_routes && request.routes.stream && result.chunk_routes) {
      add_route_fields(*result.chunk_routes, request.routes, context.model.num_experts, true, true,
                       meta);
    } else if (request.routes.return_routes && result.routes && !request.routes.stream) {
      add_route_fields(*result.routes, request.routes, context.model.num_experts, true, false,
                       meta);
    }
    items.push_back(
        {{"text", result.text}, {"output_ids", result.token_ids}, {"meta_info", std::move(meta)}});
  }
  if (items.size() == 1 && !request.batch_input) return items[0];
  return items;
}

json completion_chunk(const ResponseContext& context, int index, const std::string& text,
                      const std::vector<int32_t>& token_ids,
                      const std::vector<engine::TokenLogprob>& logprobs, int64_t text_offset,
                      const ChoiceResult* final, const moe::RouteArray* routes) {
  const ApiRequest& request = context.request;
  json choice = {{"index", index}, {"text", text}};
  choice["logprobs"] = request.sampling.logprobs >= 0
                           ? completion_logprobs(context, logprobs, text_offset)
                           : json(nullptr);
  if (final) {
    add_final_fields(context, *final, choice);
  } else {
    choice["finish_reason"] = nullptr;
    choice["stop_reason"] = nullptr;
  }
  add_chunk_routes(context, routes, choice);
  if (request.return_token_ids) choice["token_ids"] = token_ids;
  return json{{"id", context.id},
              {"object", "text_completion"},
              {"created", context.created},
              {"model", context.config.served_model_name},
              {"choices", json::array({std::move(choice)})}};
}

json chat_chunk(const ResponseContext& context, int index, bool first, const std::string& text,
                const std::vector<int32_t>& token_ids,
                const std::vector<engine::TokenLogprob>& logprobs, const ChoiceResult* final,
                const moe::RouteArray* routes) {
  const ApiRequest& request = context.request;
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  delta["content"] = text;
  json choice = {{"index", index}, {"delta", std::move(delta)}};
  choice["logprobs"] = request.sampling.logprobs >= 0 && !logprobs.empty()
                           ? chat_logprobs(context, logprobs)
                           : json(nullptr);
  if (final) {
    add_final_fields(context, *final, choice);
  } else {
    choice["finish_reason"] = nullptr;
  }
  add_chunk_routes(context, routes, choice);
  if (request.return_token_ids) choice["token_ids"] = token_ids;
  return json{{"id", context.id},
              {"object", "chat.completion.chunk"},
              {"created", context.created},
              {"model", context.config.served_model_name},
              {"choices", json::array({std::move(choice)})}};
}

json usage_chunk(const ResponseContext& context, const json& usage) {
  bool chat = context.request.endpoint == Endpoint::kChat;
  return json{
      {"id", context.id},           {"object", chat ? "chat.completion.chunk" : "text_completion"},
      {"created", context.created}, {"model", context.config.served_model_name},
      {"choices", json::array()},   {"usage", usage}};
}

json models_response(const ServerConfig& config, const engine::ModelInfo& model, int64_t created) {
  json card = {
      {"id", config.served_model_name},
      {"object", "model"},
      {"created", created},
      {"owned_by", "switchyard"},
      {"root", config.model_dir},
      {"parent", nullptr},
      {"max_model_len", model.max_model_len},
      {"architecture", model.architecture},
      {"num_hidden_layers", model.num_hidden_layers},
      {"moe_layers", model.moe_layers},
      {"num_experts", model.num_experts},
      {"top_k", model.top_k},
      {"routed_experts", config.enable_return_routed_experts},
      {"routed_experts_weights", config.enable_return_routed_experts && model.route_weights},
      {"permission", json::array()}};
  return json{{"object", "list"}, {"data", json::array({std::move(card)})}};
}

}  // namespace sy::server
