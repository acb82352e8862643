// Runs a shell command and captures its output and exit code (for CLI tests).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
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

// The moejit CLI of this build tree (tests/<binary> -> tools/moejit/moejit), found relative to
// the running test binary so a build tree copied elsewhere still works.
inline std::string cli() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "tools" / "moejit" / "moejit")
      .string();
}

}  // namespace moejit::test
