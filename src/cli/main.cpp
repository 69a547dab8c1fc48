// `switchyard`: one binary, one subcommand per job (DESIGN.md, cli/).
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Switchyard: MoE inference engine with exact routed-expert capture and replay"};
  app.require_subcommand(1);
  int exit_code = 0;
  sy::cli::add_make_model_command(app, exit_code);
  sy::cli::add_generate_command(app, exit_code);
  sy::cli::add_inspect_command(app, exit_code);
  sy::cli::add_tokenize_command(app, exit_code);
  sy::cli::add_render_chat_command(app, exit_code);
  sy::cli::add_serve_command(app, exit_code);
  sy::cli::add_bench_command(app, exit_code);
  sy::cli::add_routes_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
