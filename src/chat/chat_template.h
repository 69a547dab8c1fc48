// A model's own chat_template, rendered byte-for-byte as transformers' apply_chat_template does
// (Python jinja2, trim_blocks + lstrip_blocks, transformers' tojson / raise_exception /
// strftime_now). The supported subset is listed in docs/chat-templates.md; anything else fails at
// load time naming the construct, or at render time with a message, never as a different prompt.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/renderer.h"
#include "util/status.h"

namespace sy::chat {

struct RenderOptions {
  std::optional<std::tm> now;  // what strftime_now sees (default: the local time at render)
};

class ChatTemplate {
 public:
  // From model_dir: chat_template.jinja when present (it wins, as in transformers), else
  // tokenizer_config.json "chat_template" (a string, or a list of {name, template}: "default").
  // bos/eos/unk/pad tokens from tokenizer_config.json (string or AddedToken object; null = absent,
  // so `bos_token is defined` is false as under transformers).
  static Result<ChatTemplate> load(const std::string& model_dir);
  static Result<ChatTemplate> parse(const std::string& source, std::string bos_token,
                                    std::string eos_token);
  // As parse(), with any set of special-token variables (name -> text).
  static Result<ChatTemplate> parse_with_tokens(
      const std::string& source, std::vector<std::pair<std::string, std::string>> special_tokens);

  // messages: OpenAI-style array (non-empty, as transformers requires); tools: array or null;
  // extra_kwargs: chat_template_kwargs (object or null), e.g. {"enable_thinking": false}.
  // nlohmann::json sorts object keys, so `tojson` of a tool prints keys alphabetically; use
  // render_ordered with nlohmann::ordered_json to keep the client's key order (as Python does).
  Result<std::string> render(const nlohmann::json& messages, const nlohmann::json& tools,
                             bool add_generation_prompt,
                             const nlohmann::json& extra_kwargs) const;  // thread-safe (const)
  Result<std::string> render_ordered(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
      const RenderOptions& options = {}) const;  // thread-safe (const)

  const std::string& source() const { return source_; }
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const {
    return special_tokens_;
  }
  void set_limits(const RenderLimits& limits) { limits_ = limits; }

 private:
  std::string source_;
  std::shared_ptr<const Body> body_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
  RenderLimits limits_;
};

}  // namespace sy::chat
