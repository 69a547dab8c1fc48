// `switchyard render-chat --model DIR`: reads {"messages", "tools", "add_generation_prompt",
// "chat_template_kwargs"} as JSON on stdin and prints the prompt the model's own chat template
// renders (exactly as transformers' apply_chat_template would), with no trailing newline added.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "cli/commands.h"

namespace sy::cli {
namespace {

struct RenderChatOptions {
  std::string model_dir;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "switchyard render-chat: %s\n", message.c_str());
  return 1;
}

int run_render_chat(const RenderChatOptions& options) {
  auto loaded = chat::ChatTemplate::load(options.model_dir);
  if (!loaded) return fail(loaded.message());
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  // ordered_json keeps the client's key order, which `tojson` of tools and arguments prints.
  const auto request = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object())
    return fail(
        "stdin must be one JSON object {\"messages\": [...], \"tools\": [...], "
        "\"add_generation_prompt\": "
        "true, \"chat_template_kwargs\": {...}}");
  for (const auto& [key, value] : request.items()) {
    if (key != "messages" && key != "tools" && key != "add_generation_prompt" &&
        key != "chat_template_kwargs")
      return fail("unknown field '" + key +
                  "' (valid: messages, tools, add_generation_prompt, chat_template_kwargs)");
  }
  if (!request.contains("messages")) return fail("missing 'messages'");
  bool add_generation_prompt = true;
  if (request.contains("add_generation_prompt")) {
    if (!request["add_generation_prompt"].is_boolean())
      return fail("add_generation_prompt must be true or false");
    add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  const nlohmann::ordered_json tools =
      request.contains("tools") ? request["tools"] : nlohmann::ordered_json();
  const nlohmann::ordered_json kwargs = request.contains("chat_template_kwargs")
                                            ? request["chat_template_kwargs"]
                                            : nlohmann::ordered_json();
  auto rendered = loaded->render_ordered(request["messages"], tools, add_generation_prompt, kwargs);
  if (!rendered) return fail(rendered.message());
  std::cout << *rendered;
  std::cout.flush();
  return 0;
}

}  // namespace

void add_render_chat_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<RenderChatOptions>();
  auto* command = app.add_subcommand(
      "render-chat",
      "Render a conversation (JSON on stdin) with the model's chat template, as transformers does");
  command
      ->add_option("--model", options->model_dir,
                   "Folder with tokenizer_config.json (chat_template, special tokens) and/or "
                   "chat_template.jinja")
      ->required();
  command->callback([options, &exit_code] { exit_code = run_render_chat(*options); });
}

}  // namespace sy::cli
