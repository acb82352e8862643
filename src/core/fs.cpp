#include "core/fs.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "moejit/error.hpp"

namespace moejit::fs {
namespace {

std::string errno_text() { return std::strerror(errno); }

// What a file that is not a regular one is, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// What marks atomic_write's temporary files, which remove_stale_temp_files looks for.
constexpr std::string_view kTempInfix = ".tmp.";

// Whether `name` is one of unique_temp_name's: <target>.tmp.<pid>.<counter>. Other names with
// ".tmp." in them (the cache folder may be shared) are not this code's to remove.
bool is_temp_name(const std::string& name) {
  const std::size_t at = name.rfind(kTempInfix);
  if (at == std::string::npos || at == 0) return false;
  const std::string_view rest = std::string_view(name).substr(at + kTempInfix.size());
  const std::size_t dot = rest.find('.');
  const auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dot != std::string_view::npos && digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

std::uint64_t random_u64() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

// The count starts at random in each process: a dead process of the same pid (pids are reused, and
// another PID namespace may share the folder) may have left files under the names it would have
// started with.
std::filesystem::path unique_temp_name(const std::filesystem::path& target) {
  static std::atomic<std::uint64_t> counter{random_u64()};
  auto name = fmt::format("{}{}{}.{}", target.filename().string(), kTempInfix, ::getpid(), counter.fetch_add(1));
  return target.parent_path() / name;
}

// Names tried before giving up: another's file under one is rare, under many a sign of trouble.
constexpr int kTempNameAttempts = 16;

}  // namespace

Fd::~Fd() { close(); }

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

int Fd::close() noexcept { return fd_ < 0 ? 0 : ::close(std::exchange(fd_, -1)); }

void atomic_write(const std::filesystem::path& target, std::string_view bytes) {
  std::filesystem::path tmp;
  Fd fd;
  int error = ENOENT;
  std::error_code folder_error;  // of the last attempt to make the folder
  for (int attempt = 0; fd.get() < 0 && attempt < kTempNameAttempts; ++attempt) {
    // Made again after ENOENT: another process may remove the folder once it is empty (the
    // kernel cache's sweep of another build's folder) between making it and opening the file.
    if (error == ENOENT && target.has_parent_path()) {
      std::filesystem::create_directories(target.parent_path(), folder_error);
    }
    tmp = unique_temp_name(target);
    fd = Fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    error = fd.get() < 0 ? errno : 0;
    if (fd.get() < 0 && error != EEXIST && error != ENOENT) break;
  }
  // The file's ENOENT only says the folder is missing; making it says why (EACCES, EROFS).
  if (fd.get() < 0 && error == ENOENT && folder_error) {
    throw IoError(fmt::format("cannot create the folder {}: {}", target.parent_path().string(),
                              folder_error.message()));
  }
  if (fd.get() < 0) throw IoError(fmt::format("cannot create {}: {}", tmp.string(), std::strerror(error)));
  // On failure errno is kept as a number and the file closed and removed before anything that
  // allocates (and so may throw) runs: an exception there leaves no temporary file behind.
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      fd.close();
      remove_quietly(tmp);
      throw IoError(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  // close() runs whether or not fsync() failed: a failed flush must not leak the descriptor.
  int flush_error = ::fsync(fd.get()) == 0 ? 0 : errno;
  if (fd.close() != 0 && flush_error == 0) flush_error = errno;
  if (flush_error != 0) {
    remove_quietly(tmp);
    throw IoError(fmt::format("cannot flush {}: {}", tmp.string(), std::strerror(flush_error)));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    remove_quietly(tmp);
    throw IoError(fmt::format("cannot rename {} to {}: {}", tmp.string(), target.string(), std::strerror(err)));
  }
}

std::size_t remove_old_files(const std::filesystem::path& dir, std::chrono::seconds older_than,
                             const std::function<bool(const std::string& name)>& name_matches,
                             std::vector<std::string>* errors) noexcept {
  const auto report = [errors](const char* what, const std::filesystem::path& path, std::error_code ec) {
    if (errors != nullptr && ec != std::errc::no_such_file_or_directory) {
      errors->push_back(fmt::format("cannot {} {}: {}", what, path.string(), ec.message()));
    }
  };
  std::size_t removed = 0;
  // A sweep is best effort: host memory running out (the names, the reports) ends it there.
  try {
    std::error_code ec;
    const auto cutoff = std::filesystem::file_time_type::clock::now() - older_than;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (!name_matches(it->path().filename().string()) || !it->is_regular_file(type_ec) || it->is_symlink(type_ec)) {
        continue;
      }
      std::error_code time_ec;
      const auto written = std::filesystem::last_write_time(it->path(), time_ec);
      if (time_ec) {
        report("inspect", it->path(), time_ec);
      } else if (older_than.count() == 0 || written < cutoff) {
        std::error_code remove_ec;
        if (std::filesystem::remove(it->path(), remove_ec)) {
          ++removed;
        } else if (remove_ec) {
          report("remove", it->path(), remove_ec);
        }
      }
    }
    if (ec) report("read", dir, ec);
  } catch (...) {
  }
  return removed;
}

std::size_t remove_stale_temp_files(const std::filesystem::path& dir, std::chrono::seconds older_than) noexcept {
  return remove_old_files(dir, older_than, is_temp_name);
}

void refresh_write_time(const std::filesystem::path& path, std::chrono::seconds older_than) noexcept {
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(path, ec);
  if (ec || written >= std::filesystem::file_time_type::clock::now() - older_than) return;
  // A null time means "now", which needs only write permission, not ownership: in a cache folder
  // users share, the file may be another user's.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
}

std::optional<std::string> read_all(const std::filesystem::path& path, std::optional<std::uintmax_t> max_bytes,
                                    std::string* error) {
  const auto fail = [error](std::string why) -> std::optional<std::string> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for one.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) return fail(errno_text());
  if (!S_ISREG(st.st_mode)) return fail(fmt::format("{}, not a regular file", file_kind(st.st_mode)));
  const std::uintmax_t limit = max_bytes.value_or(std::numeric_limits<std::uintmax_t>::max());
  const auto too_large = [&] { return fail(fmt::format("larger than {} bytes", limit)); };
  if (static_cast<std::uintmax_t>(st.st_size) > limit) return too_large();
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errno_text());
    if (n == 0) return out;
    // The file may grow while it is read.
    if (static_cast<std::uintmax_t>(n) > limit - out.size()) return too_large();
    out.append(buf, static_cast<std::size_t>(n));
  }
}

void make_private_dir(const std::filesystem::path& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw IoError(fmt::format("cannot create {}: {}", dir.string(), errno_text()));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw IoError(fmt::format("cannot inspect {}: {}", dir.string(), errno_text()));
  if (S_ISLNK(st.st_mode)) throw IoError(fmt::format("{} is a symbolic link, not a private folder", dir.string()));
  if (!S_ISDIR(st.st_mode)) throw IoError(fmt::format("{} is not a folder", dir.string()));
  if (st.st_uid != ::geteuid()) {
    throw IoError(fmt::format("{} belongs to user {}, not to this one ({})", dir.string(), st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw IoError(fmt::format("{} is writable by other users (mode {:o})", dir.string(), st.st_mode & 07777));
  }
}

bool remove_quietly(const std::filesystem::path& path) noexcept {
  std::error_code ec;
  return std::filesystem::remove(path, ec);
}

std::optional<FileVersion> file_version(const std::filesystem::path& path) noexcept {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileVersion{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                     static_cast<std::int64_t>(st.st_size),
                     static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::optional<std::uint32_t> file_system_magic(const std::filesystem::path& path) noexcept {
  struct statfs st {};
  if (::statfs(path.c_str(), &st) != 0) {
    const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    if (::statfs(folder.c_str(), &st) != 0) return std::nullopt;
  }
  // f_type is a word of varying width and sign; the magic numbers are 32-bit.
  return static_cast<std::uint32_t>(st.f_type);
}

const char* network_file_system(std::uint32_t magic) noexcept {
  // linux/magic.h where it has them; Lustre, GPFS and BeeGFS define theirs out of tree.
  switch (magic) {
    case 0x6969: return "NFS";
    case 0x517B: return "SMB";
    case 0xFF534D42: return "CIFS";
    case 0xFE534D42: return "SMB2";
    case 0x0BD00BD0: return "Lustre";
    case 0x47504653: return "GPFS";
    case 0x19830326: return "BeeGFS";
    case 0x00C36400: return "Ceph";
    case 0x65735546: return "FUSE";  // sshfs and the like; a local one loses only WAL's speed
    case 0x01021997: return "9p";
    default: return nullptr;
  }
}

FileLock::FileLock(const std::filesystem::path& lock_path, std::chrono::milliseconds timeout) {
  std::error_code ec;
  if (lock_path.has_parent_path()) std::filesystem::create_directories(lock_path.parent_path(), ec);
  // Held locally until locked, so that every throw below closes it.
  Fd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == EACCES || err == EROFS) fd = Fd(::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      throw IoError(fmt::format("cannot open lock file {}: {}", lock_path.string(), std::strerror(err)));
    }
  }
  // Polled rather than blocking, so a deadline holds (flock has no timed form).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    std::string why = err == EWOULDBLOCK ? fmt::format("still held by another process after {} ms", timeout.count())
                                         : std::strerror(err);
    if (err != EWOULDBLOCK) throw IoError(fmt::format("cannot lock {}: {}", lock_path.string(), why));
    if (std::chrono::steady_clock::now() >= deadline) {
      throw LockTimeout(fmt::format("cannot lock {}: {}", lock_path.string(), why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fd_ = std::move(fd);
}

FileLock::~FileLock() {
  // fd_ closes itself after this.
  if (fd_.get() >= 0) ::flock(fd_.get(), LOCK_UN);
}

}  // namespace moejit::fs
