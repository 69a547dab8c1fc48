// Small helpers shared by the subcommands.
#pragma once

#include <string>

namespace sy::cli {

// The Qwen3 tokenizer files installed by scripts/setup.sh (deps/ beside the build folder or the
// current folder); empty when not found. SWITCHYARD_TOKENIZER_DIR overrides.
std::string default_tokenizer_dir();

}  // namespace sy::cli
