// `switchyard render-chat`: placeholder until its owner lands it; exits 2 so nobody mistakes it for done.
#include <cstdio>

#include "cli/commands.h"

namespace sy::cli {

void add_render_chat_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("render-chat", "(not implemented yet)");
  command->allow_extras();
  command->callback([&exit_code] {
    std::fprintf(stderr, "switchyard render-chat: not implemented yet\n");
    exit_code = 2;
  });
}

}  // namespace sy::cli
