#include "chat/chat_template.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "chat/parser.h"

namespace sy::chat {
namespace {

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::errorf("cannot read {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} (AddedToken) or null.
Result<std::optional<std::string>> token_text(const nlohmann::ordered_json& config,
                                              const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string())
      return std::optional<std::string>(content->get<std::string>());
  }
  return Status::errorf(
      "tokenizer_config.json: {} must be a string or an AddedToken object with \"content\"", key);
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse_with_tokens(
    const std::string& source, std::vector<std::pair<std::string, std::string>> special_tokens) {
  auto tokens = lex(source);
  if (!tokens) return tokens.status().with_context("chat template: ");
  auto body = chat::parse(std::move(*tokens));
  if (!body) return body.status().with_context("chat template: ");
  ChatTemplate t;
  t.source_ = source;
  t.body_ = std::make_shared<const Body>(std::move(*body));
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

Result<ChatTemplate> ChatTemplate::parse(const std::string& source, std::string bos_token,
                                         std::string eos_token) {
  return parse_with_tokens(
      source, {{"bos_token", std::move(bos_token)}, {"eos_token", std::move(eos_token)}});
}

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  const fs::path jinja_path = dir / "chat_template.jinja";
  std::error_code ec;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_path, ec)) {
    SY_ASSIGN(std::string text, read_file(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return Status::errorf("{}: not a JSON object", config_path.string());
  }
  std::optional<std::string> source;
  if (fs::exists(jinja_path, ec)) {
    SY_ASSIGN(std::string text, read_file(jinja_path));
    source = std::move(text);
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      std::vector<std::string> names;
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          return Status::errorf(
              "{}: chat_template list entries must be {{\"name\", \"template\"}} objects",
              config_path.string());
        names.push_back(entry["name"].get<std::string>());
        if (names.back() == "default") source = entry["template"].get<std::string>();
      }
      if (!source)
        return Status::errorf("{}: chat_template list has no \"default\" entry (has: {})",
                              config_path.string(), fmt::join(names, ", "));
    } else {
      return Status::errorf("{}: chat_template must be a string or a list of {{name, template}}",
                            config_path.string());
    }
  }
  if (!source)
    return Status::errorf(
        "{}: no chat template (no chat_template.jinja, and tokenizer_config.json has no "
        "chat_template)",
        model_dir);
  std::vector<std::pair<std::string, std::string>> special;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto text = token_text(config, key);
    if (!text) return text.status().with_context(config_path.string() + ": ");
    if (*text) special.emplace_back(key, **text);
  }
  auto parsed = parse_with_tokens(*source, std::move(special));
  if (!parsed)
    return parsed.status().with_context(
        (fs::exists(jinja_path, ec) ? jinja_path : config_path).string() + ": ");
  return parsed;
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages,
                                         const nlohmann::json& tools, bool add_generation_prompt,
                                         const nlohmann::json& extra_kwargs) const {
  return render_ordered(nlohmann::ordered_json(messages), nlohmann::ordered_json(tools),
                        add_generation_prompt, nlohmann::ordered_json(extra_kwargs));
}

Result<std::string> ChatTemplate::render_ordered(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& extra_kwargs,
                                                 const RenderOptions& options) const {
  if (!messages.is_array()) return Status::error("messages must be an array of message objects");
  if (messages.empty())
    return Status::error(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  if (!tools.is_null() && !tools.is_array()) return Status::error("tools must be an array or null");
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object())
    return Status::error("chat_template_kwargs must be an object or null");

  auto globals = std::make_shared<Scope>(nullptr);
  add_globals(*globals);
  auto context = std::make_shared<Scope>(globals);
  for (const auto& [name, text] : special_tokens_) context->vars[name] = Value::from_string(text);
  if (extra_kwargs.is_object()) {
    for (const auto& [key, value] : extra_kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "documents" ||
          key == "add_generation_prompt")
        return Status::errorf(
            "chat_template_kwargs may not set '{}' (it is a parameter of its own)", key);
      auto converted = from_json(value);
      if (!converted)
        return converted.status().with_context(fmt::format("chat_template_kwargs.{}: ", key));
      context->vars[key] = std::move(*converted);
    }
  }
  auto converted_messages = from_json(messages);
  if (!converted_messages) return converted_messages.status().with_context("messages: ");
  context->vars["messages"] = std::move(*converted_messages);
  auto converted_tools = from_json(tools);
  if (!converted_tools) return converted_tools.status().with_context("tools: ");
  context->vars["tools"] = std::move(*converted_tools);
  context->vars["documents"] = Value::none();
  context->vars["add_generation_prompt"] = Value::from_bool(add_generation_prompt);

  Renderer renderer(limits_, options.now);
  std::string out;
  Status status = renderer.render(*body_, context, out);
  if (!status.is_ok()) return status.with_context("chat template: ");
  return out;
}

}  // namespace sy::chat
