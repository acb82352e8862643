// The environment variables the library reads (src/core/env.cpp): a malformed value is an error
// naming the variable, never a silent default or an overflowing deadline.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "core/env.hpp"
#include "core/log.hpp"
#include "moejit/error.hpp"
#include "moejit/moejit.hpp"
#include "support/temp_dir.hpp"

using namespace moejit;
using moejit::test::ScopedEnv;

namespace {

// Drops set_option's settings of these variables when it ends, however the test ended: later
// tests read the environment tests/support/main.cpp set.
class ClearedOptions {
 public:
  ClearedOptions(std::initializer_list<const char*> names) : names_(names) {}
  ~ClearedOptions() {
    for (const char* name : names_) {
      try {
        clear_option(name);
      } catch (...) {  // only allocating could fail, for these known names
      }
    }
  }
  ClearedOptions(const ClearedOptions&) = delete;
  ClearedOptions& operator=(const ClearedOptions&) = delete;

 private:
  std::vector<const char*> names_;
};

unsigned hardware_jobs() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : hw;
}

}  // namespace

TEST_CASE("the tuning budget: seconds above 0 and at most 10^6, from the variable or the CLI", "[env]") {
  CHECK(env::parse_tune_budget_s("30", "--budget") == 30.0);
  CHECK(env::parse_tune_budget_s("2.5", "--budget") == 2.5);
  CHECK(env::parse_tune_budget_s("1e6", "--budget") == env::kMaxTuneBudgetS);
  for (const char* bad : {"", "abc", "0", "-1", "nan", "inf", "1e300", "10s"}) {
    INFO(bad);
    CHECK_THROWS_WITH(env::parse_tune_budget_s(bad, "--budget"), Catch::Contains("--budget"));
  }
  {
    ScopedEnv v("MOEJIT_TUNE_BUDGET_S", "12");
    CHECK(env::tune_budget_s() == 12.0);
  }
  {
    ScopedEnv v("MOEJIT_TUNE_BUDGET_S", "inf");
    CHECK_THROWS_AS(env::tune_budget_s(), InvalidArgument);
  }
}

TEST_CASE("integer variables: out-of-range values are errors, thread counts are capped", "[env]") {
  {
    ScopedEnv v("MOEJIT_JOBS", "99999999999999999999");  // past long long
    CHECK_THROWS_WITH(env::compile_jobs(), Catch::Contains("MOEJIT_JOBS"));
  }
  {
    ScopedEnv v("MOEJIT_JOBS", "4294967296");  // 2^32: once truncated to 0 threads
    CHECK(env::compile_jobs() == 1024);
  }
  {
    ScopedEnv v("MOEJIT_JOBS", "3");
    CHECK(env::compile_jobs() == 3);
  }
  for (const char* none : {"0", "-2"}) {
    ScopedEnv v("MOEJIT_JOBS", none);
    CHECK_THROWS_WITH(env::compile_jobs(), Catch::Contains("MOEJIT_JOBS") && Catch::Contains("positive"));
  }
  {
    ScopedEnv v("MOEJIT_DISK_CACHE", "off");
    CHECK_THROWS_WITH(env::disk_cache_enabled(), Catch::Contains("MOEJIT_DISK_CACHE"));
  }
}

TEST_CASE("the cache folders: the variables in order, the temporary folder last, else none", "[env]") {
  ScopedEnv cache("MOEJIT_CACHE_DIR", ""), db("MOEJIT_DB", ""), xdg("XDG_CACHE_HOME", "/x"), home("HOME", "/h"),
      tmp("TMPDIR", "/nonexistent/moejit-test");
  CHECK(env::kernel_cache_dir() == std::filesystem::path("/x/moejit/kernels"));
  CHECK(env::user_db_path() == std::filesystem::path("/x/moejit/tuning.sqlite"));
  {
    ScopedEnv no_xdg("XDG_CACHE_HOME", "");
    CHECK(env::kernel_cache_dir() == std::filesystem::path("/h/.cache/moejit/kernels"));
    ScopedEnv no_home("HOME", "");
    // The temporary folder does not exist: nothing, not a filesystem error.
    CHECK_FALSE(env::kernel_cache_dir());
    CHECK_FALSE(env::user_db_path());
    ScopedEnv named_cache("MOEJIT_CACHE_DIR", "/c"), named_db("MOEJIT_DB", "/d.sqlite");
    CHECK(env::kernel_cache_dir() == std::filesystem::path("/c"));
    CHECK(env::user_db_path() == std::filesystem::path("/d.sqlite"));
  }
}

TEST_CASE("the temporary folder's cache folder is the user's own, made 0700, and refused when not private",
          "[env]") {
  test::TempDir tmp_dir("tmp");
  ScopedEnv cache("MOEJIT_CACHE_DIR", ""), db("MOEJIT_DB", ""), xdg("XDG_CACHE_HOME", ""), home("HOME", ""),
      tmp("TMPDIR", tmp_dir.path().string());
  const auto root = tmp_dir / ("moejit-cache-" + std::to_string(::geteuid()));
  using std::filesystem::perms;
  SECTION("made on first use, private") {
    CHECK(env::kernel_cache_dir() == root / "kernels");
    CHECK(env::user_db_path() == root / "tuning.sqlite");
    CHECK((std::filesystem::status(root).permissions() & perms::all) == perms::owner_all);
    CHECK(env::kernel_cache_dir() == root / "kernels");  // and used again as it is
  }
  SECTION("made first, writable by all: refused") {
    std::filesystem::create_directory(root);
    std::filesystem::permissions(root, perms::all);
    CHECK_FALSE(env::kernel_cache_dir());
    CHECK_FALSE(env::user_db_path());
  }
  SECTION("made first, writable by its group: refused") {
    std::filesystem::create_directory(root);
    std::filesystem::permissions(root, perms::owner_all | perms::group_all);
    CHECK_FALSE(env::kernel_cache_dir());
  }
  SECTION("a symbolic link to a private folder: refused") {
    std::filesystem::create_directory(tmp_dir / "elsewhere");
    std::filesystem::permissions(tmp_dir / "elsewhere", perms::owner_all);
    std::filesystem::create_directory_symlink(tmp_dir / "elsewhere", root);
    CHECK_FALSE(env::kernel_cache_dir());
    CHECK_FALSE(env::user_db_path());
  }
  SECTION("another user's: refused") {
    if (::geteuid() != 0) {
      WARN("skipped: not root, and only root can give a folder away (test_fs checks \"/\" instead)");
      return;
    }
    std::filesystem::create_directory(root);
    std::filesystem::permissions(root, perms::owner_all);
    REQUIRE(::chown(root.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(env::kernel_cache_dir());
    CHECK_FALSE(env::user_db_path());
  }
}

TEST_CASE("a scoped log level stands in for MOEJIT_LOG on its own thread only, until it ends", "[env]") {
  ScopedEnv v("MOEJIT_LOG", "error");
  CHECK_FALSE(log::enabled(env::LogLevel::kInfo));
  {
    const log::ScopedLevel level(env::LogLevel::kDebug);
    CHECK(log::enabled(env::LogLevel::kDebug));
    bool elsewhere = true;
    std::thread other([&] { elsewhere = log::enabled(env::LogLevel::kInfo); });
    other.join();
    CHECK_FALSE(elsewhere);
  }
  CHECK_FALSE(log::enabled(env::LogLevel::kInfo));
  CHECK(log::enabled(env::LogLevel::kError));
}

TEST_CASE("set_option stands in for the environment, unsetting included, until cleared", "[env][options]") {
  const ClearedOptions cleared{"MOEJIT_JOBS", "MOEJIT_DB"};
  ScopedEnv jobs("MOEJIT_JOBS", "3"), db("MOEJIT_DB", "/env.sqlite"), xdg("XDG_CACHE_HOME", "/x");
  set_option("JOBS", "5");
  set_option("MOEJIT_DB", "/set.sqlite");
  CHECK(env::compile_jobs() == 5);
  CHECK(env::user_db_path() == std::filesystem::path("/set.sqlite"));
  // The environment itself is left alone.
  CHECK(std::string(std::getenv("MOEJIT_JOBS")) == "3");
  CHECK(std::string(std::getenv("MOEJIT_DB")) == "/env.sqlite");

  // Unset: the default, whatever the environment holds; "" is the same, as for a variable.
  set_option("MOEJIT_JOBS", std::nullopt);
  set_option("DB", "");
  CHECK(env::compile_jobs() == hardware_jobs());
  CHECK(env::user_db_path() == std::filesystem::path("/x/moejit/tuning.sqlite"));
  // A null C string unsets too (the C ABI passes one through).
  set_option("DB", "/set.sqlite");
  const char* none = nullptr;
  set_option("DB", none);
  CHECK(env::user_db_path() == std::filesystem::path("/x/moejit/tuning.sqlite"));

  clear_option("JOBS");
  clear_option("MOEJIT_DB");
  clear_option("MOEJIT_DB");  // none left: nothing to do
  CHECK(env::compile_jobs() == 3);
  CHECK(env::user_db_path() == std::filesystem::path("/env.sqlite"));
}

TEST_CASE("set_option refuses unknown names, and values their reader would refuse, when set", "[env][options]") {
  const ClearedOptions cleared{"MOEJIT_AUTOTUNE", "MOEJIT_JOBS", "MOEJIT_TUNE_BUDGET_S", "MOEJIT_DISK_CACHE",
                               "MOEJIT_LOG", "MOEJIT_CHECK_ADOPTED", "MOEJIT_CALL_GRAPHS"};
  for (const char* unknown : {"DBPATH", "MOEJIT_LIBRARY", "db", "MOEJIT_", ""}) {
    INFO(unknown);
    CHECK_THROWS_AS(set_option(unknown, "1"), InvalidArgument);
    CHECK_THROWS_WITH(clear_option(unknown), Catch::StartsWith("name") && Catch::Contains("MOEJIT_DB") &&
                                                 Catch::Contains("MOEJIT_TUNE_BUDGET_S"));
  }
  ScopedEnv autotune("MOEJIT_AUTOTUNE", "0");
  CHECK_THROWS_WITH(set_option("AUTOTUNE", "off"), Catch::StartsWith("MOEJIT_AUTOTUNE"));
  CHECK_FALSE(env::autotune_enabled());  // the refused value was not kept
  CHECK_THROWS_WITH(set_option("JOBS", "0"), Catch::Contains("MOEJIT_JOBS") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(set_option("TUNE_BUDGET_S", "inf"), Catch::Contains("MOEJIT_TUNE_BUDGET_S"));
  CHECK_THROWS_WITH(set_option("DISK_CACHE", "false"), Catch::Contains("MOEJIT_DISK_CACHE"));
  set_option("AUTOTUNE", "1");
  CHECK(env::autotune_enabled());
  ScopedEnv check_adopted("MOEJIT_CHECK_ADOPTED", "1");  // restores the caller's value after
  ::unsetenv("MOEJIT_CHECK_ADOPTED");
  CHECK(env::check_adopted_states());  // unset: checked
  CHECK_THROWS_WITH(set_option("CHECK_ADOPTED", "off"), Catch::StartsWith("MOEJIT_CHECK_ADOPTED"));
  set_option("CHECK_ADOPTED", "0");
  CHECK_FALSE(env::check_adopted_states());
  set_option("CHECK_ADOPTED", "1");
  CHECK(env::check_adopted_states());
  ScopedEnv call_graphs("MOEJIT_CALL_GRAPHS", "1");
  ::unsetenv("MOEJIT_CALL_GRAPHS");
  CHECK(env::call_graphs());  // unset: graphs
  CHECK_THROWS_WITH(set_option("CALL_GRAPHS", "no"), Catch::StartsWith("MOEJIT_CALL_GRAPHS"));
  set_option("CALL_GRAPHS", "0");
  CHECK_FALSE(env::call_graphs());
  set_option("CALL_GRAPHS", "2");
  CHECK(env::call_graphs());
  set_option("TUNE_BUDGET_S", "2.5");
  CHECK(env::tune_budget_s() == 2.5);
  set_option("LOG", "loud");  // read as warn, as from the environment
  CHECK(env::log_level() == env::LogLevel::kWarn);
}
