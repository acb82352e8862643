// Tuning on the GPU: the first plan of a problem tunes and stores its rows, a second process
// reads them without tuning, graph capture never tunes, a wrong candidate is rejected, and the
// offline CLI resumes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "db/tuning_db.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/template_hash.hpp"
#include "moe/kernel_specs.hpp"
#include "support/blocking_stream.hpp"
#include "support/gpu.hpp"
#include "support/moe_case.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "tuner/autotuner.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/tuning_keys.hpp"
#include "tuner/tuning_session.hpp"

using namespace moejit;
using namespace moejit::test;

namespace {

const CaseSpec kSpec{512, 8, 256, 128, 2, DType::kBF16, Routing::kRandom, 41};
const MoeProblem kProblem{512, 8, 256, 128, 2};

int count(const std::string& text, const std::string& word) {
  int n = 0;
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

// Every output of a forward and backward into `run`, poisoned before them (an element left
// unwritten is NaN, and fails), against the fp64 reference.
void check_outputs(const DeviceRun& run, const CaseData& data) {
  reference::ReferenceOptions opt;
  opt.round_stored = [](double v) { return round_to(DType::kBF16, v); };
  const auto fwd = reference::moe_forward(data.tensors, opt);
  const auto bwd = reference::moe_backward(data.tensors, data.d_out, opt);
  const std::size_t th = static_cast<std::size_t>(data.spec.tokens) * data.spec.hidden;
  CHECK(rel_l2(download(run.out, DType::kBF16, th), fwd.out) < 1e-2);
  CHECK(rel_l2(download(run.dx, DType::kBF16, th), bwd.dx) < 1e-2);
  CHECK(rel_l2(download(run.dw1, DType::kBF16, bwd.dw1.size()), bwd.dw1) < 1e-2);
  CHECK(rel_l2(download(run.dw2, DType::kBF16, bwd.dw2.size()), bwd.dw2) < 1e-2);
  const std::size_t tk = bwd.d_topk_weights.size();
  CHECK(rel_l2(download(run.d_weights, DType::kBF16, tk), bwd.d_topk_weights) < 1e-2);
}

// The buffers a plan of kProblem needs, sized without tuning anything.
MemoryPlan untuned_memory(const MoeProblem& problem = kProblem) {
  ScopedEnv off("MOEJIT_AUTOTUNE", "0");
  return FusedMoe(problem).memory();
}

// A plan that tuned every role, run into `run` and checked against the reference.
void check_tuned_plan(FusedMoe& plan, const DeviceRun& run, const CaseData& data) {
  for (const auto& [role, source] : plan.config_sources()) {
    INFO(role);
    CHECK(source == "tuned");
  }
  cuda::Stream stream;
  plan.forward(run.forward_args(stream.get()));
  plan.backward(run.backward_args(stream.get()));
  stream.synchronize();
  check_outputs(run, data);
}

void check_against_reference(FusedMoe& plan, const CaseData& data) {
  DeviceRun run(data, plan.memory());
  cuda::Stream stream;
  plan.forward(run.forward_args(stream.get()));
  plan.backward(run.backward_args(stream.get()));
  stream.synchronize();
  check_outputs(run, data);
}

// The tuner's hook is not given the session's stream, which is non-blocking: the whole context is
// synchronised around these copies.
std::vector<double> read_bf16(CUdeviceptr from, std::size_t count) {
  const cuda::Driver& d = cuda::driver();
  MOEJIT_CU(d.cuCtxSynchronize());
  std::vector<std::uint16_t> bits(count);
  MOEJIT_CU(d.cuMemcpyDtoH(bits.data(), from, count * 2));
  return from_storage(DType::kBF16, bits);
}

void write_bf16(CUdeviceptr to, const std::vector<double>& values) {
  const cuda::Driver& d = cuda::driver();
  const std::vector<std::uint16_t> bits = to_storage(DType::kBF16, values);
  MOEJIT_CU(d.cuCtxSynchronize());
  MOEJIT_CU(d.cuMemcpyHtoD(to, bits.data(), bits.size() * 2));
  MOEJIT_CU(d.cuCtxSynchronize());
}

// `want` with the first elements of each chunk the tuner weighs alone (check_chunks)
// scaled by 17/16 (in bf16), as many as take that chunk's ||got - want|| / ||want|| to
// `target`; returns the largest such ratio, exact for the values written.
double scaled_until(const std::vector<double>& want, double target, std::vector<double>& got) {
  got = want;
  double worst = 0;
  for (const auto& [first, end] : check_chunks(want.size())) {
    double want2 = 0, diff2 = 0;
    for (std::size_t i = first; i < end; ++i) want2 += want[i] * want[i];
    for (std::size_t i = first; i < end && diff2 < target * target * want2; ++i) {
      got[i] = round_to(DType::kBF16, want[i] * 17 / 16);
      diff2 += (got[i] - want[i]) * (got[i] - want[i]);
    }
    worst = std::max(worst, std::sqrt(diff2 / want2));
  }
  return worst;
}

// An inspect hook on output 0 (fwd_down's y): the reference config's is kept in `want`, and a
// candidate's is replaced by what `rewrite` makes of it, where it makes anything.
decltype(TuneOptions::inspect) rewrite_y(const std::string& reference, std::vector<double>& want,
                                         std::function<std::optional<std::vector<double>>(const std::string&)> rewrite) {
  return [&want, reference, rewrite](Role, const TileConfig& c, int output, CUdeviceptr out, std::size_t bytes) {
    if (output != 0) return;
    if (c.name() == reference) {
      want = read_bf16(out, bytes / 2);
    } else if (std::optional<std::vector<double>> got = rewrite(c.name())) {
      write_bf16(out, *got);
    }
  };
}

}  // namespace

TEST_CASE("the first plan tunes and stores; a second process reads the rows", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TempDir dir("selftune");
  const std::string db_path = (dir / "tuning.sqlite").string();
  ScopedEnv tune("MOEJIT_AUTOTUNE", "1"), db("MOEJIT_DB", db_path);
  const auto t0 = std::chrono::steady_clock::now();
  FusedMoe plan(kProblem);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("first plan with self-tuning: " << s << " s");
  for (const auto& [role, source] : plan.config_sources()) {
    INFO(role);
    CHECK(source == "tuned");
  }
  CHECK(db::TuningDb(db_path).rows().size() == 8);
  // The first call's space: beside TMA warp-specialized candidates, only the heuristic default
  // is timed (tuner/prune.hpp: first_call_exclusion).
  for (const db::TuningRow& row : db::TuningDb(db_path).rows()) {
    INFO(role_name(row.key.role));
    int tma_ws = 0, other = 0;
    for (const auto& c : row.candidates) {
      if (!c.rejected) ++(c.config.use_tma && c.config.warp_specialized ? tma_ws : other);
    }
    if (tma_ws > 0) CHECK(other <= 1);
  }
  check_against_reference(plan, make_case(kSpec));

  FusedMoe again(kProblem);  // same process: the in-process map
  for (const auto& [role, source] : again.config_sources()) CHECK(source == "memory");
  CHECK(again.configs() == plan.configs());

  auto r = run_command("MOEJIT_AUTOTUNE=1 MOEJIT_DB=" + db_path + " " + cli() + " plan --shape 8,256,128,2 --tokens 512");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(count(r.output, "user_db") == 8);
  CHECK(count(r.output, "tuned") == 0);

  // Another install's rows (other templates) sharing the file: this build tunes its own beside
  // them, and theirs stay for it.
  db::Connection(db_path, db::OpenMode::kReadWrite)
      .exec("UPDATE winners SET template_hash = 'another-build'; UPDATE candidates SET template_hash = 'another-build'");
  r = run_command("MOEJIT_AUTOTUNE=1 MOEJIT_DB=" + db_path + " " + cli() + " plan --shape 8,256,128,2 --tokens 512");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(count(r.output, "tuned") == 8);
  std::map<std::string, int> builds;
  for (const db::TuningRow& row : db::TuningDb(db_path).rows()) ++builds[row.provenance.template_hash];
  CHECK(builds == std::map<std::string, int>{{"another-build", 8}, {jit::template_hash(), 8}});
}

TEST_CASE("a self-tune with no device memory for its scratch falls back, and the plan runs", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TempDir dir("oom");
  ScopedEnv tune("MOEJIT_AUTOTUNE", "1"), db("MOEJIT_DB", (dir / "tuning.sqlite").string()),
      shipped("MOEJIT_SHIPPED_DB_DIR", dir.path().string());  // no tables there
  // The tuner's scratch here is tens of MB (a whole training step's tensors); the filler leaves
  // 12 MB, room for the plan's modules but not for that, as PyTorch's cache can.
  const CaseSpec spec{2048, 8, 512, 256, 2, DType::kBF16, Routing::kRandom, 44};
  const MoeProblem problem{2048, 8, 512, 256, 2};
  std::vector<cuda::DeviceBuffer> filler;
  for (std::size_t chunk : {std::size_t{1} << 30, std::size_t{64} << 20, std::size_t{2} << 20}) {
    for (;;) {
      try {
        filler.emplace_back(chunk);
      } catch (const CudaError& e) {
        REQUIRE(e.result_name() == "CUDA_ERROR_OUT_OF_MEMORY");
        break;
      }
    }
  }
  REQUIRE(filler.size() > 6);
  filler.resize(filler.size() - 6);  // the last six are 2 MB each
  std::map<std::string, std::string> sources;
  {
    FusedMoe plan(problem);
    sources = plan.config_sources();
  }
  filler.clear();
  for (const auto& [role, source] : sources) {
    INFO(role);
    CHECK(source == "heuristic");
  }
  CHECK(db::TuningDb((dir / "tuning.sqlite").string()).rows().empty());
  FusedMoe plan(problem);  // memory back: this one tunes
  for (const auto& [role, source] : plan.config_sources()) CHECK(source == "tuned");
  check_against_reference(plan, make_case(spec));
}

TEST_CASE("a plan built while its stream is captured does not tune", "[gpu][tune][graph]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TempDir dir("capture");
  const std::string db_path = (dir / "tuning.sqlite").string();
  ScopedEnv tune("MOEJIT_AUTOTUNE", "1"), db("MOEJIT_DB", db_path);
  const CaseData data = make_case(kSpec);
  cuda::Stream stream;
  const cuda::Driver& d = cuda::driver();
  Options options;
  options.stream = stream.get();
  MemoryPlan memory;
  {
    ScopedEnv off("MOEJIT_AUTOTUNE", "0");  // buffer sizes only; nothing tuned here
    memory = FusedMoe(kProblem).memory();
  }
  auto run = std::make_unique<DeviceRun>(data, memory);
  // Relaxed capture lets the plan load its modules while the stream is captured.
  MOEJIT_CU(d.cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_RELAXED));
  FusedMoe plan(kProblem, options);
  plan.forward(run->forward_args(stream.get()));
  plan.backward(run->backward_args(stream.get()));
  CUgraph graph = nullptr;
  MOEJIT_CU(d.cuStreamEndCapture(stream.get(), &graph));
  for (const auto& [role, source] : plan.config_sources()) {
    INFO(role);
    CHECK(source == "heuristic");
  }
  CHECK_FALSE(std::filesystem::exists(dir / "tuning.sqlite.locks"));
  CUgraphExec exec = nullptr;
  MOEJIT_CU(d.cuGraphInstantiate(&exec, graph, 0));
  run->poison();  // whatever the outputs hold below, the replay wrote
  MOEJIT_CU(d.cuGraphLaunch(exec, stream.get()));
  stream.synchronize();
  MOEJIT_CU(d.cuGraphExecDestroy(exec));
  MOEJIT_CU(d.cuGraphDestroy(graph));
  check_outputs(*run, data);  // the replay's own outputs
}

TEST_CASE("a plan tuned while another thread captures a graph in global mode builds and runs, and the capture survives",
          "[gpu][tune][graph]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TempDir dir("capture-other");
  ScopedEnv tune("MOEJIT_AUTOTUNE", "1"), db("MOEJIT_DB", (dir / "tuning.sqlite").string());
  const CaseData data = make_case(kSpec);
  // Allocated before the capture: this thread's own allocations are refused while it captures.
  auto run = std::make_unique<DeviceRun>(data, untuned_memory());
  cuda::Stream captured, eager;
  const cuda::Driver& d = cuda::driver();
  // PyTorch's default capture mode. A global capture forbids other threads' allocations, module
  // loads and synchronisations; the cold plan's tuning makes all three, and each failed with
  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidated the capture.
  MOEJIT_CU(d.cuStreamBeginCapture(captured.get(), CU_STREAM_CAPTURE_MODE_GLOBAL));
  std::unique_ptr<FusedMoe> plan;
  std::string failure;
  const CUcontext context = cuda::current_context();
  std::thread builder([&] {
    try {
      MOEJIT_CU(cuda::driver().cuCtxSetCurrent(context));
      plan = std::make_unique<FusedMoe>(kProblem);
      // Its first eager calls build, instantiate and launch their graphs while the capture is open.
      plan->forward(run->forward_args(eager.get()));
      plan->backward(run->backward_args(eager.get()));
      if (!plan->last_call_graphed()) failure = "the eager backward did not launch as its graph";
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  builder.join();
  CUgraph graph = nullptr;
  const CUresult ended = d.cuStreamEndCapture(captured.get(), &graph);
  CHECK(ended == CUDA_SUCCESS);
  if (graph != nullptr) MOEJIT_CU(d.cuGraphDestroy(graph));
  MOEJIT_CU(d.cuStreamSynchronize(eager.get()));
  REQUIRE(failure.empty());
  REQUIRE(plan);
  check_tuned_plan(*plan, *run, data);
}

TEST_CASE("a plan tuned while its own thread captures a blocking stream in global mode builds, and the capture survives",
          "[gpu][tune][graph]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const cuda::Driver& d = cuda::driver();
  const cuda::Stream own;
  // On a stream of its own, not captured; on the default stream, which the driver refuses to
  // query while a blocking stream is captured (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), and which is
  // never captured itself. Each its own problem, so that neither finds the other's rows.
  CaseSpec on_default = kSpec;
  on_default.tokens = 2048;
  for (const auto& [spec, stream] : {std::pair{kSpec, own.get()}, std::pair{on_default, CUstream{nullptr}}}) {
    INFO((stream == nullptr ? "default stream" : "a stream of its own"));
    const MoeProblem problem{spec.tokens, spec.experts, spec.hidden, spec.intermediate, spec.topk};
    TempDir dir(stream == nullptr ? "capture-own-default" : "capture-own");
    ScopedEnv tune("MOEJIT_AUTOTUNE", "1"), db("MOEJIT_DB", (dir / "tuning.sqlite").string());
    const CaseData data = make_case(spec);
    auto run = std::make_unique<DeviceRun>(data, untuned_memory(problem));
    Options options;
    options.stream = stream;
    // A blocking stream synchronises implicitly with the legacy stream: one synchronous copy from
    // the tune (on the legacy stream) while it is captured would invalidate the capture.
    const test::BlockingStream blocking;
    MOEJIT_CU(d.cuStreamBeginCapture(blocking.get(), CU_STREAM_CAPTURE_MODE_GLOBAL));
    std::unique_ptr<FusedMoe> plan;
    std::string failure;
    try {
      plan = std::make_unique<FusedMoe>(problem, options);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    CUgraph graph = nullptr;
    const CUresult ended = d.cuStreamEndCapture(blocking.get(), &graph);
    if (graph != nullptr) MOEJIT_CU(d.cuGraphDestroy(graph));
    INFO(failure);
    CHECK(ended == CUDA_SUCCESS);
    REQUIRE(failure.empty());
    REQUIRE(plan);
    check_tuned_plan(*plan, *run, data);
  }
}

TEST_CASE("a candidate whose output is wrong is rejected, never chosen", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  // Each role's outputs in turn, those only later roles read too: fwd_up's g and u (1) and
  // bwd_down's weighted activation (1) and fp32 score-gradient sums (2).
  for (const auto& [role, output] : {std::pair{Role::kFwdDown, 0}, std::pair{Role::kFwdUp, 1},
                                     std::pair{Role::kBwdDown, 1}, std::pair{Role::kBwdDown, 2}}) {
    INFO(role_name(role) << " output " << output);
    TuneOptions options;
    std::string victim;
    const std::string reference = default_config(role, shape, gpu->info).name();
    options.inspect = [&](Role, const TileConfig& c, int o, CUdeviceptr out, std::size_t bytes) {
      // Corrupt the first candidate after the reference: half of one output becomes 0x3f3f3f3f
      // (~0.75 as bf16, ~0.75 as fp32).
      if (victim.empty() && c.name() != reference) victim = c.name();
      if (c.name() != victim || o != output) return;
      // The tuner's stream is non-blocking: the context is synchronised around the memset.
      const cuda::Driver& d = cuda::driver();
      MOEJIT_CU(d.cuCtxSynchronize());
      MOEJIT_CU(d.cuMemsetD8Async(out, 0x3f, bytes / 2, nullptr));
      MOEJIT_CU(d.cuCtxSynchronize());
    };
    const auto rows = autotune(kProblem, gpu->info, {role}, options);
    REQUIRE(rows.size() == 1);
    REQUIRE_FALSE(victim.empty());
    CHECK(rows[0].winner.name() != victim);
    bool found = false;
    for (const auto& c : rows[0].candidates) {
      if (c.config.name() != victim) continue;
      found = true;
      CHECK(c.rejected);
      CHECK_THAT(c.reason, Catch::Contains("differs from the reference"));
    }
    CHECK(found);
  }
}

TEST_CASE("the tuner's poison shows an output left unwritten, and each role's reference writes all of its outputs",
          "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  // Each mode's roles, memory-efficient mode's bwd_down without the weighted activation among
  // them: poisoned after its reference's snapshot, then run again.
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient, Mode::kInference}) {
    MoeProblem problem = kProblem;
    problem.mode = mode;
    const MoeShape shape{problem.tokens, problem.experts, problem.hidden, problem.intermediate, problem.topk,
                         problem.dtype};
    std::map<Role, TuningSession::RoleKernel> primed;
    for (Role r : roles_of(mode)) {
      const TileConfig c = default_config(r, shape, gpu->info, mode);
      primed[r] = {c, &jit::KernelCache::instance().load(role_kernel_spec(r, c, problem, gpu->info.arch()))};
    }
    TuningSession session(problem, gpu->info);
    session.prime(primed);
    for (const auto& [role, kernel] : primed) {
      if (role == Role::kRouting) continue;
      INFO(mode_name(mode) << " " << role_name(role));
      CHECK(session.snapshot(role) == 0);
      session.poison(role);
      CHECK(std::isinf(session.diff(role)));
      session.run(role, kernel);
      CHECK(session.diff(role) <= kTuneTolerance);
    }
  }
}

TEST_CASE("a candidate just inside the tuner's tolerance is kept, one just outside rejected", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  const std::string reference = default_config(Role::kFwdDown, shape, gpu->info).name();
  // The tuner rejects a candidate whose ||y - y_ref|| / ||y_ref|| exceeds kTuneTolerance = b. The
  // first two candidates after the reference report y_ref itself with leading elements scaled by
  // 17/16: each adds about (v / 16)^2 to ||y - y_ref||^2, so 0.9 b takes elements holding
  // 256 (0.9 b)^2 = 2.1 % of ||y_ref||^2, and 1.1 b 3.1 %; one element more moves the ratio by
  // ~0.01 % (0.25 % for a value 5 sigma out). Replacing the candidate's y removes its own rounding
  // differences, and the tuner's kernel subtracts bf16 values exactly and sums in fp64, so its
  // metric is the one computed here: 10 % on either side of b is clear of every error.
  struct Victim {
    double target;
    std::string name;
    double reached = 0;
  };
  std::array<Victim, 2> victims{{{0.9 * kTuneTolerance, ""}, {1.1 * kTuneTolerance, ""}}};
  std::vector<double> want;  // the reference's y
  TuneOptions options;
  options.inspect = rewrite_y(reference, want, [&](const std::string& candidate) -> std::optional<std::vector<double>> {
    for (Victim& v : victims) {
      if (v.name.empty()) v.name = candidate;
      if (v.name != candidate) continue;
      std::vector<double> got;
      v.reached = scaled_until(want, v.target, got);
      return got;
    }
    return std::nullopt;
  });
  const auto rows = autotune(kProblem, gpu->info, {Role::kFwdDown}, options);
  REQUIRE(rows.size() == 1);
  const auto result = [&](const Victim& v) {
    INFO(v.name << " at " << v.reached << " of a bound of " << kTuneTolerance);
    REQUIRE_FALSE(v.name.empty());
    REQUIRE(v.reached == Approx(v.target).epsilon(0.02));
    const auto it = std::find_if(rows[0].candidates.begin(), rows[0].candidates.end(),
                                 [&](const db::CandidateResult& c) { return c.config.name() == v.name; });
    REQUIRE(it != rows[0].candidates.end());
    return *it;
  };
  const db::CandidateResult inside = result(victims[0]), outside = result(victims[1]);
  INFO(inside.reason);
  CHECK_FALSE(inside.rejected);
  INFO(outside.reason);
  REQUIRE(outside.rejected);
  REQUIRE_THAT(outside.reason, Catch::StartsWith("output differs from the reference config by "));
  // The difference it reports (3 significant digits) is the one written.
  CHECK(std::stod(outside.reason.substr(outside.reason.rfind(' ') + 1)) == Approx(victims[1].reached).epsilon(0.01));
}

TEST_CASE("a candidate wrong in one chunk of an output is rejected though the whole output is within bounds",
          "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  const std::string reference = default_config(Role::kFwdDown, shape, gpu->info).name();
  // fwd_down's y here is [1024, 256]: 16 chunks of 16384. The victim's y is the reference's with
  // leading elements of chunk 3 zeroed until ||y - y_ref|| / ||y_ref|| over all of y reaches half
  // the bound, which one norm over the output passed: in that chunk alone it is about twice the
  // bound.
  std::vector<double> want;
  std::string victim;
  double whole = 0, in_chunk = 0;
  TuneOptions options;
  options.inspect = rewrite_y(reference, want, [&](const std::string& candidate) -> std::optional<std::vector<double>> {
    if (victim.empty()) victim = candidate;
    if (candidate != victim) return std::nullopt;
    const auto chunks = check_chunks(want.size());
    REQUIRE(chunks.size() == 16);
    const auto [first, end] = chunks[3];
    double want2 = 0, chunk2 = 0, diff2 = 0;
    for (double v : want) want2 += v * v;
    for (std::size_t i = first; i < end; ++i) chunk2 += want[i] * want[i];
    std::vector<double> got = want;
    const double half = 0.5 * kTuneTolerance;
    for (std::size_t i = first; i < end && diff2 + want[i] * want[i] < half * half * want2; ++i) {
      diff2 += want[i] * want[i];
      got[i] = 0;
    }
    whole = std::sqrt(diff2 / want2);
    in_chunk = std::sqrt(diff2 / chunk2);
    return got;
  });
  const auto rows = autotune(kProblem, gpu->info, {Role::kFwdDown}, options);
  REQUIRE(rows.size() == 1);
  REQUIRE_FALSE(victim.empty());
  INFO(victim << ": " << whole << " over y, " << in_chunk << " in its chunk");
  REQUIRE(whole < kTuneTolerance);
  REQUIRE(in_chunk > kTuneTolerance);
  const auto it = std::find_if(rows[0].candidates.begin(), rows[0].candidates.end(),
                               [&](const db::CandidateResult& c) { return c.config.name() == victim; });
  REQUIRE(it != rows[0].candidates.end());
  CHECK(it->rejected);
  CHECK_THAT(it->reason, Catch::Contains("differs from the reference"));
  CHECK(rows[0].winner.name() != victim);
}

TEST_CASE("a reference config whose output holds a NaN stops the tune", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  const std::string reference = default_config(Role::kFwdDown, shape, gpu->info).name();
  // A NaN in the reference made every candidate's ratio NaN, which the largest-ratio search
  // dropped: any candidate passed.
  TuneOptions options;
  options.inspect = [&](Role, const TileConfig& c, int output, CUdeviceptr out, std::size_t bytes) {
    if (output != 0 || c.name() != reference) return;
    std::vector<double> y = read_bf16(out, bytes / 2);
    y[y.size() / 2] = std::numeric_limits<double>::quiet_NaN();
    write_bf16(out, y);
  };
  try {
    autotune(kProblem, gpu->info, {Role::kFwdDown}, options);
    FAIL("the tune went on against a reference holding a NaN");
  } catch (const InternalError& e) {
    CHECK_THAT(e.what(), Catch::Contains("fwd_down's reference config " + reference) &&
                             Catch::Contains("1 output values unwritten or not finite"));
  }
}

TEST_CASE("a candidate whose launch is refused is rejected and the tune goes on", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  // Pruned for a device that claims 64 KB more shared memory per block than this one has, the
  // configs in between reach the launch, which this device refuses.
  cuda::DeviceInfo roomy = gpu->info;
  roomy.smem_optin_per_block += 64 * 1024;
  roomy.smem_per_sm += 64 * 1024;
  REQUIRE(default_config(Role::kFwdDown, shape, roomy) == default_config(Role::kFwdDown, shape, gpu->info));
  std::vector<std::string> too_big;
  for (const PruneDecision& d : prune_space(Role::kFwdDown, shape, roomy)) {
    if (!d.reason && prune_reason(Role::kFwdDown, d.config, shape, gpu->info)) too_big.push_back(d.config.name());
  }
  REQUIRE_FALSE(too_big.empty());
  const auto rows = autotune(kProblem, roomy, {Role::kFwdDown}, TuneOptions{});
  REQUIRE(rows.size() == 1);
  CHECK_FALSE(prune_reason(Role::kFwdDown, rows[0].winner, shape, gpu->info));
  int timed = 0;
  for (const auto& c : rows[0].candidates) {
    const bool refused = std::find(too_big.begin(), too_big.end(), c.config.name()) != too_big.end();
    INFO(c.config.name() << ": " << c.reason);
    if (refused) {
      CHECK(c.rejected);
      CHECK_THAT(c.reason, Catch::StartsWith("launch failed: "));
    } else if (!c.rejected) {
      ++timed;
    }
  }
  CHECK(timed > 1);
  // The refusals left the context usable.
  MOEJIT_CU(cuda::driver().cuCtxSynchronize());
}

TEST_CASE("routing's winner is legal at every T of its key: configs wider than the key's smallest T takes are not timed",
          "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  // 8192 pairs, 1024 per expert: the key's bucket starts at 513 per expert, T = 2049, whose 4098
  // pairs pad to 5120; a chunk of 8192 pairs is legal here, not there.
  const MoeProblem problem{4096, 8, 256, 128, 2};
  const long long floor = key_floor_tokens(Role::kRouting, problem, gpu->info);
  REQUIRE(floor == 2049);
  MoeShape at_floor = shape_of(problem);
  at_floor.tokens = floor;
  int narrowed = 0;
  for (const PruneDecision& d : prune_space(Role::kRouting, shape_of(problem), gpu->info)) {
    if (!d.reason && prune_reason(Role::kRouting, d.config, at_floor, gpu->info)) ++narrowed;
  }
  REQUIRE(narrowed > 0);
  const auto rows = autotune(problem, gpu->info, {Role::kRouting}, TuneOptions{});
  REQUIRE(rows.size() == 1);
  CHECK(winner_legal(rows[0], at_floor, gpu->info));
  int timed = 0, pruned_at_floor = 0;
  for (const auto& c : rows[0].candidates) {
    INFO(c.config.name() << ": " << c.reason);
    if (!c.rejected) {
      ++timed;
      CHECK_FALSE(prune_reason(Role::kRouting, c.config, at_floor, gpu->info));
    } else if (c.reason.starts_with("pruned at T=2049, the key's smallest: ")) {
      ++pruned_at_floor;
    }
  }
  CHECK(timed > 1);
  CHECK(pruned_at_floor >= narrowed);
}

TEST_CASE("sustained timing runs each candidate's warm-up burst, then times it", "[gpu][tune]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TuneOptions options;
  options.sustained = true;
  const auto t0 = std::chrono::steady_clock::now();
  const auto rows = autotune(kProblem, gpu->info, {Role::kFwdDown}, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(rows.size() == 1);
  int timed = 0;
  for (const auto& c : rows[0].candidates) {
    if (c.rejected) continue;
    CHECK(c.median_ms > 0);
    ++timed;
  }
  CHECK(timed > 1);
  CHECK(rows[0].median_ms > 0);
  CHECK(seconds >= 0.025 * timed);  // ~25 ms of back-to-back launches before each candidate's timing
}

TEST_CASE("moejit tune resumes: a second run skips every tuned key", "[gpu][tune][cli]") {
  MOEJIT_REQUIRE_GPU(gpu);
  TempDir dir("cli-tune");
  const std::string base = cli() + " tune --shape 8,256,128,2 --tokens 64,256 --modes train,infer --db " +
                           (dir / "t.sqlite").string();
  auto first = run_command(base);
  INFO(first.output);
  CHECK(first.exit_code == 0);
  CHECK_THAT(first.output, Catch::Contains("tuning 4 item(s)"));
  CHECK(db::TuningDb(dir / "t.sqlite").rows().size() == 18);
  auto second = run_command(base);
  INFO(second.output);
  CHECK(second.exit_code == 0);
  CHECK_THAT(second.output, Catch::Contains("tuning 0 item(s)"));
}
