#include "loadgen/api.h"

#include <nlohmann/json.hpp>

namespace sy::loadgen {

using nlohmann::json;

Result<Endpoint> parse_endpoint(std::string_view name) {
  if (name == "completions" || name == "/v1/completions") return Endpoint::kCompletions;
  if (name == "chat" || name == "/v1/chat/completions") return Endpoint::kChat;
  if (name == "generate" || name == "/generate") return Endpoint::kGenerate;
  return Status::errorf("--endpoint: unknown '{}'; valid: completions, chat, generate", name);
}

std::string_view endpoint_name(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kCompletions: return "completions";
    case Endpoint::kChat: return "chat";
    case Endpoint::kGenerate: return "generate";
  }
  return "?";
}

std::string_view endpoint_path(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kCompletions: return "/v1/completions";
    case Endpoint::kChat: return "/v1/chat/completions";
    case Endpoint::kGenerate: return "/generate";
  }
  return "/";
}

Result<std::string> build_request_body(Endpoint endpoint, const DatasetRequest& request,
                                       bool text_prompt, const RequestOptions& options) {
  json body;
  switch (endpoint) {
    case Endpoint::kCompletions:
      body["model"] = options.model;
      if (text_prompt) {
        body["prompt"] = request.prompt_text;
      } else {
        body["prompt"] = request.prompt_ids;
      }
      body["max_tokens"] = request.expected_output_len;
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
      if (options.ignore_eos) body["ignore_eos"] = true;
      if (options.routed_experts || options.routed_experts_off) {
        body["return_routed_experts"] = options.routed_experts;
      }
      break;
    case Endpoint::kChat:
      if (!text_prompt) {
        return Status::error(
            "--endpoint chat sends text: it needs a tokenizer (--tokenizer DIR) to make prompts");
      }
      body["model"] = options.model;
      body["messages"] = json::array({{{"role", "user"}, {"content", request.prompt_text}}});
      body["max_completion_tokens"] = request.expected_output_len;
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
      if (options.ignore_eos) body["ignore_eos"] = true;
      if (options.routed_experts || options.routed_experts_off) {
        body["return_routed_experts"] = options.routed_experts;
      }
      break;
    case Endpoint::kGenerate: {
      if (text_prompt) {
        body["text"] = request.prompt_text;
      } else {
        body["input_ids"] = request.prompt_ids;
      }
      json sampling = {{"max_new_tokens", request.expected_output_len}};
      if (options.ignore_eos) sampling["ignore_eos"] = true;
      body["sampling_params"] = sampling;
      body["stream"] = true;
      if (options.routed_experts || options.routed_experts_off) {
        body["return_routed_experts"] = options.routed_experts;
      }
      break;
    }
  }
  return body.dump();
}

namespace {

std::optional<int> int_field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int>();
}

std::string error_text(const json& error) {
  if (error.is_object() && error.contains("message") && error["message"].is_string()) {
    return error["message"].get<std::string>();
  }
  return error.dump();
}

}  // namespace

Result<bool> StreamReader::on_data(std::string_view data) {
  if (data == "[DONE]") {
    saw_done_ = true;
    return false;
  }
  json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object()) {
    return Status::errorf("stream chunk is not a JSON object: {}", data.substr(0, 200));
  }
  if (auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
    return Status::errorf("server error in stream: {}", error_text(*error));
  }

  if (endpoint_ == Endpoint::kGenerate) {  // SGLang: cumulative text + meta_info per chunk
    if (auto text = chunk.find("text"); text != chunk.end() && text->is_string()) {
      text_ = text->get<std::string>();
    }
    if (auto meta = chunk.find("meta_info"); meta != chunk.end() && meta->is_object()) {
      if (auto value = int_field(*meta, "prompt_tokens")) prompt_tokens_ = value;
      if (auto value = int_field(*meta, "completion_tokens")) completion_tokens_ = value;
      if (auto routes = meta->find("routed_experts"); routes != meta->end() && routes->is_string()) {
        routed_experts_ = routes->get<std::string>();
      }
    }
    ++choice_chunks_;
    return true;
  }

  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    if (auto value = int_field(*usage, "prompt_tokens")) prompt_tokens_ = value;
    if (auto value = int_field(*usage, "completion_tokens")) completion_tokens_ = value;
  }
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return false;
  const json& choice = (*choices)[0];
  if (!choice.is_object()) return Status::error("stream chunk: choices[0] is not an object");
  if (endpoint_ == Endpoint::kChat) {
    if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
      if (auto content = delta->find("content"); content != delta->end() && content->is_string()) {
        text_ += content->get<std::string>();
      }
    }
  } else if (auto text = choice.find("text"); text != choice.end() && text->is_string()) {
    text_ += text->get<std::string>();
  }
  if (auto routes = choice.find("routed_experts"); routes != choice.end() && routes->is_string()) {
    routed_experts_ = routes->get<std::string>();
  }
  ++choice_chunks_;
  return true;
}

}  // namespace sy::loadgen
