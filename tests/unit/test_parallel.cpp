// core/parallel: every job runs once, also where no worker thread can start or a job throws.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
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

namespace {

// One job on the caller's thread (or on a helper thread) throws; the jobs on the other kind of
// thread wait (10 s at most) until it has, so that both kinds take a job whatever the scheduling.
void check_rethrows_after_all_jobs(bool throw_on_caller) {
  const std::thread::id caller = std::this_thread::get_id();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::atomic<int>> runs(200);
  std::atomic<bool> thrown{false};
  std::string caught;
  try {
    parallel_for(runs.size(), 4, [&](std::size_t i) {
      runs[i].fetch_add(1);
      if ((std::this_thread::get_id() == caller) == throw_on_caller) {
        if (!thrown.exchange(true)) throw std::runtime_error("job failed");
        return;
      }
      while (!thrown.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    });
  } catch (const std::runtime_error& e) {
    caught = e.what();
  }
  CHECK(caught == "job failed");
  for (const auto& r : runs) CHECK(r.load() == 1);  // the other jobs all ran, the thrower's included
}

}  // namespace

TEST_CASE("parallel_for rethrows a helper thread's exception once every job has run", "[parallel]") {
  check_rethrows_after_all_jobs(false);
}

TEST_CASE("parallel_for rethrows the caller's own exception once every job has run", "[parallel]") {
  check_rethrows_after_all_jobs(true);
}

TEST_CASE("parallel_for rethrows the first of several exceptions", "[parallel]") {
  std::vector<int> runs(10, 0);  // one worker: the jobs run in order on the caller's thread
  std::string caught;
  try {
    parallel_for(runs.size(), 1, [&](std::size_t i) {
      ++runs[i];
      if (i == 3 || i == 7) throw std::runtime_error("job " + std::to_string(i));
    });
  } catch (const std::runtime_error& e) {
    caught = e.what();
  }
  CHECK(caught == "job 3");
  for (int r : runs) CHECK(r == 1);
}
