// CLI smoke tests: the commands a user runs first, on a machine with or without a GPU.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "cuda/device.hpp"
#include "moe/kernel_specs.hpp"
#include "moe/memory_layout.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/users.hpp"
#include "tuner/prune.hpp"

using moejit::test::cli;
using moejit::test::run_command;
using moejit::test::TempDir;

namespace {

// The --options named in `text`, but --help itself.
std::set<std::string> option_names(const std::string& text) {
  std::set<std::string> out;
  const std::regex option("--([a-z][a-z-]*)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), option); it != std::sregex_iterator(); ++it) {
    if ((*it)[1] != "help") out.insert((*it)[1]);
  }
  return out;
}

// The line of `text` that starts with `lead` and the continuation lines after it that open with
// '[' (the description lines below a synopsis name options too, and are not read).
std::string synopsis_in(const std::string& text, const std::string& lead) {
  std::istringstream in(text);
  std::string line, out;
  bool in_synopsis = false;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(' ');
    if (in_synopsis && first != 0 && first != std::string::npos && line[first] == '[') {
      out += line + "\n";
      continue;
    }
    in_synopsis = line.rfind(lead + " ", 0) == 0 || line == lead;
    if (in_synopsis) out += line + "\n";
  }
  return out;
}

// README's CLI section.
std::string readme_cli() {
  std::ifstream in(std::filesystem::path(MOEJIT_TEST_SHIPPED_DB_DIR).parent_path() / "README.md");
  std::string line, out;
  bool in_cli = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_cli = line == "## CLI";
    if (in_cli) out += line + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("moejit info exits 0 and names the device or its absence", "[cli]") {
  auto r = run_command(cli() + " info");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("nvrtc") && Catch::Contains("kernel cache") && Catch::Contains("device"));
}

TEST_CASE("without a folder for the kernel cache or the user database the CLI says so and goes on", "[cli]") {
  const std::string bare = "env -u HOME -u XDG_CACHE_HOME -u MOEJIT_CACHE_DIR -u MOEJIT_DB TMPDIR=/nonexistent/moejit " + cli();
  auto r = run_command(bare + " info");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("kernel cache  (none") && Catch::Contains("tuning db     (none"));
  r = run_command(bare + " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("(disk cache off: no folder for it)") && Catch::Contains("0 failed"));
  r = run_command(bare + " db list");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--db") && Catch::Contains("MOEJIT_DB"));
}

TEST_CASE("moejit compile --jobs stands without reading MOEJIT_JOBS", "[cli]") {
  TempDir dir("cli-jobs");
  auto r = run_command("MOEJIT_JOBS=0 MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                       " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2 --jobs 2");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("on 2 threads"));
  r = run_command("MOEJIT_JOBS=0 MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                  " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains("MOEJIT_JOBS"));
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

TEST_CASE("moejit compile builds the kernels plans of the problem load, in every mode or in --mode's", "[cli]") {
  using namespace moejit;
  const cuda::DeviceInfo device = cuda::fabricated::for_arch("sm_90a");
  // What `compile --role ROLE --shape 8,H,I,2 --tokens T` writes into an empty cache, as readable
  // names (file names without the hash), and what plans of that problem in `modes` load.
  const auto check = [&](Role role, int hidden, int inter, long long tokens, const std::vector<Mode>& modes,
                         const std::string& mode_option) {
    const TempDir dir("cli-variants");
    const MoeProblem p{tokens, 8, hidden, inter, 2, DType::kBF16, Mode::kTraining};
    const auto r = run_command(fmt::format("MOEJIT_CACHE_DIR={} {} compile --arch sm_90a --role {} --shape 8,{},{},2 "
                                           "--tokens {} {}",
                                           dir.path().string(), cli(), role_name(role), hidden, inter, tokens,
                                           mode_option));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::set<std::string> written, planned;
    constexpr std::size_t kHashAndSuffix = std::string_view(".0123456789abcdef.cubin").size();
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path())) {
      const std::string name = f.path().filename().string();
      if (f.is_regular_file()) written.insert(name.substr(0, name.size() - kHashAndSuffix));
    }
    std::map<Role, std::vector<TileConfig>> legal;
    for (const PruneDecision& d : prune_space(role, shape_of(p), device)) {
      if (!d.reason) legal[role].push_back(d.config);
    }
    for (const jit::KernelSpec& spec : plan_kernel_specs(p, modes, legal, "sm_90a")) {
      planned.insert(spec.readable_name());
    }
    CHECK(!planned.empty());
    CHECK(written == planned);
    return written;
  };
  const std::vector<Mode> all = {Mode::kTraining, Mode::kInference, Mode::kMemoryEfficient};
  // H = 260: rows are not 16-byte aligned, so plans load the element-wise kernels.
  for (const std::string& name : check(Role::kGatherSum, 260, 128, 64, all, "")) {
    CHECK_THAT(name, Catch::EndsWith(".unaligned"));
  }
  // T = 4096 of 8,64,64,2: memory-efficient bwd_dw2 recomputes the activation, in kernels of its own.
  REQUIRE(memeff_recomputes_act(shape_of(MoeProblem{4096, 8, 64, 64, 2}), Mode::kMemoryEfficient));
  const auto both = check(Role::kBwdDw2, 64, 64, 4096, all, "");
  const auto fused = check(Role::kBwdDw2, 64, 64, 4096, {Mode::kMemoryEfficient}, "--mode memeff");
  CHECK(both.size() == 2 * fused.size());
  for (const std::string& name : fused) CHECK_THAT(name, Catch::EndsWith(".fused_act"));
  for (const std::string& name : check(Role::kBwdDw2, 64, 64, 4096, {Mode::kTraining}, "--mode train")) {
    CHECK_THAT(name, !Catch::Contains("fused_act"));
  }
}

TEST_CASE("a kernel cache folder that cannot be made is warned about once, not once per kernel", "[cli]") {
  auto r = run_command("MOEJIT_CACHE_DIR=/proc/moejit-nope/kernels " + cli() +
                       " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2");
  INFO(r.output);
  // Compiled, but not stored: filling the cache was the command's job.
  REQUIRE(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("3 compiled") && Catch::Contains("0 failed"));
  CHECK_THAT(r.output, Catch::Contains("3 compiled kernels not stored in the kernel cache: "));
  std::size_t warnings = 0;
  for (std::size_t at = 0; (at = r.output.find("kernel cache not written", at)) != std::string::npos; ++at) ++warnings;
  CHECK(warnings == 1);
  CHECK_THAT(r.output, Catch::Contains("no kernels are stored in /proc/moejit-nope/kernels/") &&
                           Catch::Contains("by this process for 10 minutes, then it tries again"));
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
  r = run_command(cli() + " compile --arch sm_90a --mode infer --role bwd_dw2");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--role: bwd_dw2 does not run in infer mode"));
  r = run_command(cli() + " compile --arch sm_90a --mode training");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--mode: unknown mode 'training'"));
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

TEST_CASE("moejit compile takes the archs from sm_80 that NVRTC targets and refuses others with exit code 2",
          "[cli]") {
  const TempDir dir("cli-arch");
  const std::string compile = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                              " compile --role routing --shape 8,256,128,2 --tokens 64 --arch ";
  for (const char* arch : {"sm_80", "sm_86", "sm_90a"}) {
    const auto r = run_command(compile + arch);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains(" 0 failed"));
  }
  // Pruning dropped every config of sm_75 and the command exited 0 with nothing built.
  for (const char* arch : {"sm_75", "sm_70", "sm_50"}) {
    const auto r = run_command(compile + arch);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(std::string("--arch: ") + arch + ": moejit's kernels need sm_80 or newer"));
  }
  // NVRTC failed each kernel of an arch it does not know (exit 1, once per kernel).
  const auto r = run_command(compile + "sm_81");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--arch: sm_81: NVRTC") && Catch::Contains("cannot target it (sm_80, "));
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
  // So does a table with a row this build cannot read, less that row, named in a warning.
  auto doc = nlohmann::json::parse(std::ifstream(MOEJIT_TEST_SHIPPED_DB_DIR "/NVIDIA_H200.json"));
  const std::size_t last = doc["rows"].size();
  auto newer = doc["rows"][0];
  newer["winner"]["arch_tag"] = "blackwell_gb";
  doc["rows"].push_back(newer);
  const std::string table = (dir.path() / "newer.json").string();
  std::ofstream(table) << doc.dump();
  r = run_command(tune + table);
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains(fmt::format("[moejit warn] --incumbents {}: skipped rows[{}] ({}): ", table,
                                                   last, newer["id"].get<std::string>())) &&
                           Catch::Contains("blackwell_gb"));
  CHECK_THAT(r.output, !Catch::Contains("import into"));
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

TEST_CASE("every moejit command prints its usage for -h and --help and exits 0", "[cli]") {
  for (const std::string command : {"info", "compile", "plan", "tune", "grid", "bench", "db", "db list", "cache",
                                    "cache prune"}) {
    for (const char* help : {"-h", "--help"}) {
      const auto r = run_command(cli() + " " + command + " " + help);
      INFO(command << " " << help << "\n" << r.output);
      CHECK(r.exit_code == 0);
      CHECK_THAT(r.output, Catch::StartsWith("usage: moejit " + command.substr(0, command.find(' '))));
      CHECK_THAT(r.output, !Catch::Contains("unknown option"));
    }
  }
}

TEST_CASE("moejit --help, each command's --help and README's CLI section list the options its parser accepts",
          "[cli]") {
  const std::string overview = run_command(cli() + " --help").output, readme = readme_cli();
  REQUIRE_THAT(readme, Catch::Contains("moejit tune"));
  for (const std::string command : {"info", "compile", "plan", "tune", "grid", "bench", "db", "cache"}) {
    const std::string help =
        synopsis_in(run_command(cli() + " " + command + " --help").output, "usage: moejit " + command);
    const std::set<std::string> documented = option_names(help);
    INFO(command << "\n--help:\n" << help << "moejit --help:\n" << synopsis_in(overview, "  " + command)
                 << "README:\n" << synopsis_in(readme, "moejit " + command));
    CHECK(!help.empty());
    CHECK(option_names(synopsis_in(overview, "  " + command)) == documented);
    CHECK(option_names(synopsis_in(readme, "moejit " + command)) == documented);
    if (command == "db" || command == "cache") continue;  // their options follow a subcommand
    for (const std::string& name : documented) {
      // The parser stops at the first unknown option: reaching the probe means --name was taken,
      // and nothing runs. A flag refuses the value, naming itself; without it, it is taken too.
      auto r = run_command(cli() + " " + command + " --" + name + "=1 --not-an-option");
      if (r.output.find("--" + name + ": takes no value") != std::string::npos) {
        r = run_command(cli() + " " + command + " --" + name + " --not-an-option");
      }
      INFO("--" << name << ": " << r.output);
      CHECK_THAT(r.output, Catch::Contains("--not-an-option: unknown option"));
    }
  }
}

TEST_CASE("moejit rejects integers that do not fit, trailing text and empty lists with exit code 2", "[cli]") {
  const TempDir dir("cli-ints");
  const std::string env = "MOEJIT_CACHE_DIR=" + dir.path().string() + " MOEJIT_AUTOTUNE=0 " + cli();
  const std::string compile = env + " compile --arch sm_90a --role routing ";
  const std::string tune = env + " tune --shape 8,256,128,2 --tokens 512 --db /nonexistent/x.sqlite ";
  const std::pair<std::string, std::string> cases[] = {
      // 2^32 + 128 once wrapped to E=128.
      {compile + "--shape 4294967424,2048,768,8 --tokens 64", "--shape: 4294967424 is out of range"},
      {compile + "--shape 8,256,128,2 --tokens 99999999999999999999", "--tokens: 99999999999999999999 is too large"},
      {compile + "--shape 8,256,128,2 --tokens -99999999999999999999",
       "--tokens: -99999999999999999999 is out of range (at least 1)"},
      {compile + "--shape 8,256,128,2, --tokens 64", "--shape: empty item"},
      {compile + "--shape 8,256,128,2 --tokens 64 --jobs=", "--jobs: needs a value"},
      {compile + "--shape 8,256,128,2 --tokens 64 --jobs 2x", "--jobs: expected an integer, got '2x'"},
      {env + " plan --shape 8,256,128,2 --tokens 64 --device=", "--device: needs a value"},
      {env + " plan --shape 8,256,128,2 --tokens 64 --device 1x", "--device: expected an integer, got '1x'"},
      {env + " bench --shape 8,256,128,2 --tokens 64 --reps=", "--reps: needs a value"},
      {env + " bench --shape 8,256,128,2 --tokens 64, --reps 3", "--tokens: empty item"},
      {tune + "--shard 1x/4", "--shard: expected an integer, got '1x'"},
      {tune + "--shard 0/4x", "--shard: expected an integer, got '4x'"},
      {tune + "--shard 4/4", "--shard: 4 is out of range (0 to 3)"},
      {tune + "--devices=", "--devices: needs a value"},
      {tune + "--modes=", "--modes: needs a value"},
      {tune + "--roles=routing,", "--roles: empty item"},
      // Problems the library refuses are refused before anything compiles or tunes.
      {compile + "--shape 5000,2048,768,8 --tokens 64", "--shape: experts: must be in [1, 4096]"},
      {compile + "--shape 8,256,128,8 --tokens 4611686018427387904", "--tokens: tokens: tokens * topk"},
      {env + " tune --shape 8,256,128,2 --db /nonexistent/x.sqlite --tokens 512,4611686018427387904",
       "--tokens: tokens: tokens * topk"},
      {env + " bench --shape 8,268435456,128,2 --tokens 64", "--shape: hidden: must stay below 2^28"},
      // A forgotten option name is not ignored: "4096" for "--tokens 4096".
      {compile + "--shape 8,256,128,2 4096", "4096: unexpected argument"},
      {env + " info extra", "extra: unexpected argument"},
      {tune + "-j 4", "-j: unexpected argument"},
      {tune + "--devices 0,1,0", "--devices: device 0 is listed twice"},
  };
  for (const auto& [command, message] : cases) {
    const auto r = run_command(command);
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
  }
}

TEST_CASE("moejit compile and plan reject a --tokens list rather than use only its first count", "[cli]") {
  const TempDir dir("cli-tokens");
  const std::string env = "MOEJIT_CACHE_DIR=" + dir.path().string() + " MOEJIT_AUTOTUNE=0 " + cli();
  for (const std::string command : {" compile --arch sm_90a --role routing", " plan"}) {
    const auto r = run_command(env + command + " --shape 8,256,128,2 --tokens 5,99");
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--tokens: takes one value here, got '5,99'"));
  }
}

TEST_CASE("moejit grid prints moejit tune's default token counts, without a GPU", "[cli]") {
  // Qwen3-30B-A3B's keys, as tuner/tune_plan's unit test works them out.
  auto r = run_command(cli() + " grid --shape 128,2048,768,8");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output == "144,256,352,512,784,1024,2048,4096,8192,16384,32768\n");
  r = run_command(cli() + " grid --shape 8,4096,14336,9");  // K > E
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("topk"));
}

TEST_CASE("moejit cache lists the kernel cache per build and prunes other builds' kernels", "[cli][cache]") {
  TempDir dir("cli-cache");
  const auto other = dir / "0123456789abcdef-fedcba9876543210";
  std::filesystem::create_directories(other);
  for (const char* name : {"routing.a.sm_90a.0123456789abcdef.cubin", "routing.b.sm_90a.0123456789abcdef.cubin"}) {
    std::ofstream(other / name) << std::string(1 << 20, 'k');
  }
  std::ofstream(dir / "routing.flat.sm_90a.0123456789abcdef.cubin") << "flat";
  std::ofstream(dir / "notes.txt") << "not the cache's";
  // This build's folder, filled by compiling one routing config.
  REQUIRE(run_command("MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                      " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2 --jobs 1")
              .exit_code == 0);
  auto r = run_command(cli() + " cache list --dir " + dir.path().string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(std::regex_search(r.output, std::regex("\\n0123456789abcdef-fedcba9876543210 +2 +2\\.0  ")));
  CHECK(std::regex_search(r.output, std::regex("\\n\\(no subfolder: before 2026-12-02\\) +1 +0\\.0  ")));
  CHECK(std::regex_search(r.output, std::regex("\\n[0-9a-f]{16}-[0-9a-f]{16} +[1-9][0-9]* .*  this build\\n")));

  r = run_command(cli() + " cache prune --dir " + dir.path().string());
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::StartsWith("removed 3 kernel files of other builds"));
  CHECK_FALSE(std::filesystem::exists(other));
  CHECK(std::filesystem::exists(dir / "notes.txt"));
  r = run_command(cli() + " cache list --dir " + dir.path().string());
  CHECK_THAT(r.output, Catch::Contains("this build"));
  CHECK_THAT(r.output, !Catch::Contains("0123456789abcdef-"));
  CHECK_THAT(r.output, !Catch::Contains("no subfolder"));

  // A --dir that is not a folder (a typo) is an error, not an empty cache; the library's own
  // folder, before anything is compiled into it, is empty.
  for (const std::string sub : {"list", "prune"}) {
    for (const auto& wrong : {dir / "absent", dir / "notes.txt"}) {
      r = run_command(cli() + " cache " + sub + " --dir " + wrong.string());
      INFO(r.output);
      CHECK(r.exit_code == 1);
      CHECK_THAT(r.output, Catch::Contains("moejit cache: no kernel cache folder at " + wrong.string()));
      CHECK_THAT(r.output, !Catch::Contains("removed") && !Catch::Contains("(empty)"));
    }
    r = run_command(cli() + " cache " + sub + " --dir=");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--dir: needs a value"));
  }
  CHECK_FALSE(std::filesystem::exists(dir / "absent"));
  r = run_command("MOEJIT_CACHE_DIR=" + (dir / "absent").string() + " " + cli() + " cache list");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("(empty)"));
  CHECK(run_command(cli() + " cache frobnicate").exit_code == 2);
  CHECK(run_command(cli() + " cache").exit_code == 2);
  CHECK(run_command(cli() + " cache list extra --dir " + dir.path().string()).exit_code != 0);
}

TEST_CASE("moejit refuses a flag given a value and an option given twice, with exit code 2", "[cli]") {
  const TempDir dir("cli-repeat");
  const std::string env = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli();
  const std::string db = " --db " + (dir / "x.sqlite").string();
  const std::pair<std::string, std::string> cases[] = {
      // The value was ignored and the flag turned on: "--force=false" forced.
      {env + " tune --force=false" + db, "--force: takes no value, got 'false'"},
      {env + " db list --stale=no" + db, "--stale: takes no value, got 'no'"},
      {env + " db list --stale= " + db, "--stale: takes no value, got ''"},
      {env + " tune --force --force" + db, "--force: given more than once"},
      // The last value won.
      {env + " tune --tokens 1024 --tokens 8192" + db, "--tokens: given more than once"},
      {env + " db export --out a.json --out b.json" + db, "--out: given more than once"},
      {env + " compile --arch sm_90a --arch=sm_80", "--arch: given more than once"},
      {env + " cache list --dir " + dir.path().string() + " --dir " + dir.path().string(),
       "--dir: given more than once"},
  };
  for (const auto& [command, message] : cases) {
    const auto r = run_command(command);
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
  }
  CHECK_FALSE(std::filesystem::exists(dir / "x.sqlite"));
}

TEST_CASE("moejit refuses an empty --db rather than write into a temporary database SQLite deletes", "[cli]") {
  const TempDir dir("cli-empty-db");
  const std::string json = (dir / "rows.json").string();
  std::ofstream(json) << R"({"schema_version": 4, "rows": []})";
  for (const std::string& command : {"db import " + json, "db merge " + json, std::string("db list"),
                                     std::string("db prune"), std::string("db export --out -"),
                                     std::string("tune --shape 8,256,128,2 --tokens 512")}) {
    for (const char* empty : {" --db=", " --db ''"}) {
      const auto r = run_command("cd " + dir.path().string() + " && " + cli() + " " + command + empty);
      INFO(command << empty << "\n" << r.output);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.output, Catch::Contains("--db: needs a value"));
    }
  }
}

TEST_CASE("moejit names the option the user typed in the library parsers' errors", "[cli]") {
  const TempDir dir("cli-labels");
  const std::string env = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli();
  const std::string tune = env + " tune --shape 8,256,128,2 --tokens 512 --db /nonexistent/x.sqlite ";
  const std::pair<std::string, std::string> cases[] = {
      {tune + "--modes train,training", "--modes: unknown mode 'training'"},
      {tune + "--roles routing,fwd", "--roles: unknown role 'fwd'"},
      {tune + "--dtype fp8", "--dtype: unknown dtype 'fp8'"},
      {env + " compile --arch sm_90a --role fwd", "--role: unknown role 'fwd'"},
      {env + " compile --arch hopper", "--arch: expected an architecture like sm_90a or sm_80, got 'hopper'"},
      {env + " grid --shape 8,256,128,2 --dtype fp8", "unknown option"},
  };
  for (const auto& [command, message] : cases) {
    const auto r = run_command(command);
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
  }
}

TEST_CASE("moejit compile --arch takes sm_ and digits with an optional a, nothing else", "[cli]") {
  for (const char* arch : {"sm_+90", "90", "'sm_ 90'", "sm_-90", "sm_90b", "sm_90aa", "sm_", "sm_a", "SM_90"}) {
    const auto r = run_command(cli() + " compile --role routing --shape 8,256,128,2 --tokens 64 --arch " + arch);
    INFO(arch << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--arch: expected an architecture like sm_90a or sm_80"));
  }
}

TEST_CASE("moejit compile --jobs is capped as MOEJIT_JOBS is, and the threads it used are printed", "[cli]") {
  const TempDir dir("cli-jobs-cap");
  const std::string compile = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + cli() +
                              " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2 ";
  // Three kernels: three threads, whatever the count asked.
  for (const char* jobs : {"--jobs 4294967295", "--jobs 4294967296", "--jobs 1000000"}) {
    const auto r = run_command(compile + jobs);
    INFO(jobs << "\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("3 compiled") || Catch::Contains("3 from cache"));
    CHECK_THAT(r.output, Catch::Contains(" on 3 threads"));
  }
  auto r = run_command(compile + "--jobs 1");
  CHECK_THAT(r.output, Catch::Contains(" on 1 thread\n"));
  r = run_command(compile + "--jobs 0");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--jobs: expected a positive count, got 0"));
}

TEST_CASE("moejit compile exits 1 when the kernels it compiled cannot be stored, and says why", "[cli]") {
  MOEJIT_REQUIRE_USERS();
  const TempDir dir("cli-unwritable");
  const std::string cache = (dir / "kernels").string();
  // A folder the user may not write: the cache folder in it cannot be made (EACCES, once reported
  // as the ENOENT of the file in the folder that was never made).
  CHECK(moejit::test::as_reader(dir.path(), [&] {
          const auto r = run_command("MOEJIT_CACHE_DIR=" + cache + " " + cli() +
                                     " compile --arch sm_90a --role routing --tokens 64 --shape 8,256,128,2");
          moejit::test::expect(r.exit_code == 1, "exit code " + std::to_string(r.exit_code) + "\n" + r.output);
          moejit::test::expect(r.output.find("3 compiled kernels not stored in the kernel cache: cannot create the "
                                             "folder " + cache) != std::string::npos &&
                                   r.output.find("Permission denied") != std::string::npos &&
                                   r.output.find("No such file") == std::string::npos,
                               r.output);
        }) == 0);
  CHECK_FALSE(std::filesystem::exists(cache));
}

TEST_CASE("moejit cache list and prune report what they cannot read or remove, and exit 1", "[cli][cache]") {
  MOEJIT_REQUIRE_USERS();
  using moejit::test::expect;
  using moejit::test::running_as_root;
  namespace stdfs = std::filesystem;
  const TempDir dir("cli-cache-denied");
  const auto other = dir / "0123456789abcdef-fedcba9876543210";
  stdfs::create_directories(other);
  const auto file = other / "routing.a.sm_90a.0123456789abcdef.cubin";
  std::ofstream(file) << "kernel";
  const std::string list = cli() + " cache list --dir " + dir.path().string();
  const std::string prune = cli() + " cache prune --dir " + dir.path().string();

  // Prune as a user who may not write the folder: the file stays, and the command says so.
  CHECK(moejit::test::as_reader(other, [&] {
          const auto r = run_command(prune);
          expect(r.exit_code == 1, "exit code " + std::to_string(r.exit_code) + "\n" + r.output);
          expect(r.output.find("removed 0 kernel files") != std::string::npos &&
                     r.output.find("moejit cache: cannot remove " + file.string() + ": Permission denied") !=
                         std::string::npos,
                 r.output);
        }) == 0);
  CHECK(stdfs::exists(file));

  // List and prune a folder the user may not read: another user's 0700 folder as root, this
  // user's own with its read bit off otherwise. It once listed as empty and pruned "0", exit 0.
  stdfs::permissions(other, running_as_root() ? stdfs::perms::owner_all
                                              : stdfs::perms::owner_write | stdfs::perms::owner_exec);
  const int code = moejit::test::run_as_user(
      running_as_root() ? std::optional<uid_t>(moejit::test::kReaderUid) : std::nullopt, [&] {
        for (const std::string& command : {list, prune}) {
          const auto r = run_command(command);
          expect(r.exit_code == 1, command + ": exit code " + std::to_string(r.exit_code) + "\n" + r.output);
          expect(r.output.find("moejit cache: cannot read " + other.string() + ": Permission denied") !=
                     std::string::npos,
                 r.output);
        }
      });
  stdfs::permissions(other, stdfs::perms::owner_all);
  CHECK(code == 0);
  CHECK(stdfs::exists(file));
  // Readable and writable again, both succeed.
  CHECK(run_command(list).exit_code == 0);
  CHECK(run_command(prune).exit_code == 0);
  CHECK_FALSE(stdfs::exists(other));
}

TEST_CASE("moejit exits 1 when its output cannot be written", "[cli]") {
  // Short outputs, which stdio writes only at exit.
  for (const std::string command : {"grid", "info", "--help", "compile --help"}) {
    // stdout alone to the full device: the message reaches the test through stderr.
    const auto r = run_command(fmt::format("({} {} > /dev/full)", cli(), command));
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("moejit: cannot write the output: No space left on device"));
  }
}

TEST_CASE("moejit info reports every invalid setting, finishes, and exits 2", "[cli]") {
  auto r = run_command("MOEJIT_DISK_CACHE=off MOEJIT_JOBS=0 MOEJIT_TUNE_BUDGET_S=soon " + cli() + " info");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("kernel cache") && Catch::Contains("(MOEJIT_DISK_CACHE is invalid: below)") &&
                           Catch::Contains("tuning db") && Catch::Contains("\ndevice "));
  CHECK_THAT(r.output, Catch::Contains("\ninvalid       MOEJIT_DISK_CACHE: expected an integer, got 'off'\n") &&
                           Catch::Contains("\ninvalid       MOEJIT_JOBS: expected a positive count, got 0\n") &&
                           Catch::Contains("\ninvalid       MOEJIT_TUNE_BUDGET_S: expected seconds"));
  r = run_command("MOEJIT_DISK_CACHE=0 " + cli() + " info");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("(disabled by MOEJIT_DISK_CACHE=0)") && !Catch::Contains("invalid"));
}

TEST_CASE("moejit's --help and README's CLI section state the defaults", "[cli]") {
  const std::string readme = readme_cli();
  const std::pair<std::string, std::vector<std::string>> helps[] = {
      {"compile", {"--tokens T           default 8192", "--shape E,H,I,K      default 128,2048,768,8",
                   "--dtype D            default bf16", "default $MOEJIT_JOBS"}},
      {"plan", {"--tokens T           default 8192", "--mode M             default train"}},
      {"tune", {"--modes M,...        default train,infer (memeff only where named)"}},
      {"bench", {"--tokens T,...       default 1024,8192,32768", "default train", "default 20"}},
      {"db", {"a regular file"}},
  };
  for (const auto& [command, defaults] : helps) {
    const std::string help = run_command(cli() + " " + command + " --help").output;
    for (const std::string& text : defaults) {
      INFO(command << " --help:\n" << help);
      CHECK_THAT(help, Catch::Contains(text));
    }
  }
  for (const char* text : {"T defaults to 8192, the mode to train", "without --modes, train and infer",
                           "T defaults to 1024,8192,32768", "`--shape` defaults to", "`--dtype` to bf16",
                           "import takes a regular file (not '-')"}) {
    CHECK_THAT(readme, Catch::Contains(text));
  }
}
