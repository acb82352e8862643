// The CLI's subcommands. Each parses its own options from argv[start..) and returns the exit
// code; errors propagate as moejit::Error and main() prints them. main() answers -h/--help.
#pragma once

#include <cstdio>
#include <string>

namespace moejit::cli {

int run_info(int argc, char** argv, int start);
int run_compile(int argc, char** argv, int start);
int run_db(int argc, char** argv, int start);
int run_cache(int argc, char** argv, int start);
int run_plan(int argc, char** argv, int start);
int run_tune(int argc, char** argv, int start);
int run_grid(int argc, char** argv, int start);
int run_bench(int argc, char** argv, int start);

// What `moejit <command> --help` prints (main.cpp); `command` is one of the names above.
void print_usage(const char* command, std::FILE* out);

// The exit code of a command with subcommands given none it knows: "help" prints its usage (0);
// anything else is named, then the usage goes to stderr (2).
int help_or_unknown_subcommand(const char* command, const std::string& sub);

}  // namespace moejit::cli
