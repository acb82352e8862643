#include "db/sqlite.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "core/fs.hpp"
#include "core/log.hpp"
#include "moejit/error.hpp"

namespace moejit::db {
namespace {

// Long enough for eight ranks each committing a batch of rows one after another.
constexpr int kBusyTimeoutMs = 30000;

std::filesystem::path folder_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

// With the effective user's rights, as open() would use them.
bool may_write(const std::filesystem::path& path) { return ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) == 0; }

// Names the file, or folder, and the rights that deny this process, so its owner knows what to
// change.
std::string why_not_writable(const std::filesystem::path& path, const FileState& file) {
  const std::filesystem::path denied = file.writable ? folder_of(path) : path;
  struct stat st {};
  const int err = may_write(denied) ? 0 : errno;
  if (err == EROFS || ::stat(denied.c_str(), &st) != 0) {
    return fmt::format("{} is not writable by this process: {}", denied.string(), std::strerror(err));
  }
  return fmt::format("{} is not writable by this process (uid {}): mode {:04o}, owner uid {}", denied.string(),
                     ::geteuid(), st.st_mode & 07777, st.st_uid);
}

// SQLite's URI for the file, every byte but the unreserved ones and '/' escaped, so '?', '#' and
// '%' in a path stay in it. Absolute, so an empty authority ("file://") keeps a path that starts
// with "//" a path.
std::string uri_of(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  std::string uri = "file://";
  for (const unsigned char c : (ec ? path : absolute).string()) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '.' || c == '_' || c == '~' || c == '/';
    uri += plain ? std::string(1, static_cast<char>(c)) : fmt::format("%{:02X}", c);
  }
  return uri;
}

// SQLite's file header, the first 16 bytes of every database file.
constexpr char kSqliteHeader[] = "SQLite format 3";

// Damage: SQLite's CORRUPT, or NOTADB of a file that starts as a database does. Any other file it
// calls not a database is another program's (a mistyped MOEJIT_DB): refused and left as it is,
// never emptied as damage.
bool damaged(int rc, const std::string& path) {
  if ((rc & 0xff) == SQLITE_CORRUPT) return true;
  if ((rc & 0xff) != SQLITE_NOTADB) return false;
  char head[sizeof kSqliteHeader] = {};
  const fs::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  const ssize_t n = ::read(fd.get(), head, sizeof head);
  return n == static_cast<ssize_t>(sizeof head) && std::memcmp(head, kSqliteHeader, sizeof head) == 0;
}

}  // namespace

FileState file_state(const std::filesystem::path& path) {
  FileState file;
  struct stat st {};
  file.exists = ::stat(path.c_str(), &st) == 0;
  file.writable = file.exists && may_write(path);
  // Gone since stat (removed or renamed meanwhile): missing, not read-only.
  if (file.exists && !file.writable && errno == ENOENT) file.exists = false;
  file.folder_writable = may_write(folder_of(path));
  file.wal_exists = ::access((path.string() + "-wal").c_str(), F_OK) == 0;
  return file;
}

Access open_access(OpenMode mode, const FileState& file) {
  const Access asked = mode == OpenMode::kReadWrite ? Access::kReadWrite : Access::kReadOnly;
  // A missing file is made (read-write) or refused by SQLite (read-only); a writable one is this
  // user's to open as asked, sidecars included.
  if (!file.exists || (file.writable && file.folder_writable)) return asked;
  // Nothing can be made in the folder, so a plain read makes nothing either, and it reads the
  // commits still in the -wal (through the -shm, which must be there: otherwise it fails).
  if (!file.folder_writable && file.wal_exists) return Access::kReadOnly;
  return Access::kImmutable;
}

Connection::Connection(const std::filesystem::path& path, OpenMode mode) {
  if (mode == OpenMode::kReadWrite && path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) throw DatabaseError(fmt::format("{}: cannot create its directory: {}", path.string(), ec.message()));
  }
  const FileState file = file_state(path);
  const Access access = open_access(mode, file);
  Connection opened(path, access);
  if (mode == OpenMode::kReadWrite && access != Access::kReadWrite) {
    opened.read_only_reason_ = why_not_writable(path, file);
  }
  if (access == Access::kReadOnly && file.wal_exists && !file.folder_writable) {
    // The read that needs the -shm, now, so that its failure says why.
    try {
      opened.query_int("SELECT count(*) FROM sqlite_master");
    } catch (const DatabaseError& e) {
      throw DatabaseError(fmt::format("{}: cannot be read consistently: commits wait in its -wal file, which SQLite "
                                      "reads only through a -shm index it cannot open or make in a folder this "
                                      "process cannot write ({})",
                                      path.string(), e.what()));
    }
  }
  *this = std::move(opened);
}

Connection::Connection(const std::filesystem::path& path, Access access) {
  path_ = path.string();
  read_only_ = access != Access::kReadWrite;
  switch (access) {
    case Access::kReadWrite: open(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE); break;
    case Access::kReadOnly: open(path_, SQLITE_OPEN_READONLY); break;
    case Access::kImmutable: open(uri_of(path) + "?immutable=1", SQLITE_OPEN_READONLY | SQLITE_OPEN_URI); break;
  }
}

Connection Connection::memory() {
  Connection c;
  c.path_ = "(in memory)";  // for messages; SQLite's own name ":memory:" reads badly after "path: "
  c.in_memory_ = true;
  c.open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY);
  return c;
}

Connection Connection::memory_copy() const {
  Connection c = memory();
  std::unique_ptr<sqlite3_backup, decltype(&sqlite3_backup_finish)> backup(
      sqlite3_backup_init(c.db_, "main", db_, "main"), &sqlite3_backup_finish);
  if (backup == nullptr) c.fail(fmt::format("cannot start copying {}", path_));
  // A writer elsewhere may hold the file for a moment: wait as long as a statement would.
  int rc = SQLITE_OK;
  for (int waited = 0; waited <= kBusyTimeoutMs; waited += 10) {
    rc = sqlite3_backup_step(backup.get(), -1);
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
    sqlite3_sleep(10);
  }
  // Finished here, before the copy in c is used.
  backup.reset();
  if (rc != SQLITE_DONE) {
    const std::string message = fmt::format("{}: cannot copy into memory: {}", path_, sqlite3_errstr(rc));
    if (damaged(rc, path_)) throw CorruptDatabase(message);
    throw DatabaseError(message);
  }
  c.path_ = path_ + " (read through a copy in memory)";
  return c;
}

void Connection::open(const std::string& sqlite_name, int flags) {
  const int rc = sqlite3_open_v2(sqlite_name.c_str(), &db_, flags | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    throw DatabaseError(fmt::format("{}: cannot open: {}", path_, why));
  }
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
}

void Connection::set_journal_mode() const {
  if (read_only_ || in_memory_) return;
  const std::optional<std::uint32_t> magic = fs::file_system_magic(path_);
  if (const char* network = magic ? fs::network_file_system(*magic) : nullptr) {
    use_rollback_journal(network);
    return;
  }
  // With WAL, NORMAL loses no committed data on a process crash, only on power loss, and saves an
  // fsync per commit.
  exec("PRAGMA synchronous=NORMAL");
  // A -wal grown by one large transaction (an import, a rollback after a full disk) is cut back
  // to this at the next checkpoint; otherwise it keeps its largest size while any process keeps
  // the file open (a plan's lookup does for the process's life).
  exec("PRAGMA journal_size_limit=4194304");
  // WAL lets readers proceed while one writer commits. Switching a new file to it needs an
  // exclusive lock, and SQLite answers SQLITE_BUSY at once, without the busy handler, while
  // other processes are opening the same file: retry for as long as the busy timeout.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (int attempt = 1;; ++attempt) {
    Statement s(*this, "PRAGMA journal_mode=WAL");
    if (s.try_step() == Statement::StepResult::kRow) {
      // Some file systems (no shared memory) refuse WAL; the rollback journal still
      // serialises writers correctly, only readers wait more.
      if (std::string mode = s.column_text(0); mode != "wal") {
        log::warn("{}: journal mode stays '{}' (WAL unavailable)", path_, mode);
      }
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) fail("cannot switch to WAL journal mode");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2 * attempt, 50)));
  }
}

void Connection::reset(std::chrono::milliseconds wait) const {
  sqlite3_busy_timeout(db_, static_cast<int>(wait.count()));
  int rc = sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 1, nullptr);
  if (rc == SQLITE_OK) rc = sqlite3_exec(db_, "VACUUM", nullptr, nullptr, nullptr);
  const std::string why = sqlite3_errmsg(db_);
  sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 0, nullptr);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  if (rc != SQLITE_OK) throw DatabaseError(fmt::format("{}: cannot empty it: {}", path_, why));
}

void Connection::use_rollback_journal(const char* file_system) const {
  // The rollback journal is safe from power loss only with FULL.
  exec("PRAGMA synchronous=FULL");
  // A file in WAL mode that another process holds open cannot switch (SQLITE_BUSY at once): it
  // stays in WAL until a process opens it alone.
  Statement s(*this, "PRAGMA journal_mode=DELETE");
  const bool switched = s.try_step() == Statement::StepResult::kRow && s.column_text(0) == "delete";
  if (log::first_time("journal " + path_)) {
    log::info("{} is on {}: SQLite's rollback journal (synchronous=FULL), not WAL, whose -shm index only the "
              "processes of one host share{}",
              path_, file_system, switched ? "" : "; it stays in WAL mode while another process has it open");
  }
}

Connection::~Connection() { close(); }

Connection::Connection(Connection&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)),
      path_(std::move(other.path_)),
      read_only_(other.read_only_),
      in_memory_(other.in_memory_),
      read_only_reason_(std::move(other.read_only_reason_)) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    close();
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
    read_only_ = other.read_only_;
    in_memory_ = other.in_memory_;
    read_only_reason_ = std::move(other.read_only_reason_);
  }
  return *this;
}

void Connection::close() noexcept {
  // close_v2 defers the close until outstanding statements are finalized, so it cannot fail
  // with SQLITE_BUSY.
  if (db_) sqlite3_close_v2(std::exchange(db_, nullptr));
}

void Connection::fail(std::string_view what) const {
  const std::string message = fmt::format("{}: {}: {}", path_, what, db_ ? sqlite3_errmsg(db_) : "not open");
  if (db_ && damaged(sqlite3_errcode(db_), path_)) throw CorruptDatabase(message);
  throw DatabaseError(message);
}

void Connection::exec(const std::string& sql) const {
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) fail(fmt::format("cannot run '{}'", sql));
}

Statement Connection::prepare(const std::string& sql) const { return Statement(*this, sql); }

long long Connection::query_int(const std::string& sql) const {
  Statement s(*this, sql);
  if (!s.step()) throw DatabaseError(fmt::format("{}: '{}' returned no row", path_, sql));
  return s.column_int(0);
}

std::string Connection::query_text(const std::string& sql) const {
  Statement s(*this, sql);
  if (!s.step()) throw DatabaseError(fmt::format("{}: '{}' returned no row", path_, sql));
  return s.column_text(0);
}

int Connection::changes() const { return sqlite3_changes(db_); }

Statement::Statement(const Connection& conn, const std::string& sql) : conn_(&conn) {
  if (sqlite3_prepare_v2(conn.handle(), sql.c_str(), static_cast<int>(sql.size()) + 1, &stmt_, nullptr) != SQLITE_OK) {
    finalize();
    conn.fail(fmt::format("cannot prepare '{}'", sql));
  }
}

Statement::~Statement() { finalize(); }

Statement::Statement(Statement&& other) noexcept
    : conn_(other.conn_), stmt_(std::exchange(other.stmt_, nullptr)) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    finalize();
    conn_ = other.conn_;
    stmt_ = std::exchange(other.stmt_, nullptr);
  }
  return *this;
}

void Statement::finalize() noexcept {
  if (stmt_) sqlite3_finalize(std::exchange(stmt_, nullptr));
}

int Statement::parameter_index(const char* name) const {
  int i = sqlite3_bind_parameter_index(stmt_, name);
  if (i == 0) throw InternalError(fmt::format("SQL parameter {} not found in '{}'", name, sqlite3_sql(stmt_)));
  return i;
}

Statement& Statement::bind(const char* name, long long value) {
  if (sqlite3_bind_int64(stmt_, parameter_index(name), value) != SQLITE_OK) conn_->fail(fmt::format("cannot bind {}", name));
  return *this;
}

Statement& Statement::bind(const char* name, double value) {
  if (sqlite3_bind_double(stmt_, parameter_index(name), value) != SQLITE_OK) conn_->fail(fmt::format("cannot bind {}", name));
  return *this;
}

Statement& Statement::bind(const char* name, std::string_view value) {
  if (sqlite3_bind_text(stmt_, parameter_index(name), value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT) !=
      SQLITE_OK) {
    conn_->fail(fmt::format("cannot bind {}", name));
  }
  return *this;
}

Statement::StepResult Statement::try_step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return StepResult::kRow;
  if (rc == SQLITE_DONE) return StepResult::kDone;
  if ((rc & 0xff) == SQLITE_BUSY) {
    sqlite3_reset(stmt_);  // the statement may be stepped again
    return StepResult::kBusy;
  }
  conn_->fail(fmt::format("cannot run '{}'", sqlite3_sql(stmt_)));
}

bool Statement::step() {
  switch (try_step()) {
    case StepResult::kRow: return true;
    case StepResult::kDone: return false;
    case StepResult::kBusy: break;
  }
  // try_step() reset the statement, which may have replaced SQLite's message: say it here.
  throw DatabaseError(fmt::format("{}: cannot run '{}': database is locked", conn_->path(), sqlite3_sql(stmt_)));
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

long long Statement::column_int(int col) const { return sqlite3_column_int64(stmt_, col); }

double Statement::column_double(int col) const {
  if (sqlite3_column_type(stmt_, col) == SQLITE_NULL) return std::numeric_limits<double>::quiet_NaN();
  return sqlite3_column_double(stmt_, col);
}

std::string Statement::column_text(int col) const {
  const unsigned char* text = sqlite3_column_text(stmt_, col);
  if (text == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<std::size_t>(sqlite3_column_bytes(stmt_, col)));
}

Transaction::Transaction(const Connection& conn, Kind kind) : conn_(conn) {
  if (kind == Kind::kWrite && conn_.read_only()) {
    const std::string& why = conn_.read_only_reason();
    throw DatabaseError(fmt::format("{}: cannot write: {}", conn_.path(), why.empty() ? "opened read-only" : why));
  }
  if (kind == Kind::kRead) {
    conn_.exec("BEGIN");
    open_ = true;
    return;
  }
  // BEGIN IMMEDIATE waits on the busy handler, but some SQLITE_BUSY come back at once (another
  // connection recovering the WAL after a crash, a new file switching to WAL): retried until the
  // same deadline, since on a loaded machine the other process may take long to finish.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (int attempt = 1;; ++attempt) {
    int rc = sqlite3_exec(conn_.handle(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) break;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) {
      conn_.fail("cannot begin a write transaction");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2 * attempt, 50)));
  }
  open_ = true;
}

Transaction::~Transaction() {
  // A failed statement may already have rolled the transaction back; only roll back if SQLite
  // still has one open.
  if (open_ && sqlite3_get_autocommit(conn_.handle()) == 0) {
    sqlite3_exec(conn_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
}

void Transaction::commit() {
  conn_.exec("COMMIT");
  open_ = false;
}

}  // namespace moejit::db
