// core/fs: the lock's deadline and the sweep of temporary files that dead writers left.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "core/fs.hpp"
#include "moejit/error.hpp"
#include "support/temp_dir.hpp"

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
