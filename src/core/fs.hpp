// File helpers with the guarantees the caches and databases rely on.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moejit/error.hpp"

namespace moejit::fs {

// Owns a file descriptor (negative: none) and closes it when it dies.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  int get() const noexcept { return fd_; }
  // Closes it now, for a caller that must know whether close() failed (errno says why): its
  // result, 0 when there was none.
  int close() noexcept;

 private:
  int fd_ = -1;
};

// Writes bytes to a unique temporary file in the target's directory, flushes it to disk and
// renames it over the target: readers see the old file or the whole new one, never a part.
// Creates missing parent directories. Throws IoError.
void atomic_write(const std::filesystem::path& target, std::string_view bytes);

// Removes the regular files (not symbolic links) directly in `dir` whose names `name_matches`
// and whose last write is older than `older_than` (0: any). Returns how many it removed. A folder
// or file that is not there (not made yet, removed first by another process) is no error; the
// others are appended to `errors` where given ("cannot read <dir>: <why>", "cannot remove <file>:
// <why>"), and otherwise ignored.
std::size_t remove_old_files(const std::filesystem::path& dir, std::chrono::seconds older_than,
                             const std::function<bool(const std::string& name)>& name_matches,
                             std::vector<std::string>* errors = nullptr) noexcept;

// Removes the temporary files atomic_write left in `dir` (its writer died between creating and
// renaming them) whose last write is older than `older_than`; a live writer's file is younger.
std::size_t remove_stale_temp_files(const std::filesystem::path& dir, std::chrono::seconds older_than) noexcept;

// Sets the file's last write time to now when it is older than `older_than`, ignoring errors: a
// mark that the file is still in use, for remove_old_files.
void refresh_write_time(const std::filesystem::path& path, std::chrono::seconds older_than) noexcept;

// The whole file, or nullopt when it does not exist, cannot be read, is not a regular file (after
// following symbolic links: a FIFO would block, a device never end) or holds more than
// `max_bytes`; then `error`, where given, says which ("a FIFO, not a regular file", strerror).
std::optional<std::string> read_all(const std::filesystem::path& path,
                                    std::optional<std::uintmax_t> max_bytes = std::nullopt,
                                    std::string* error = nullptr);

// Creates `dir` with mode 0700 unless it exists (its parent must), then checks that it is private
// to this user: a directory, not a symbolic link, owned by the effective user and writable by no
// one else. A folder in a place every user shares (the temporary folder) must pass this before
// anything in it is trusted, since another user could have made it first. Throws IoError saying
// which check failed.
void make_private_dir(const std::filesystem::path& dir);

// Removes a file, ignoring errors (another process may have removed it first); whether it did.
bool remove_quietly(const std::filesystem::path& path) noexcept;

// Which file a path names and how it was last written, to tell whether it changed.
struct FileVersion {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::int64_t size = 0;
  std::int64_t modified_ns = 0;
  bool operator==(const FileVersion&) const = default;
};

// The file at `path` (after following symbolic links); nullopt when there is none.
std::optional<FileVersion> file_version(const std::filesystem::path& path) noexcept;

// The file system `path` lies on (statfs's f_type, its magic number; the folder's when the file
// does not exist yet); nullopt when neither can be asked.
std::optional<std::uint32_t> file_system_magic(const std::filesystem::path& path) noexcept;

// The name of a network or cluster file system ("NFS", "Lustre", ...) by its magic number, or
// nullptr for any other: where processes on several hosts may open one file, so no shared memory
// between them can be assumed (SQLite's WAL needs it).
const char* network_file_system(std::uint32_t magic) noexcept;

// FileLock's wait ran out with the lock still held by another holder (not a file it could not
// open or lock at all).
class LockTimeout : public IoError {
 public:
  using IoError::IoError;
};

// An advisory exclusive lock on a lock file (flock), released by the destructor or when the
// process dies, so a crashed holder never blocks others. A live holder that hangs would: the
// constructor gives up after `timeout` and throws LockTimeout (IoError where it cannot lock at
// all). A lock file that exists but that this process may not write (another user's, in a folder
// users share) is opened for reading, which flock needs no more than.
class FileLock {
 public:
  FileLock(const std::filesystem::path& lock_path, std::chrono::milliseconds timeout);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  // The moved-from lock holds nothing and releases nothing.
  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&&) = delete;

 private:
  Fd fd_;
};

}  // namespace moejit::fs
