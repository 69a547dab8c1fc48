// libFuzzer target for the chat-template lexer, parser and renderer: any bytes as a template
// source must give a Status (never a crash, hang or unbounded allocation). Sources that parse are
// rendered over a small conversation under tight limits. Seeds: tests/chat/features and
// tests/chat/models/*/ (real templates).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string source(reinterpret_cast<const char*>(data), size);
  // A tokenizer_config.json seed: fuzz the template it carries as well.
  auto config = nlohmann::ordered_json::parse(source, nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.contains("chat_template") && config["chat_template"].is_string())
    source = config["chat_template"].get<std::string>();
  auto parsed = sy::chat::ChatTemplate::parse(source, "<s>", "</s>");
  if (!parsed) return 0;
  sy::chat::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 20'000;
  limits.max_steps = 200'000;
  limits.max_list_items = 20'000;
  parsed->set_limits(limits);
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <think>x</think> \u00e9"},
    {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
    {"role": "tool", "content": "{\"r\": 1}"},
    {"role": "user", "content": ""}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}])");
  std::tm now{};
  now.tm_year = 124;
  now.tm_mday = 1;
  sy::chat::RenderOptions options;
  options.now = now;
  auto rendered =
      parsed->render_ordered(messages, tools, true, {{"enable_thinking", false}}, options);
  if (rendered && rendered->size() > limits.max_output_bytes) __builtin_trap();
  return 0;
}
