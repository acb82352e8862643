// core/fs: the lock's deadline, the sweep of temporary files that dead writers left, private
// folders, reads that neither block nor run away, and temporary names another process left.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/fs.hpp"
#include "moejit/error.hpp"
#include "support/temp_dir.hpp"
#include "support/users.hpp"

using namespace moejit;
using namespace std::chrono_literals;

TEST_CASE("a file lock held elsewhere times out with an IoError instead of waiting forever", "[fs]") {
  test::TempDir dir("lock");
  const auto path = dir / "key.lock";
  // flock locks belong to an open file description, so a second FileLock in this process
  // contends like another process would.
  auto holder = std::make_unique<fs::FileLock>(path, 1000ms);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(fs::FileLock(path, 200ms), IoError);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 200ms);
  CHECK(waited < 5s);
  holder.reset();
  CHECK_NOTHROW(fs::FileLock(path, 200ms));  // released by the holder's destructor
}

TEST_CASE("a lock file another user made is locked through a read-only descriptor", "[fs]") {
  // A second user sharing the database folder got EACCES and tuned without the lock, every plan.
  MOEJIT_REQUIRE_USERS();
  test::TempDir dir("lock-other");
  const auto path = dir / "key.lock";
  auto holder = std::make_unique<fs::FileLock>(path, 1000ms);
  CHECK(test::as_reader(path, [&] {
          try {
            fs::FileLock lock(path, 200ms);
            test::expect(false, "locked while another held the lock");
          } catch (const IoError& e) {
            test::expect(std::string(e.what()).find("still held") != std::string::npos, e.what());
          }
        }) == 0);
  holder.reset();
  CHECK(test::as_reader(path, [&] { fs::FileLock lock(path, 200ms); }) == 0);
}

TEST_CASE("network and cluster file systems are known by their magic numbers; this folder's is asked", "[fs]") {
  // linux/magic.h, and the out-of-tree Lustre, GPFS and BeeGFS.
  for (const auto& [magic, name] : std::vector<std::pair<std::uint32_t, std::string>>{
           {0x6969, "NFS"},
           {0x517B, "SMB"},
           {0xFF534D42, "CIFS"},
           {0xFE534D42, "SMB2"},
           {0x0BD00BD0, "Lustre"},
           {0x47504653, "GPFS"},
           {0x19830326, "BeeGFS"},
           {0x00C36400, "Ceph"},
           {0x65735546, "FUSE"},
           {0x01021997, "9p"}}) {
    INFO(fmt::format("{:#x}", magic));
    REQUIRE(fs::network_file_system(magic) != nullptr);
    CHECK(fs::network_file_system(magic) == name);
  }
  // ext4, tmpfs (next to 9p's), xfs, btrfs, overlayfs, zfs.
  for (const std::uint32_t local : {0xEF53u, 0x01021994u, 0x58465342u, 0x9123683Eu, 0x794C7630u, 0x2FC12FC1u}) {
    INFO(fmt::format("{:#x}", local));
    CHECK(fs::network_file_system(local) == nullptr);
  }
  test::TempDir dir("magic");
  const auto magic = fs::file_system_magic(dir.path());
  REQUIRE(magic);
  CHECK(fs::file_system_magic(dir / "not-yet.sqlite") == magic);  // the folder's, for a file to come
  CHECK_FALSE(fs::file_system_magic("/no/such/folder/file"));
}

TEST_CASE("stale temporary files are swept, young ones and real files stay", "[fs]") {
  test::TempDir dir("sweep");
  fs::atomic_write(dir / "k.cubin", "kernel");
  fs::atomic_write(dir / "old.cubin.tmp.123.0", "a dead writer's");
  fs::atomic_write(dir / "young.cubin.tmp.124.0", "a live writer's");
  std::filesystem::last_write_time(dir / "old.cubin.tmp.123.0",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  // Old entries that are not atomic_write's, in a cache folder the user shares: left alone.
  const std::vector<std::string> others = {"report.tmp.txt", "data.tmp.csv", "x.tmp.12", "x.tmp.12.3a",
                                           "build.tmp.4.5"};
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const std::string& other : others) {
    if (other == "build.tmp.4.5") std::filesystem::create_directory(dir / other);
    else fs::atomic_write(dir / other, "theirs");
    std::filesystem::last_write_time(dir / other, two_hours_ago);
  }
  fs::remove_stale_temp_files(dir.path(), std::chrono::hours(1));
  for (const std::string& other : others) CHECK(std::filesystem::exists(dir / other));
  CHECK_FALSE(std::filesystem::exists(dir / "old.cubin.tmp.123.0"));
  CHECK(std::filesystem::exists(dir / "young.cubin.tmp.124.0"));
  CHECK(*fs::read_all(dir / "k.cubin") == "kernel");
  // A missing directory is not an error: the cache may not exist yet.
  fs::remove_stale_temp_files(dir / "absent", std::chrono::hours(1));
}

TEST_CASE("atomic_write leaves no temporary file behind", "[fs]") {
  test::TempDir dir("write");
  for (int i = 0; i < 3; ++i) fs::atomic_write(dir / "f", std::string(1000 + i, 'x'));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK(fs::read_all(dir / "f")->size() == 1002);
}

namespace {

// A folder another user owns: one made here and given away where this test runs as root, else
// the root folder.
std::filesystem::path foreign_folder(const test::TempDir& dir) {
  if (::geteuid() != 0) return "/";
  const auto given = dir / "given";
  std::filesystem::create_directory(given);
  std::filesystem::permissions(given, std::filesystem::perms::owner_all);
  REQUIRE(::chown(given.c_str(), 65534, 65534) == 0);
  return given;
}

}  // namespace

TEST_CASE("a private folder is made 0700, and one that others could write or that is not ours is refused", "[fs]") {
  test::TempDir dir("private");
  using std::filesystem::perms;
  const auto made = dir / "made";
  fs::make_private_dir(made);
  CHECK((std::filesystem::status(made).permissions() & perms::all) == perms::owner_all);
  CHECK_NOTHROW(fs::make_private_dir(made));  // already there and private
  const auto readable = dir / "readable";
  std::filesystem::create_directory(readable);
  std::filesystem::permissions(readable, perms::owner_all | perms::group_read | perms::others_read);
  CHECK_NOTHROW(fs::make_private_dir(readable));  // others may read what they cannot change

  const auto open_to_all = dir / "open";
  std::filesystem::create_directory(open_to_all);
  std::filesystem::permissions(open_to_all, perms::all);
  CHECK_THROWS_WITH(fs::make_private_dir(open_to_all), Catch::Contains("writable by other users"));
  const auto group = dir / "group";
  std::filesystem::create_directory(group);
  std::filesystem::permissions(group, perms::owner_all | perms::group_write);
  CHECK_THROWS_AS(fs::make_private_dir(group), IoError);
  const auto link = dir / "link";
  std::filesystem::create_directory_symlink(made, link);  // to a private folder, still refused
  CHECK_THROWS_WITH(fs::make_private_dir(link), Catch::Contains("symbolic link"));
  fs::atomic_write(dir / "file", "x");
  CHECK_THROWS_WITH(fs::make_private_dir(dir / "file"), Catch::Contains("not a folder"));
  CHECK_THROWS_WITH(fs::make_private_dir(foreign_folder(dir)), Catch::Contains("belongs to user"));
  CHECK_THROWS_AS(fs::make_private_dir(dir / "absent" / "child"), IoError);
}

namespace {

// read_all's answer for `path`, asked in a child process that an alarm kills after two seconds:
// a read that blocks fails the test instead of hanging the suite.
enum class ReadOutcome { kContents, kNothing, kHung };

ReadOutcome read_all_in_child(const std::filesystem::path& path) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(2);
    ::_exit(fs::read_all(path) ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status)) return ReadOutcome::kHung;
  return WEXITSTATUS(status) == 0 ? ReadOutcome::kContents : ReadOutcome::kNothing;
}

}  // namespace

TEST_CASE("read_all reads regular files, through symbolic links too, and refuses FIFOs, devices and big files",
          "[fs]") {
  test::TempDir dir("read");
  fs::atomic_write(dir / "plain", "contents");
  std::filesystem::create_symlink(dir / "plain", dir / "link");
  CHECK(fs::read_all(dir / "plain") == "contents");
  CHECK(fs::read_all(dir / "link") == "contents");
  fs::atomic_write(dir / "empty", "");
  CHECK(fs::read_all(dir / "empty") == "");
  CHECK_FALSE(fs::read_all(dir / "absent"));
  CHECK_FALSE(fs::read_all(dir.path()));

  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(read_all_in_child(dir / "fifo") == ReadOutcome::kNothing);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  // A device never ends: refused before a byte is read, directly or through a link.
  std::filesystem::create_symlink("/dev/zero", dir / "zero");
  CHECK(read_all_in_child("/dev/zero") == ReadOutcome::kNothing);
  CHECK(read_all_in_child(dir / "zero") == ReadOutcome::kNothing);

  CHECK(fs::read_all(dir / "plain", 8) == "contents");  // the cap itself is allowed
  CHECK_FALSE(fs::read_all(dir / "plain", 7));
  CHECK_FALSE(fs::read_all(dir / "link", 7));
}

TEST_CASE("read_all says why it read nothing", "[fs]") {
  test::TempDir dir("read-why");
  fs::atomic_write(dir / "plain", "contents");
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  const std::pair<std::filesystem::path, std::string> cases[] = {
      {dir / "absent", "No such file or directory"},
      {dir.path(), "a folder, not a regular file"},
      {dir / "fifo", "a FIFO, not a regular file"},
      {"/dev/null", "a device, not a regular file"},
  };
  for (const auto& [path, why] : cases) {
    std::string error;
    INFO(path);
    CHECK_FALSE(fs::read_all(path, std::nullopt, &error));
    CHECK(error == why);
  }
  std::string error;
  CHECK_FALSE(fs::read_all(dir / "plain", 7, &error));
  CHECK(error == "larger than 7 bytes");
  error.clear();
  CHECK(fs::read_all(dir / "plain", std::nullopt, &error) == "contents");
  CHECK(error.empty());
}

TEST_CASE("atomic_write says why it cannot make the folder, not that the file's folder is missing", "[fs]") {
  MOEJIT_REQUIRE_USERS();
  test::TempDir dir("write-why");
  CHECK(test::as_reader(dir.path(), [&] {
          try {
            fs::atomic_write(dir / "new" / "file", "x");
            test::expect(false, "wrote into a folder it may not write");
          } catch (const IoError& e) {
            // Once "cannot create .../new/file.tmp...: No such file or directory".
            test::expect(std::string(e.what()) == "cannot create the folder " + (dir / "new").string() +
                                                       ": Permission denied",
                         e.what());
          }
        }) == 0);
}

TEST_CASE("atomic_write steps over temporary files a dead process of the same pid left", "[fs]") {
  test::TempDir dir("reuse");
  // The next temporary name, from the message of a write whose rename fails (onto a folder).
  std::filesystem::create_directories(dir / "busy" / "inside");
  std::string message;
  try {
    fs::atomic_write(dir / "busy", "x");
  } catch (const IoError& e) {
    message = e.what();
  }
  std::smatch m;
  REQUIRE(std::regex_search(message, m, std::regex(R"(busy\.tmp\.(\d+)\.(\d+) to)")));
  CHECK(m[1] == std::to_string(::getpid()));
  const std::uint64_t next = std::stoull(m[2]) + 1;
  for (std::uint64_t n = next; n < next + 8; ++n) {
    std::ofstream(dir / fmt::format("k.tmp.{}.{}", ::getpid(), n)) << "dead";  // not atomic_write: it counts too
  }
  fs::atomic_write(dir / "k", "kernel");
  CHECK(fs::read_all(dir / "k") == "kernel");
  CHECK(fs::read_all(dir / fmt::format("k.tmp.{}.{}", ::getpid(), next)) == "dead");
  // The sweep still knows these names for atomic_write's.
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (std::uint64_t n = next; n < next + 8; ++n) {
    std::filesystem::last_write_time(dir / fmt::format("k.tmp.{}.{}", ::getpid(), n), two_hours_ago);
  }
  fs::remove_stale_temp_files(dir.path(), std::chrono::hours(1));
  CHECK_FALSE(std::filesystem::exists(dir / fmt::format("k.tmp.{}.{}", ::getpid(), next)));
  CHECK(fs::read_all(dir / "k") == "kernel");
}

TEST_CASE("atomic_write makes its folder again when another process removes it, empty, meanwhile", "[fs]") {
  // The kernel cache's sweep removes another build's folder once it is empty, while a process of
  // that build may be about to store into it. Here the folder is removed at most once per store,
  // as soon as it exists: mostly between atomic_write making it and opening a file in it.
  test::TempDir dir("folder-race");
  const auto folder = dir / "build";
  std::atomic<bool> armed{false}, written{false}, done{false};
  std::thread remover([&] {
    while (!done) {
      if (!armed) continue;
      std::error_code ec;
      while (!written && !std::filesystem::remove(folder, ec)) {
      }
      armed = false;
    }
  });
  int failures = 0, removed_first = 0;
  for (int i = 0; i < 2000; ++i) {
    written = false;
    armed = true;
    try {
      fs::atomic_write(folder / "k.cubin", "kernel");
    } catch (const IoError& e) {
      if (failures++ == 0) FAIL_CHECK(e.what());
    }
    written = true;
    while (armed) {
    }
    std::error_code ec;
    removed_first += std::filesystem::remove(folder / "k.cubin", ec);
  }
  done = true;
  remover.join();
  CHECK(failures == 0);
  CHECK(removed_first == 2000);  // every store landed
}
