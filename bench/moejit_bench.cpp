// moejit_bench: times the fused MoE steps against a dense cuBLAS ceiling of equal FLOPs on the
// same GPU, per token count, and prints a compact table (plus, optionally, a JSON file).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"
#include "dense_ceiling.hpp"
#include "inputs.hpp"
#include "moe_steps.hpp"
#include "moejit/error.hpp"
#include "moejit/moejit.hpp"
#include "report.hpp"
#include "steps.hpp"
#include "support/green_context.hpp"
#include "timing.hpp"

namespace moejit::bench {
namespace {

const char* kUsage =
    "usage: moejit_bench [options]\n"
    "  --shape E,H,I,K          experts, hidden, intermediate, top-k (default 128,2048,768,8: Qwen3-30B-A3B)\n"
    "  --tokens T,...           token counts (default 128,1024,8192,32768)\n"
    "  --modes M,...            forward, backward, full, inference, memeff, frozen (a full step without weight\n"
    "                           gradients) (default forward,backward,full,inference)\n"
    "  --dtype bf16|fp16        storage type (default bf16)\n"
    "  --routing uniform|balanced|zipf:S|zipf-shuffled:S\n"
    "                           expert choice per token: uniform, every expert within one pair of T*K/E,\n"
    "                           or Zipf with exponent S, expert 0 the most popular or (zipf-shuffled) the\n"
    "                           popularity ranks on experts in a random order (default uniform)\n"
    "  --warmup N               untimed iterations before each round's timing of a step (default 5, at least 1)\n"
    "  --iters N                timed iterations per step, over all rounds (default 20)\n"
    "  --rounds N               rounds that each time every mode and dense sequence in turn, each step beside\n"
    "                           its dense sequence and the order rotated by one per round, so clock changes\n"
    "                           under load hit all of them alike (default 4, or --iters if fewer)\n"
    "  --json FILE              write every number, device, driver, date and command line to FILE\n"
    "  --override ROLE=CONFIG ...  force a kernel config (Options::config_overrides); repeatable\n"
    "  --sms N                  run every step and dense sequence on a green context of at least N SMs (the\n"
    "                           driver rounds up to its partition size; needs a 12.5 or newer driver)\n"
    "  --no-check               skip the check of each step: after the timing, one more step on input set 0,\n"
    "                           its outputs poisoned first, sampled against an fp64 host reference (a failed\n"
    "                           check exits 1). For timing a deliberately partial variant, one that skips work\n"
    "                           and so writes wrong outputs by design\n"
    "  -h, --help               this text\n"
    "Prints, per token count and mode: median/min/p90 ms, TFLOP/s, the dense cuBLAS ceiling of equal\n"
    "FLOPs, ratio = dense_ms / ms and whether the step's outputs checked out. Needs an NVIDIA GPU.\n";

constexpr std::uint64_t kSeed = 20240611;

struct Args {
  MoeProblem problem{0, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  std::vector<long long> tokens{128, 1024, 8192, 32768};
  std::vector<StepKind> steps{StepKind::kForward, StepKind::kBackward, StepKind::kFull, StepKind::kInference};
  RoutingSpec routing;
  int warmup = 5, iters = 20, rounds = 4;
  int sms = 0;  // 0: the whole device
  bool check = true;
  std::string json;
  Options options;
  bool help = false;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

long long positive(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1) {
    throw InvalidArgument(option, "expected positive integers, got '" + text + "'");
  }
  return v;
}

void add_override(Args& a, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    throw InvalidArgument("--override", "expected ROLE=CONFIG, got '" + text + "'");
  }
  a.options.config_overrides[text.substr(0, eq)] = text.substr(eq + 1);
}

Args parse_args(int argc, char** argv) {
  Args a;
  bool rounds_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    if (name == "-h" || name == "--help") {
      a.help = true;
      continue;
    }
    if (name == "--no-check") {
      a.check = false;
      continue;
    }
    if (name.rfind("--", 0) != 0) throw InvalidArgument(name, "unexpected argument");
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) throw InvalidArgument(name, "needs a value");
      value = argv[++i];
    }
    if (name == "--shape") {
      const auto parts = split(value);
      if (parts.size() != 4) throw InvalidArgument(name, "expected E,H,I,K, got '" + value + "'");
      std::vector<int> v;
      for (const auto& s : parts) v.push_back(static_cast<int>(std::min<long long>(positive(name, s), 1 << 30)));
      a.problem.experts = v[0];
      a.problem.hidden = v[1];
      a.problem.intermediate = v[2];
      a.problem.topk = v[3];
    } else if (name == "--tokens") {
      a.tokens.clear();
      for (const auto& s : split(value)) a.tokens.push_back(positive(name, s));
    } else if (name == "--modes") {
      a.steps.clear();
      for (const auto& s : split(value)) a.steps.push_back(parse_step(s));
    } else if (name == "--dtype") {
      a.problem.dtype = parse_dtype(value);
    } else if (name == "--routing") {
      a.routing = parse_routing(value);
    } else if (name == "--warmup") {
      a.warmup = static_cast<int>(std::min<long long>(positive(name, value), 1 << 20));
    } else if (name == "--iters") {
      a.iters = static_cast<int>(std::min<long long>(positive(name, value), 1 << 20));
    } else if (name == "--rounds") {
      rounds_given = true;
      a.rounds = static_cast<int>(std::min<long long>(positive(name, value), 1 << 20));
    } else if (name == "--sms") {
      a.sms = static_cast<int>(std::min<long long>(positive(name, value), 1 << 20));
    } else if (name == "--json") {
      a.json = value;
    } else if (name == "--override") {
      add_override(a, value);
      // More ROLE=CONFIG words may follow one --override.
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("-", 0) != 0) add_override(a, argv[++i]);
    } else {
      throw InvalidArgument(name, "unknown option");
    }
  }
  if (a.tokens.empty()) throw InvalidArgument("--tokens", "needs at least one token count");
  if (a.steps.empty()) throw InvalidArgument("--modes", "needs at least one mode");
  if (!rounds_given) a.rounds = std::min(a.rounds, a.iters);  // a short --iters alone still runs
  if (a.rounds > a.iters) throw InvalidArgument("--rounds", "must not exceed --iters");
  if (a.problem.topk > a.problem.experts) throw InvalidArgument("--shape", "K must not exceed E");
  return a;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(fmt::format("{} failed: {} ({})", what, cudaGetErrorName(status),
                                         cudaGetErrorString(status)));
  }
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) out += ' ';
    out += argv[i];
  }
  return out;
}

// The dense sequence a step compares with: inference is a forward, memeff a full step.
StepKind dense_kind(StepKind kind) {
  if (kind == StepKind::kInference) return StepKind::kForward;
  if (kind == StepKind::kMemEff) return StepKind::kFull;
  return kind;
}

// After the timing, each step that was timed runs once more on input set 0, against the fp64
// reference of a sample (check.hpp). After rather than before: it checks the plans as the timed
// iterations left them, and its host work (the reference) cannot change the state the GPU
// enters the timing in.
void check_steps(MoeSteps& moe, const MoeProblem& p, const HostWeights& weights, std::uint64_t seed,
                 TokenResult& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto failed = [](std::string why) {
    return CheckResult{false, std::numeric_limits<double>::infinity(), std::move(why)};
  };
  const CheckSample sample = choose_sample(p, seed);
  std::optional<SampledOutputs> want;
  std::string no_reference;
  try {
    want = reference_outputs(p, sample, moe.host_inputs(), weights);
  } catch (const std::exception& e) {
    no_reference = std::string("no reference: ") + e.what();
  }
  for (StepResult& s : r.steps) {
    if (!s.ours) continue;  // nothing timed to vouch for
    if (!want) {
      s.check = failed(no_reference);
      continue;
    }
    try {
      s.check = judge(p, checked_outputs(s.kind), sample, moe.sampled_step(s.kind, sample), *want);
    } catch (const std::exception& e) {
      s.check = failed(std::string("the step threw: ") + e.what());
    }
  }
  r.check_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Everything for one token count. The per-T device memory (inputs, plan scratch, dense operands)
// lives in this function's scopes, so it is freed before the next token count.
// `host_weights` is null under --no-check.
TokenResult run_tokens(const Args& args, long long tokens, const cuda::DeviceInfo& device, const Weights& weights,
                       const HostWeights* host_weights, const Cublas& blas, CUstream stream, StreamTimer& timer) {
  MoeProblem p = args.problem;
  p.tokens = tokens;
  TokenResult r;
  r.tokens = tokens;
  for (StepKind k : args.steps) r.steps.push_back({k, step_flops(k, p), step_weight_bytes(k, p), {}, {}, {}, {}});
  const std::uint64_t seed = kSeed + 0x9e3779b9ull * static_cast<std::uint64_t>(tokens);

  // Both sides stay alive for the whole token count, so every round can time each step of ours
  // and each dense sequence in turn: a step timed right after a hotter one (a full step heats
  // the card and lowers its clocks) no longer depends on the order of --modes.
  std::unique_ptr<MoeSteps> moe;
  try {
    const bool with_inference = std::count(args.steps.begin(), args.steps.end(), StepKind::kInference) > 0;
    moe = std::make_unique<MoeSteps>(p, args.options, with_inference, args.routing, device.l2_bytes, seed, weights,
                                     stream);
    r.plan_seconds = moe->plan_seconds();
    // 40 calls queue at most 240 forward or 320 backward launches: below the driver's queue depth
    // (the forwards' 320 of earlier sessions were too), so none waits for the GPU.
    const Enqueue enqueue = moe->enqueue_us(40);
    r.forward_enqueue_us = enqueue.forward_us;
    r.backward_enqueue_us = enqueue.backward_us;
    r.graph_step_us = enqueue.graph_step_us;
    r.copies = moe->copies();
    r.configs = moe->configs();
    r.train_memory = moe->memory(Mode::kTraining);
    r.memeff_memory = moe->memory(Mode::kMemoryEfficient);
  } catch (const std::exception& e) {
    r.error = e.what();
    moe.reset();
  }
  std::unique_ptr<DenseCeiling> dense;
  try {
    dense = std::make_unique<DenseCeiling>(p, blas, device.l2_bytes, seed + 1);
    r.dense_copies = dense->copies();
  } catch (const std::exception& e) {
    for (StepResult& s : r.steps) s.dense_error = e.what();
  }

  // What a round times, each step beside the dense sequence it is compared with (a dense
  // sequence two steps share is listed once, beside the first).
  struct Item {
    std::size_t step;  // index into r.steps
    bool dense;
  };
  std::vector<Item> items;
  std::set<StepKind> listed;
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    items.push_back({i, false});
    if (listed.insert(dense_kind(r.steps[i].kind)).second) items.push_back({i, true});
  }
  std::vector<std::vector<Stats>> ours(r.steps.size());
  std::map<StepKind, std::vector<Stats>> dense_rounds;
  std::map<StepKind, std::string> dense_errors;
  for (int round = 0; round < args.rounds; ++round) {
    // Iterations split as evenly as the count allows: the first (iters % rounds) rounds take one more.
    const int iters = args.iters / args.rounds + (round < args.iters % args.rounds ? 1 : 0);
    for (std::size_t index : round_order(items.size(), round)) {
      StepResult& s = r.steps[items[index].step];
      if (!items[index].dense) {
        if (!moe || !s.ours_error.empty()) continue;
        try {
          ours[items[index].step].push_back(moe->measure(s.kind, timer, args.warmup, iters));
        } catch (const std::exception& e) {
          s.ours_error = e.what();
        }
        continue;
      }
      const StepKind k = dense_kind(s.kind);
      if (!dense || dense_errors.count(k)) continue;
      try {
        dense_rounds[k].push_back(dense->measure(k, timer, args.warmup, iters));
      } catch (const std::exception& e) {
        dense_errors[k] = e.what();
      }
    }
  }
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    StepResult& s = r.steps[i];
    if (s.ours_error.empty() && !ours[i].empty()) s.ours = merge(ours[i]);
    const StepKind k = dense_kind(s.kind);
    if (auto e = dense_errors.find(k); e != dense_errors.end()) {
      s.dense_error = e->second;
    } else if (auto d = dense_rounds.find(k); d != dense_rounds.end()) {
      s.dense = merge(d->second);
      if (s.ours) s.round_ratios = round_ratios(ours[i], d->second);
    }
  }
  if (moe && host_weights) check_steps(*moe, p, *host_weights, seed + 2, r);
  return r;
}

int run(const Args& args, const std::string& command) {
  // cuBLAS works in the runtime's context for device 0, which is the device's primary context;
  // FusedMoe uses the context current on this thread: retaining the primary context makes both
  // the same, and one stream carries both.
  check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda::PrimaryContext context(0);
  RunInfo info;
  info.command = command;
  info.date_utc = utc_now();
  info.device = cuda::query_device(0);
  info.problem = args.problem;
  info.routing = args.routing;
  info.warmup = args.warmup;
  info.iters = args.iters;
  info.rounds = args.rounds;
  info.overrides = args.options.config_overrides;
  info.check = args.check;

  // A green context's stream carries everything on its share of the SMs, the dense ceiling too.
  cuda::Stream own;
  CUstream stream = own.get();
  std::unique_ptr<test::GreenContext> green;
  if (args.sms > 0) {
    std::string why;
    green = test::GreenContext::create(0, static_cast<unsigned>(args.sms), &why);
    if (!green) throw std::runtime_error("--sms: " + why);
    stream = green->stream();
    info.green_sms = static_cast<int>(green->sm_count());
  }
  const Cublas blas(stream);
  check_cublas(cublasGetVersion(blas.get(), &info.cublas_version), "cublasGetVersion");
  StreamTimer timer(stream);
  const Weights weights(args.problem, kSeed);
  const std::optional<HostWeights> host_weights = args.check ? std::optional(weights.download()) : std::nullopt;

  std::vector<TokenResult> results;
  for (long long tokens : args.tokens) {
    results.push_back(run_tokens(args, tokens, info.device, weights, host_weights ? &*host_weights : nullptr, blas,
                                 stream, timer));
    const TokenResult& r = results.back();
    fmt::print("T={} done: plans {:.1f} s, enqueue {:.1f} us per forward(), {:.1f} per backward(), {:.1f} per "
               "graph replay of both, input copies {}, dense copies {}{}{}\n",
               tokens, r.plan_seconds, r.forward_enqueue_us, r.backward_enqueue_us, r.graph_step_us, r.copies,
               r.dense_copies, args.check ? fmt::format(", check {:.2f} s", r.check_seconds) : "",
               r.error.empty() ? "" : " (setup failed)");
    std::fflush(stdout);
  }
  print_report(info, results);
  if (!args.json.empty()) {
    write_json(args.json, info, results);
    fmt::print("wrote {}\n", args.json);
  }
  return any_error(results) || any_check_failed(results) ? 1 : 0;
}

}  // namespace
}  // namespace moejit::bench

int main(int argc, char** argv) {
  using namespace moejit::bench;
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const moejit::InvalidArgument& e) {
    std::fprintf(stderr, "moejit_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  std::string why;
  const bool gpu = moejit::cuda::device_available(&why);
  if (args.help) {
    std::fputs(kUsage, stdout);
    if (!gpu) std::printf("no GPU here (%s): a run needs one\n", why.c_str());
    return 0;
  }
  if (!gpu) {
    std::fprintf(stderr, "moejit_bench: no GPU (%s); nothing measured\n", why.c_str());
    return 1;
  }
  try {
    return run(args, command_line(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moejit_bench: %s\n", e.what());
    return 1;
  }
}
