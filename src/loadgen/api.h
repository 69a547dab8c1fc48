// The wire of the endpoints `switchyard bench` drives: request bodies and the meaning of each
// streamed chunk for OpenAI completions / chat completions (vLLM's API) and SGLang's /generate.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "loadgen/dataset.h"
#include "util/status.h"

namespace sy::loadgen {

enum class Endpoint { kCompletions, kChat, kGenerate };

// "completions" | "chat" | "generate" (or the paths /v1/completions, /v1/chat/completions,
// /generate).
Result<Endpoint> parse_endpoint(std::string_view name);
std::string_view endpoint_name(Endpoint endpoint);
std::string_view endpoint_path(Endpoint endpoint);

struct RequestOptions {
  std::string model;  // not sent to /generate
  bool ignore_eos = false;
  bool routed_experts = false;  // ask for `return_routed_experts`
  // Send `return_routed_experts: false` explicitly (a server started with
  // --return-routed-experts-default, or another engine, may default it to true, so an A/B spells
  // the "off" side out).
  bool routed_experts_off = false;
};

// The JSON body of one streaming request. Text prompts use prompt_text; otherwise the ids are
// sent (`prompt: [ids]` for completions, `input_ids` for /generate; chat needs text).
Result<std::string> build_request_body(Endpoint endpoint, const DatasetRequest& request,
                                       bool text_prompt, const RequestOptions& options);

// Reads one response stream's `data:` payloads in order.
class StreamReader {
 public:
  explicit StreamReader(Endpoint endpoint) : endpoint_(endpoint) {}
  // True when this payload carries a choice (vLLM times such chunks: the first is TTFT, each
  // later one adds an ITL gap); false for usage-only chunks and `[DONE]`. An error payload or
  // malformed JSON is an error.
  Result<bool> on_data(std::string_view data);

  bool saw_done() const { return saw_done_; }
  const std::string& text() const { return text_; }
  std::optional<int> prompt_tokens() const { return prompt_tokens_; }
  std::optional<int> completion_tokens() const { return completion_tokens_; }
  // The base64 route payload: a .npy (choices[0].routed_experts) or flat int32
  // (meta_info.routed_experts of /generate).
  const std::optional<std::string>& routed_experts() const { return routed_experts_; }
  int choice_chunks() const { return choice_chunks_; }

 private:
  Endpoint endpoint_;
  bool saw_done_ = false;
  std::string text_;
  std::optional<int> prompt_tokens_, completion_tokens_;
  std::optional<std::string> routed_experts_;
  int choice_chunks_ = 0;
};

}  // namespace sy::loadgen
