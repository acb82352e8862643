// Test main: isolates every run from the user's tuning state. Unless a variable is already
// set, plans do not self-tune, read a private empty tuning database and no shipped tables, so
// results do not depend on what the machine tuned before. Tests that exercise tuning opt in
// with ScopedEnv.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const auto dir = std::filesystem::temp_directory_path() / ("moejit-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "shipped");
  ::setenv("MOEJIT_AUTOTUNE", "0", 0);
  ::setenv("MOEJIT_DB", (dir / "tuning.sqlite").c_str(), 0);
  ::setenv("MOEJIT_SHIPPED_DB_DIR", (dir / "shipped").c_str(), 0);
  const int rc = Catch::Session().run(argc, argv);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
