// `switchyard`: one binary, one subcommand per job (DESIGN.md, cli/).
#include "cli/commands.h"

int main(int argc, char** argv) {
  // Every rank of `mpirun -np N switchyard ...` runs this; a plain run is a world of one.
  const sy::dist::MpiWorld world = sy::dist::mpi_init(&argc, &argv);
  CLI::App app{"Switchyard: MoE inference engine with exact routed-expert capture and replay"};
  app.require_subcommand(1);
  int exit_code = 0;
  sy::cli::add_make_model_command(app, exit_code);
  sy::cli::add_generate_command(app, exit_code, world);
  sy::cli::add_inspect_command(app, exit_code);
  sy::cli::add_tokenize_command(app, exit_code);
  sy::cli::add_render_chat_command(app, exit_code);
  sy::cli::add_serve_command(app, exit_code, world);
  sy::cli::add_bench_command(app, exit_code);
  sy::cli::add_routes_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit_code = app.exit(e);
  }
  // A rank that fails must end the job: the others may be waiting on it in a collective.
  if (exit_code != 0 && world.size > 1) sy::dist::mpi_abort(world, exit_code);
  sy::dist::mpi_finalize(world);
  return exit_code;
}
