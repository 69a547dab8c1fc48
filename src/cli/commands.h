// The subcommands of the one `switchyard` binary; each registers itself on the CLI11 app and
// returns the exit code through the callback it installs.
#pragma once

#include <CLI/CLI.hpp>

#include "dist/mpi_communicator.h"

namespace sy::cli {

// Each adds one subcommand to `app`. `exit_code` receives the subcommand's exit status.
void add_make_model_command(CLI::App& app, int& exit_code);
// generate and serve run as every rank of a parallel run (`world`, from mpi_init).
void add_generate_command(CLI::App& app, int& exit_code, const dist::MpiWorld& world);
void add_inspect_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_render_chat_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code, const dist::MpiWorld& world);
void add_bench_command(CLI::App& app, int& exit_code);
void add_routes_command(CLI::App& app, int& exit_code);

}  // namespace sy::cli
