// A damaged tuning database found by a process about to save rows: a copy kept, then the file
// emptied in place (TuningDb::open_for_saving, check_intact; decisions.md, session 50).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.hpp"
#include "core/log.hpp"
#include "db/tuning_db.hpp"
#include "moejit/error.hpp"

namespace moejit::db {
namespace {

// What a copy of a damaged database keeps: the file and the journals that may hold its latest
// commits (the -shm is an index SQLite rebuilds).
constexpr std::array<const char*, 3> kKept = {"", "-wal", "-journal"};

// Copying and emptying take milliseconds; a holder that hangs is not waited for long.
constexpr std::chrono::seconds kRecoverLockTimeout{30};
// How long emptying a damaged database waits for other connections to let go of it: a
// transaction takes milliseconds, a process that keeps it open lets go only when it ends.
constexpr std::chrono::seconds kResetWait{1};

// <name>.corrupt-<UTC time>, with a count after it where that name is taken (the same second), so
// no copy is written over an earlier one.
std::string aside_name(const std::filesystem::path& path) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  const std::string base = fmt::format("{}.corrupt-{}", path.string(), stamp);
  for (int n = 1;; ++n) {
    const std::string name = n == 1 ? base : fmt::format("{}-{}", base, n);
    std::error_code ec;
    const bool taken = std::any_of(kKept.begin(), kKept.end(), [&](const char* suffix) {
      return std::filesystem::exists(std::filesystem::symlink_status(name + suffix, ec));
    });
    if (!taken) return name;
  }
}

// Copies the damaged database and its journals to one free name beside it; returns that name.
// Throws IoError before anything is emptied, the copies it made removed again: a full disk would
// otherwise gather a partial copy at every save. A journal gone meanwhile (a checkpoint removed
// it) is nothing to copy.
std::string keep_copy(const std::filesystem::path& path, std::vector<std::string>& written) {
  const std::string aside = aside_name(path);
  try {
    for (const char* suffix : kKept) {
      const std::string from = path.string() + suffix;
      const std::optional<std::string> bytes = fs::read_all(from);
      std::error_code ec;
      if (!bytes && *suffix && !std::filesystem::exists(from, ec)) continue;
      if (!bytes) throw IoError(fmt::format("cannot read {} to keep a copy", from));
      fs::atomic_write(aside + suffix, *bytes);
      written.push_back(aside + suffix);
    }
  } catch (...) {
    for (const std::string& copy : written) fs::remove_quietly(copy);
    written.clear();
    throw;
  }
  return aside;
}

// The database at `path`, checked whole unless this process can only read it.
TuningDb open_checked(const std::filesystem::path& path) {
  TuningDb db(path);
  if (!db.read_only()) db.check_intact();
  return db;
}

}  // namespace

TuningDb TuningDb::open_for_saving(const std::filesystem::path& path) {
  std::string why;
  try {
    return open_checked(path);
  } catch (const CorruptDatabase& e) {
    // Left alone where this process could not write it anyway: its owner decides.
    if (open_access(OpenMode::kReadWrite, file_state(path)) != Access::kReadWrite) throw;
    why = e.what();
  }
  // One process at a time; another may have emptied it while this one waited.
  const fs::FileLock lock(path.string() + ".locks/recover.lock", kRecoverLockTimeout);
  try {
    return open_checked(path);
  } catch (const CorruptDatabase&) {
  }
  std::vector<std::string> copies;
  const std::string aside = keep_copy(path, copies);
  try {
    Connection(path, OpenMode::kReadWrite).reset(kResetWait);
  } catch (const DatabaseError& e) {
    // Mostly open elsewhere: not this process's to empty now, and the copy would only pile up.
    for (const std::string& copy : copies) fs::remove_quietly(copy);
    if (log::first_time("damaged " + path.string())) {
      log::warn("tuning database damaged: {}; not emptied ({}): while other processes have it open it stays as it "
                "is, and rows are saved into it as far as they can be",
                why, e.what());
    }
    return TuningDb(path);
  }
  log::warn("tuning database damaged: {}; a copy is kept as {} (with its -wal and -journal, if any), and {} was "
            "emptied in place for new rows",
            why, aside, path.string());
  return TuningDb(path);
}

void TuningDb::check_intact() const {
  Statement s = conn_.prepare("PRAGMA quick_check");
  std::vector<std::string> problems;
  while (s.step()) {
    if (std::string line = s.column_text(0); line != "ok") problems.push_back(std::move(line));
  }
  if (problems.empty()) return;
  const std::size_t shown = std::min<std::size_t>(problems.size(), 3);
  std::string said;
  for (std::size_t p = 0; p < shown; ++p) said += (p ? "; " : "") + problems[p];
  throw CorruptDatabase(fmt::format("{}: damaged: PRAGMA quick_check found {} problem{}: {}{}", path(),
                                    problems.size(), problems.size() == 1 ? "" : "s", said,
                                    problems.size() > shown ? "; ..." : ""));
}

}  // namespace moejit::db
