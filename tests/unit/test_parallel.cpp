// core/parallel: every job runs once, also where no worker thread can start.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "core/parallel.hpp"

using namespace moejit;

TEST_CASE("parallel_for runs every job once", "[parallel]") {
  std::vector<std::atomic<int>> runs(1000);
  parallel_for(runs.size(), 8, [&](std::size_t i) { runs[i].fetch_add(1); });
  for (const auto& r : runs) CHECK(r.load() == 1);
}

TEST_CASE("parallel_for runs every job when no thread can start", "[parallel]") {
  if (::geteuid() != 0) {
    WARN("SKIPPED (needs root): the case drops to uid 65534 in a child so that RLIMIT_NPROC binds");
    return;
  }
  // The child becomes a user with no processes and a limit of one: each std::thread throws.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const rlimit one{1, 1};
    if (::setgid(65534) != 0 || ::setuid(65534) != 0 || ::setrlimit(RLIMIT_NPROC, &one) != 0) ::_exit(2);
    std::vector<int> runs(100, 0);  // one thread runs them all, so no atomics
    parallel_for(runs.size(), 8, [&](std::size_t i) { ++runs[i]; });
    for (int r : runs) {
      if (r != 1) ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));  // std::terminate would end it by SIGABRT
  CHECK(WEXITSTATUS(status) == 0);
}
