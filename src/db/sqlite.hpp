// Thin RAII layer over the SQLite C API: a connection, a prepared statement and a transaction.
// Every failure throws DatabaseError naming the file, the operation and sqlite3_errmsg;
// destructors never throw. sqlite3.h stays out of this header so users need not have it.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace moejit::db {

enum class OpenMode {
  kReadWrite,  // creates the file and its parent directories
  kReadOnly,   // the file must exist; nothing is written
};

class Statement;

class Connection {
 public:
  // Opens a database file with a 30 s busy timeout and synchronous=NORMAL, so several processes
  // can write one file: each writer waits for the lock instead of failing. The journal mode is
  // left as the file has it until use_wal().
  Connection(const std::filesystem::path& path, OpenMode mode);
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
  // The raw handle, for the calls this wrapper does not cover.
  sqlite3* handle() const { return db_; }

  // Throws DatabaseError "<path>: <what>: <sqlite3_errmsg>".
  [[noreturn]] void fail(std::string_view what) const;

  // Switches a file opened read-write to WAL, so readers proceed while one writer commits;
  // nothing for a read-only or in-memory connection. Not done on open: the tuning database first
  // checks that the file is its own, and another program's database keeps its journal mode.
  void use_wal() const;

 private:
  Connection(std::string path, int flags, bool read_only);
  void close() noexcept;

  sqlite3* db_ = nullptr;
  std::string path_;
  bool read_only_ = false;
  bool in_memory_ = false;
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
