// moejit: inspect the device, fill the kernel cache, manage tuning databases.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.hpp"
#include "moejit/error.hpp"

namespace {

using namespace moejit::cli;

// One subcommand. `options` lists exactly what its parser accepts; `moejit --help`,
// `moejit <name> --help` and README's CLI section all show it, so keep the three in step.
struct Command {
  const char* name;
  int (*run)(int argc, char** argv, int start);
  const char* options;  // '\n' continues the synopsis on an indented line
  const char* summary;
  const char* details;  // printed after the summary by `moejit <name> --help` only
};

constexpr Command kCommands[] = {
    {"info", run_info, "", "device, driver, NVRTC, cache and database paths",
     "  exit 2 when a MOEJIT_ variable holds a value moejit refuses, after the rest, each named\n"},
    {"compile", run_compile,
     "[--arch sm_90a] [--role R] [--shape E,H,I,K] [--tokens T] [--dtype bf16|fp16] [--mode train|infer|memeff]\n"
     "[--jobs N]",
     "prune and compile a role's configs into the kernel cache (no GPU needed)",
     "  --arch A             sm_ and the digits of a compute capability, an optional a (sm_80, sm_90a);\n"
     "                       default the GPU here's\n"
     "  --role R             default every role the modes run\n"
     "  --tokens T           default 8192\n"
     "  --mode M             only the kernels plans of mode M load; default all three modes' (they\n"
     "                       share most: infer runs the forward roles alone; memeff's bwd_dw2 has a\n"
     "                       kernel of its own where it recomputes the activation, at very large T)\n"
     "  --jobs N             NVRTC threads, at most 1024; default $MOEJIT_JOBS or the hardware threads\n"
     "  exit 1 when a config fails to compile or a compiled kernel cannot be stored in the cache\n"},
    {"plan", run_plan, "[--shape E,H,I,K] [--tokens T] [--mode train|infer|memeff] [--dtype bf16|fp16] [--device N]",
     "build a plan on the GPU (self-tuning if allowed); show configs",
     "  --tokens T           default 8192\n"
     "  --mode M             default train\n"
     "  --device N           default 0\n"},
    {"tune", run_tune,
     "[--shape E,H,I,K] [--tokens T,...] [--dtype bf16|fp16] [--modes train,infer,memeff] [--roles R,...]\n"
     "[--db PATH] [--devices all|0,1,...] [--shard i/n] [--force] [--budget S] [--timing burst|sustained]\n"
     "[--incumbents TABLE.json]",
     "offline tuning into a database, resumable and shardable",
     "  --tokens T,...       default: for every tuning key (tokens-per-expert bucket, token tile\n"
     "                       height) a T up to 32768 reaches, the largest such T\n"
     "  --modes M,...        default train,infer (memeff only where named)\n"
     "  --roles R,...        default every role\n"
     "  --db PATH            default $MOEJIT_DB or the user cache; made where it does not exist\n"
     "  --devices D          default all: one worker per visible GPU\n"
     "  --shard i/n          this run's share: items i, i+n, ... (from 0); default every item\n"
     "  --force              tune again the keys this build has tuned whole\n"
     "  --budget S           seconds each item's tuning may take; default $MOEJIT_TUNE_BUDGET_S or 60\n"
     "  --timing T           default burst\n"
     "  --incumbents F       a moejit db export, a regular file: its winners stay where they tie\n"},
    {"grid", run_grid, "[--shape E,H,I,K]", "the token counts moejit tune takes by default (no GPU needed)", ""},
    {"bench", run_bench, "[--shape E,H,I,K] [--tokens T,...] [--dtype bf16|fp16] [--mode M] [--reps N] [--device N]",
     "per role: heuristic default vs the stored (tuned) config",
     "  --tokens T,...       default 1024,8192,32768\n"
     "  --mode M             train, infer or memeff; default train\n"
     "  --reps N             launches timed per config, their median shown; default 20\n"
     "  --device N           default 0\n"},
    {"db", run_db, "list [--stale]|export --out F|import F|merge OTHER|prune [--db PATH]",
     "inspect and move tuning databases",
     "  list [--stale]       one line per tuned key and build: winner, median, candidates, build\n"
     "                       (template hash/NVRTC), time stamp; --stale: only other builds' rows\n"
     "  export --out F       write every row as diffable JSON to F ('-': stdout), not the database\n"
     "  import F             merge a JSON export in, all rows or none; F is a regular file ('-' is\n"
     "                       no stdin); per key and build a row tuned whole stays over one cut\n"
     "                       short (a first call's, a budget's), then the faster winner\n"
     "  merge OTHER          merge another tuning database file in, likewise\n"
     "  prune                delete the rows of every build but this one\n"
     "  --db PATH            the database to act on; default $MOEJIT_DB or the user cache. import\n"
     "                       and merge make it where it does not exist, once their source reads;\n"
     "                       export and prune need it (exit 1), and so does list where --db names it\n"},
    {"cache", run_cache, "list|prune [--dir PATH]", "inspect the kernel cache and remove other builds' kernels",
     "  list                 one line per build (template hash-NVRTC build): files, MiB, last use\n"
     "  prune                delete the kernels of every build but this one (unused or not)\n"
     "  --dir PATH           the cache folder; default the library's ($MOEJIT_CACHE_DIR, ...)\n"
     "  exit 1 when a file or folder there cannot be read or removed, each named\n"},
};

// `prefix`, the name and its options, continuation lines aligned under the first option.
std::string synopsis(const char* prefix, const Command& c) {
  std::string text = std::string(prefix) + c.name + (*c.options ? " " : "");
  const std::size_t indent = text.size();
  for (const char* p = c.options; *p; ++p) {
    text += *p;
    if (*p == '\n') text.append(indent, ' ');
  }
  return text;
}

void print_overview(std::FILE* out) {
  constexpr std::size_t kSummaryColumn = 37;
  std::fputs("usage: moejit <command> [options]   (moejit <command> --help: that command's usage)\n", out);
  for (const Command& c : kCommands) {
    const std::string text = synopsis("  ", c);
    // The summary beside a short synopsis (info's), else on a line of its own.
    const bool beside = text.size() < kSummaryColumn && text.find('\n') == std::string::npos;
    std::fprintf(out, "%s%s%*s%s\n", text.c_str(), beside ? "" : "\n",
                 static_cast<int>(beside ? kSummaryColumn - text.size() : kSummaryColumn), "", c.summary);
  }
}

const Command* find_command(const char* name) {
  for (const Command& c : kCommands) {
    if (!std::strcmp(c.name, name)) return &c;
  }
  return nullptr;
}

bool is_help(const char* arg) { return !std::strcmp(arg, "-h") || !std::strcmp(arg, "--help"); }

}  // namespace

namespace moejit::cli {

void print_usage(const char* command, std::FILE* out) {
  const Command* c = find_command(command);
  std::fprintf(out, "%s\n  %s\n", synopsis("usage: moejit ", *c).c_str(), c->summary);
  // The problem options' defaults, the same in every command that takes them.
  if (std::strstr(c->options, "--shape")) std::fputs("  --shape E,H,I,K      default 128,2048,768,8 (Qwen3-30B-A3B)\n", out);
  if (std::strstr(c->options, "--dtype")) std::fputs("  --dtype D            default bf16\n", out);
  std::fputs(c->details, out);
}

int help_or_unknown_subcommand(const char* command, const std::string& sub) {
  if (sub == "help") {
    print_usage(command, stdout);
    return 0;
  }
  if (!sub.empty()) std::fprintf(stderr, "moejit %s: unknown subcommand '%s'\n", command, sub.c_str());
  print_usage(command, stderr);
  return 2;
}

}  // namespace moejit::cli

namespace {

// The command's exit code; what it printed may still wait in stdout's buffer.
int dispatch(int argc, char** argv) {
  if (argc < 2 || is_help(argv[1]) || !std::strcmp(argv[1], "help")) {
    print_overview(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  const Command* c = find_command(cmd);
  if (c == nullptr) {
    std::fprintf(stderr, "moejit: unknown command '%s'\n", cmd);
    print_overview(stderr);
    return 2;
  }
  // Help wins wherever it appears, before any option is checked or any work starts.
  for (int i = 2; i < argc; ++i) {
    if (is_help(argv[i])) {
      print_usage(cmd, stdout);
      return 0;
    }
  }
  try {
    return c->run(argc, argv, 2);
  } catch (const moejit::InvalidArgument& e) {
    std::fprintf(stderr, "moejit %s: %s\n", cmd, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit %s: %s\n", cmd, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int code = dispatch(argc, argv);
  // A short output is written only here, from stdio's buffer: a write that fails (a full disk) would
  // otherwise pass unnoticed, with exit code 0.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int error = errno;
    std::fprintf(stderr, "moejit: cannot write the output%s%s\n", error ? ": " : "", error ? std::strerror(error) : "");
    return code == 0 ? 1 : code;
  }
  return code;
}
