// Thin RAII layer over the SQLite C API: a connection, a prepared statement and a transaction.
// Every failure throws DatabaseError naming the file, the operation and sqlite3_errmsg;
// destructors never throw. sqlite3.h stays out of this header so users need not have it.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>

#include "moejit/error.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace moejit::db {

enum class OpenMode {
  kReadWrite,  // creates the file and its parent directories; a file this process cannot write,
               // or whose folder it cannot write, is opened for reading only (read_only_reason())
  kReadOnly,   // the file must exist; nothing is written
};

// What the file system lets this process (its effective user) do with a database file.
struct FileState {
  bool exists = false;
  bool writable = false;         // the file itself
  bool folder_writable = false;  // its folder, where SQLite makes its -wal, -shm and -journal files
  bool wal_exists = false;       // a -wal file: commits the file itself may not hold yet
};

FileState file_state(const std::filesystem::path& path);

// How a file is opened.
enum class Access {
  kReadWrite,  // read-write, made if missing
  kReadOnly,   // read-only; SQLite still makes a missing -wal and -shm to read a file in WAL mode
  kImmutable,  // read-only through file:...?immutable=1: no locks, nothing made beside the file
};

// The access `mode` gets for a file in `file`'s state. SQLite makes a missing -wal and -shm wherever
// the folder lets it, even to read, owned by this user and with the database's mode, so a reader
// that cannot write the file leaves sidecars that stop its owner from writing. A file this process
// cannot write, or in a folder it cannot write, is therefore read immutable, the file alone;
// except where a -wal holds commits and the folder lets this process make nothing: then SQLite
// reads it plainly, through the -wal and -shm already there.
Access open_access(OpenMode mode, const FileState& file);

// SQLite found the file damaged: SQLITE_CORRUPT ("database disk image is malformed") or
// SQLITE_NOTADB ("file is not a database").
class CorruptDatabase : public DatabaseError {
 public:
  using DatabaseError::DatabaseError;
};

class Statement;

class Connection {
 public:
  // Opens a database file with a 30 s busy timeout, so several processes can write one file: each
  // writer waits for the lock instead of failing. The access is open_access(mode, file_state()).
  // The journal mode is left as the file has it until set_journal_mode().
  Connection(const std::filesystem::path& path, OpenMode mode);
  // Opens a database file with the access given.
  Connection(const std::filesystem::path& path, Access access);
  // A private database in memory (no file, no WAL).
  static Connection memory();
  // A private in-memory copy of this database (SQLite's online backup): an older schema can be
  // migrated and read there without writing the file.
  Connection memory_copy() const;

  ~Connection();
  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs one or more statements that return no rows.
  void exec(const std::string& sql) const;
  Statement prepare(const std::string& sql) const;
  // The first column of the first row of a query (e.g. a PRAGMA); throws when there is no row.
  long long query_int(const std::string& sql) const;
  std::string query_text(const std::string& sql) const;
  // Rows the last INSERT, UPDATE or DELETE on this connection changed (sqlite3_changes; no
  // RETURNING, which SQLite before 3.35 lacks).
  int changes() const;

  // The file name, or "(in memory)"; used in every error message.
  const std::string& path() const { return path_; }
  bool read_only() const { return read_only_; }
  // Why a file opened with OpenMode::kReadWrite is read-only (not writable by this process, mode
  // and owner; or its folder); empty otherwise.
  const std::string& read_only_reason() const { return read_only_reason_; }
  // The raw handle, for the calls this wrapper does not cover.
  sqlite3* handle() const { return db_; }

  // Throws DatabaseError "<path>: <what>: <sqlite3_errmsg>" (CorruptDatabase for a damaged file).
  [[noreturn]] void fail(std::string_view what) const;

  // Empties the database in place, whatever its damage (SQLITE_DBCONFIG_RESET_DATABASE, then
  // VACUUM): the file stays the one other processes have open, so SQLite's locks still keep them
  // apart, where a file renamed aside would leave them reading it with the new file's -wal and
  // -journal, found by name. Throws DatabaseError when other connections keep it open past `wait`
  // (it needs the file alone).
  void reset(std::chrono::milliseconds wait) const;

  // Sets the journal of a file opened read-write: WAL with synchronous=NORMAL, so readers proceed
  // while one writer commits; on a network file system (fs::network_file_system) the rollback
  // journal with synchronous=FULL, since WAL's -shm index is memory that only the processes of
  // one host share. Nothing for a read-only or in-memory connection. Not done on open: the tuning
  // database first checks that the file is its own, and another program's database keeps its
  // journal mode.
  void set_journal_mode() const;

 private:
  Connection() = default;
  void open(const std::string& sqlite_name, int flags);
  void use_rollback_journal(const char* file_system) const;
  void close() noexcept;

  sqlite3* db_ = nullptr;
  std::string path_;
  bool read_only_ = false;
  bool in_memory_ = false;
  std::string read_only_reason_;
};

// A prepared statement. Parameters are bound by name (":key_id"); columns are read by index.
class Statement {
 public:
  Statement(const Connection& conn, const std::string& sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Binding a NaN double stores NULL (SQLite's own rule), which column_double reads back as NaN.
  Statement& bind(const char* name, long long value);
  Statement& bind(const char* name, int value) { return bind(name, static_cast<long long>(value)); }
  Statement& bind(const char* name, bool value) { return bind(name, static_cast<long long>(value ? 1 : 0)); }
  Statement& bind(const char* name, double value);
  Statement& bind(const char* name, std::string_view value);
  Statement& bind(const char* name, const std::string& value) { return bind(name, std::string_view(value)); }
  Statement& bind(const char* name, const char* value) { return bind(name, std::string_view(value)); }

  enum class StepResult { kRow, kDone, kBusy };
  // One step; kBusy when the database stayed locked past the busy timeout or SQLite reported
  // SQLITE_BUSY at once. Throws on any other error.
  StepResult try_step();
  // True when a row is ready to read, false when the statement has finished; throws on kBusy.
  bool step();
  // Steps a statement that returns no rows to completion.
  void run();
  // Makes the statement ready to run again with new bindings.
  void reset();

  long long column_int(int col) const;
  double column_double(int col) const;  // NaN for NULL
  std::string column_text(int col) const;

 private:
  int parameter_index(const char* name) const;
  void finalize() noexcept;

  const Connection* conn_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

// A transaction that rolls back unless commit() was called. A write transaction starts with
// BEGIN IMMEDIATE, taking the write lock up front: concurrent writers queue on the busy timeout
// instead of failing halfway with SQLITE_BUSY. A read transaction gives one consistent snapshot.
class Transaction {
 public:
  enum class Kind { kRead, kWrite };
  Transaction(const Connection& conn, Kind kind);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  void commit();

 private:
  const Connection& conn_;
  bool open_ = false;
};

}  // namespace moejit::db
