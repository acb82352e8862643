// moejit: inspect the device, fill the kernel cache, manage tuning databases.
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.hpp"
#include "moejit/error.hpp"

namespace {

const char* kUsage =
    "usage: moejit <command> [options]\n"
    "  info                               device, driver, NVRTC, cache and database paths\n"
    "  compile [--arch sm_90a] [--role R] [--shape E,H,I,K] [--tokens T] [--jobs N]\n"
    "                                     prune and compile a role's configs into the kernel cache\n"
    "  plan [--shape E,H,I,K] [--tokens T] [--mode train|infer|memeff] [--dtype bf16]\n"
    "                                     build a plan on the GPU (self-tuning if allowed); show configs\n"
    "  tune [--shape E,H,I,K] [--tokens T,...] [--modes train,infer,memeff] [--roles R,...] [--db PATH]\n"
    "       [--devices all|0,1,...] [--shard i/n] [--force] [--budget S] [--timing burst|sustained]\n"
    "       [--incumbents TABLE.json]\n"
    "                                     offline tuning into a database, resumable and shardable\n"
    "  bench [--shape E,H,I,K] [--tokens T,...] [--mode M] [--reps N]\n"
    "                                     per role: heuristic default vs the stored (tuned) config\n"
    "  db list [--stale]|export --out F|import F|merge OTHER [--db PATH]\n"
    "                                     inspect and move tuning databases\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  try {
    if (!std::strcmp(cmd, "info")) return moejit::cli::run_info(argc, argv, 2);
    if (!std::strcmp(cmd, "compile")) return moejit::cli::run_compile(argc, argv, 2);
    if (!std::strcmp(cmd, "db")) return moejit::cli::run_db(argc, argv, 2);
    if (!std::strcmp(cmd, "plan")) return moejit::cli::run_plan(argc, argv, 2);
    if (!std::strcmp(cmd, "tune")) return moejit::cli::run_tune(argc, argv, 2);
    if (!std::strcmp(cmd, "bench")) return moejit::cli::run_bench(argc, argv, 2);
    std::fprintf(stderr, "moejit: unknown command '%s'\n%s", cmd, kUsage);
    return 2;
  } catch (const moejit::InvalidArgument& e) {
    std::fprintf(stderr, "moejit %s: %s\n", cmd, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit %s: %s\n", cmd, e.what());
    return 1;
  }
}
