// CLI smoke tests: the commands a user runs first, on a machine with or without a GPU.
#include <catch2/catch.hpp>

#include <fstream>

#include "support/process.hpp"
#include "support/temp_dir.hpp"

using moejit::test::cli;
using moejit::test::run_command;
using moejit::test::TempDir;

TEST_CASE("moejit info exits 0 and names the device or its absence", "[cli]") {
  auto r = run_command(cli() + " info");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("nvrtc") && Catch::Contains("kernel cache") && Catch::Contains("device"));
}

TEST_CASE("moejit compile fills the cache, then serves the second run from it", "[cli]") {
  TempDir dir("cli");
  const std::string cmd = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                          " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2";
  auto first = run_command(cmd);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.output, Catch::Contains("compiled") && Catch::Contains("pruned") && Catch::Contains("plan"));
  CHECK_THAT(first.output, Catch::Contains("0 from cache"));
  auto second = run_command(cmd);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, Catch::Contains("0 compiled"));
  CHECK_THAT(second.output, !Catch::Contains(" 0 from cache"));
}

TEST_CASE("moejit rejects bad arguments with exit code 2 and a message", "[cli]") {
  auto r = run_command(cli() + " compile --arch sm_90a --shape 1,2,3");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--shape"));
  r = run_command(cli() + " compile --arch hopper");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("arch"));
  r = run_command(cli() + " compile --bogus");
  CHECK(r.exit_code == 2);
  r = run_command(cli() + " tune --shape 8,256,128,2 --tokens 512 --timing warm --db /nonexistent/x.sqlite");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--timing"));
  for (const char* budget : {"abc", "0", "-5", "nan", "10s", "inf", "1e300"}) {
    r = run_command(cli() + " tune --shape 8,256,128,2 --tokens 512 --budget " + budget + " --db /nonexistent/x.sqlite");
    INFO(budget);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--budget: expected seconds above 0 and at most"));
  }
  r = run_command(cli() + " frobnicate");
  CHECK(r.exit_code == 2);
  r = run_command(cli());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("usage"));
}

TEST_CASE("moejit tune reads --incumbents before it needs a GPU, and names the file it cannot use", "[cli]") {
  const TempDir dir;
  const std::string bad = (dir.path() / "bad.json").string();
  std::ofstream(bad) << "not json";
  const std::string tune = cli() + " tune --shape 8,256,128,2 --tokens 512 --db /nonexistent/x.sqlite --incumbents ";
  auto r = run_command(tune + (dir.path() / "missing.json").string());
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains("--incumbents: cannot read"));
  r = run_command(tune + bad);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains("--incumbents " + bad) && Catch::Contains("not valid JSON"));
  // The shipped table reads: what stops the run is the missing GPU or database, not the table.
  r = run_command(tune + MOEJIT_TEST_SHIPPED_DB_DIR "/NVIDIA_H200.json");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, !Catch::Contains("--incumbents"));
}

TEST_CASE("every driver entry point resolves by name in the toolkit's stub driver", "[cli][driver]") {
  // The stub exports the driver's symbols but is no driver: loading must get past symbol
  // resolution and stop at the version query.
  auto r = run_command("MOEJIT_CUDA_DRIVER=" MOEJIT_CUDA_STUB " " + cli() + " info");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("no GPU") && Catch::Contains("reports version"));
  CHECK_THAT(r.output, !Catch::Contains("lacks"));
}

TEST_CASE("a missing driver library is reported, not fatal", "[cli][driver]") {
  auto r = run_command("MOEJIT_CUDA_DRIVER=/nonexistent/libcuda.so.1 " + cli() + " info");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("no GPU") && Catch::Contains("cannot load /nonexistent/libcuda.so.1"));
}
