// libFuzzer: the API end to end over the real engine — the Server with the model's own codec (a
// tiny Qwen3-MoE golden checkpoint's tokenizer, the real Qwen3 chat template) in front of a CPU
// engine capturing routes. http_fuzz runs the HTTP layer over a fake engine; this target is for
// what only the real one does: sampling options, logprobs, penalties, stops, n, streaming, route
// capture and replay, chat rendering and tools, all reaching the scheduler and the forward pass.
// Every reply must be HTTP/1.1 with an OpenAI-shaped error body where it fails, no reply may be a
// 5xx, and /health must answer 200 after every input.
//
// Input: byte 0 picks one of four rich request bodies (a completion, a streamed chat completion
// with tools and logprobs, SGLang's /generate, a completion with a route replay (a base64 .npy
// of two rows; layer 1 of this model is dense) and prompt logprobs); the rest is edits of it
// (fuzz/json_edits.h), so mutations reach the checks behind the JSON parser instead of breaking its
// syntax.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../tests/server/http_client.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "http_checks.h"
#include "json_edits.h"
#include "server/model_codec.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

const std::string kModelDir =
    std::string(SY_SOURCE_DIR) + "/tests/golden/hf_qwen3_moe/qwen3moe_dense_nonorm";

struct Body {
  const char* path;
  json doc;
  std::vector<json::json_pointer> nodes;
};

std::vector<Body> bodies() {
  std::vector<Body> out;
  out.push_back({"/v1/completions",
                 json::parse(R"({
    "model": "tiny", "prompt": "Hello world, route me", "max_tokens": 8, "temperature": 0.7,
    "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 3, "n": 2, "logprobs": 2, "echo": false,
    "stop": ["x", "yz"], "stop_token_ids": [5], "presence_penalty": 0.5, "frequency_penalty": 0.2,
    "repetition_penalty": 1.1, "logit_bias": {"7": 2.0, "9": -100}, "min_tokens": 1,
    "ignore_eos": true, "return_routed_experts": true, "include_stop_str_in_output": false,
    "skip_special_tokens": true, "stream": false, "user": "u"})"),
                 {}});
  out.push_back({"/v1/chat/completions",
                 json::parse(R"({
    "model": "tiny", "messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": "ok", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}, {"role": "user", "content": "again"}],
    "max_completion_tokens": 6, "logprobs": true, "top_logprobs": 2, "stream": true,
    "stream_options": {"include_usage": true}, "return_routed_experts": true,
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "tool_choice": "none", "n": 1, "seed": 1, "temperature": 0, "response_format": {"type": "text"},
    "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": true,
    "continue_final_message": false})"),
                 {}});
  out.push_back({"/generate",
                 json::parse(R"({
    "text": "hello there", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "top_k": 3,
      "stop": ["q"], "min_new_tokens": 1, "n": 1}, "return_routed_experts": true, "stream": false,
    "return_logprob": true, "top_logprobs_num": 2})"),
                 {}});
  out.push_back({"/v1/completions",
                 json::parse(R"({
    "model": "tiny", "prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 3, "temperature": 0,
    "prompt_logprobs": 1, "return_routed_experts": true,
    "routed_experts_replay": "k05VTVBZAQB2AHsnZGVzY3InOiAnfHUxJywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDIsIDQsIDQpLCB9ICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoAAQIDAAAAAAECAwQFBgcAAQIDBAAAAAADBAUGBAUGBw=="})"),
                 {}});
  for (Body& body : out) body.nodes = sy::fuzz::json_nodes(body.doc);
  return out;
}

struct Harness {
  std::vector<Body> bodies = ::bodies();
  std::unique_ptr<sy::engine::Engine> engine;
  std::unique_ptr<sy::server::ModelCodec> codec;
  std::unique_ptr<sy::server::Server> server;
  uint16_t port = 0;

  Harness() {
    sy::engine::EngineConfig config;
    config.model_dir = kModelDir;
    config.capture_routes = true;
    config.num_threads = 1;
    config.kv_cache_tokens = 16 * 256;
    config.max_model_len = 1024;  // bounds every request's work (the chat body renders ~700 tokens)
    config.max_num_batched_tokens = 64;
    auto created = sy::engine::create_engine(config);
    if (!created.is_ok()) {
      std::fprintf(stderr, "serve_fuzz set-up: %s\n", created.message().c_str());
      std::abort();
    }
    engine = std::move(created).value();
    auto tokenizer = sy::tokenizer::Tokenizer::load(kModelDir);
    auto chat =
        sy::chat::ChatTemplate::load(std::string(SY_SOURCE_DIR) + "/tests/chat/models/qwen3");
    if (!tokenizer.is_ok() || !chat.is_ok()) std::abort();
    codec = std::make_unique<sy::server::ModelCodec>(std::move(tokenizer).value(),
                                                     std::move(chat).value(), "");
    sy::server::ServerConfig server_config;
    server_config.port = 0;
    server_config.served_model_name = "tiny";
    server_config.model_dir = kModelDir;
    server_config.enable_return_routed_experts = true;
    server_config.max_request_bytes = 1 << 20;
    server = std::make_unique<sy::server::Server>(server_config);
    if (!server->start()) std::abort();
    server->attach(*engine, *codec);
    port = server->port();
  }
};

Harness& harness() {
  static Harness* h = new Harness();  // never destroyed: libFuzzer exits without unwinding
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Harness& h = harness();
  static const std::vector<std::string> words = {
      "auto",     "none", "required",  "text",     "json_object",  "json_schema",
      "function", "user", "assistant", "system",   "tool",         "developer",
      "length",   "stop", "",          "\xff\xfe", "<|im_start|>", "<think>"};
  const Body& base = h.bodies[data[0] % h.bodies.size()];
  const std::string body =
      sy::fuzz::apply_json_edits(base.doc, base.nodes, words, data + 1, size - 1)
          .dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string request = sy::fuzz::with_body(base.path, body, false, 0);
  const int fd = sy::testing::connect_to(h.port, 30);
  if (fd < 0) std::abort();
  sy::testing::send_all(fd, request);
  const std::string reply = sy::testing::read_all(fd);
  ::close(fd);
  if (std::getenv("SY_SERVE_FUZZ_TRACE"))  // the start of each reply (run the seeds with it)
    std::fprintf(stderr, "serve_fuzz %s: %s\n", base.path, reply.substr(0, 400).c_str());
  sy::fuzz::check_responses(reply, /*no_server_errors=*/true);
  if (sy::testing::http_call(h.port, "GET", "/health").status != 200) {
    std::fprintf(stderr, "/health failed after the input\n");
    std::abort();
  }
  return 0;
}
