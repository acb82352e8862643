// Runs code as another user, for what file permissions decide (a database another user owns, a
// folder this process cannot write). Root ignores permissions, so as root each side runs in a child
// process that drops to a user of its own; otherwise both sides are this user, in child processes
// too, and a test makes a file or folder read-only with chmod while the reading side runs.
#pragma once

#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace moejit::test {

// Users no one else is expected to run as; as root only.
inline constexpr uid_t kOwnerUid = 4242;
inline constexpr uid_t kReaderUid = 4243;

inline bool running_as_root() { return ::geteuid() == 0; }

// Fails a check inside a child process: the child's body throws, run_as_user reports it.
inline void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

// Runs `body` in a child process, as `uid` (and group `uid`, no other groups) when given. Returns
// the child's exit code: 0 when body returned, 1 when it threw (its message on stderr), 2 when the
// user could not be taken (a user namespace that does not map it). The child leaves with _exit,
// after body's own destructors but none of the test's.
inline int run_as_user(std::optional<uid_t> uid, const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (uid && (::setgroups(0, nullptr) != 0 || ::setgid(*uid) != 0 || ::setuid(*uid) != 0)) ::_exit(2);
    try {
      body();
      ::_exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child (uid %d): %s\n", static_cast<int>(::geteuid()), e.what());
    } catch (...) {
      std::fprintf(stderr, "child (uid %d): unknown exception\n", static_cast<int>(::geteuid()));
    }
    std::fflush(stderr);
    ::_exit(1);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Whether the test can take other users: always when not root; as root, when the kernel lets it
// (a user namespace may not map them).
inline bool users_available() {
  return !running_as_root() || run_as_user(kOwnerUid, [] {}) == 0;
}

// Ends the test case where it cannot take other users, saying why (Catch's WARN, at the use).
#define MOEJIT_REQUIRE_USERS()                                                          \
  if (!::moejit::test::users_available()) {                                           \
    WARN("skipped: running as root, and the kernel lets no child take another user"); \
    return;                                                                           \
  }

// Runs `body` as the files' owner: kOwnerUid as root, this user otherwise. Returns run_as_user's code.
inline int as_owner(const std::function<void()>& body) {
  return run_as_user(running_as_root() ? std::optional<uid_t>(kOwnerUid) : std::nullopt, body);
}

// Runs `body` as a user who may not write `denied` (a database file, or its folder): kReaderUid as
// root, whom the owner's permissions keep out; otherwise this user, with `denied`'s write bits off
// meanwhile. Returns run_as_user's code.
inline int as_reader(const std::filesystem::path& denied, const std::function<void()>& body) {
  if (running_as_root()) return run_as_user(kReaderUid, body);
  namespace fs = std::filesystem;
  const fs::perms before = fs::status(denied).permissions();
  fs::permissions(denied, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  const int code = run_as_user(std::nullopt, body);
  fs::permissions(denied, before);
  return code;
}

}  // namespace moejit::test
