// Small helpers shared by the subcommands.
#pragma once

#include <string>

#include "util/status.h"

namespace sy::cli {

// The Qwen3 tokenizer files installed by scripts/setup.sh (deps/ beside the build folder or the
// current folder); empty when not found. SWITCHYARD_TOKENIZER_DIR overrides.
std::string default_tokenizer_dir();

// Renders chat messages (a JSON array, or an object with "messages", "tools",
// "chat_template_kwargs") with the model's own chat template, add_generation_prompt true.
Result<std::string> render_chat_prompt(const std::string& model_dir, const std::string& messages_json);

}  // namespace sy::cli
