// Runs a shell command and captures its output and exit code (for CLI tests).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace moejit::test {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline ProcessResult run_command(const std::string& command) {
  ProcessResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string cli() { return MOEJIT_CLI_PATH; }

}  // namespace moejit::test
