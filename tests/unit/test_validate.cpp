// The host-side checks of a problem, and of a call's arguments on fake device addresses
// (nothing is dereferenced): every buffer a call writes must be disjoint from every other argument.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/memory_layout.hpp"
#include "cuda/pointer.hpp"
#include "moe/validate.hpp"

using namespace moejit;

namespace {

// Address n GiB: far enough apart that the problem's buffers below never touch.
void* gib(std::uintptr_t n) { return reinterpret_cast<void*>(n << 30); }

// A forward whose every buffer lies in a GiB of its own, sized for the layout.
ForwardArgs separate_forward_args(const MemoryLayout& l) {
  ForwardArgs a;
  a.x = gib(1);
  a.w1 = gib(3);
  a.w2 = gib(4);
  a.topk_ids = static_cast<const std::int32_t*>(gib(5));
  a.topk_weights = gib(6);
  a.out = gib(7);
  a.saved = gib(8);
  a.saved_bytes = l.saved_bytes;
  a.workspace = gib(16);
  a.workspace_bytes = l.forward_bytes;
  return a;
}

// A backward whose every buffer lies in a GiB of its own, sized for the layout.
BackwardArgs separate_backward_args(const MemoryLayout& l) {
  BackwardArgs a;
  a.d_out = gib(1);
  a.x = gib(2);
  a.w1 = gib(3);
  a.w2 = gib(4);
  a.topk_ids = static_cast<const std::int32_t*>(gib(5));
  a.topk_weights = gib(6);
  a.saved = gib(8);
  a.saved_bytes = l.saved_bytes;
  a.dx = gib(12);
  a.dw1 = gib(13);
  a.dw2 = gib(14);
  a.d_topk_weights = gib(15);
  a.workspace = gib(16);
  a.workspace_bytes = l.backward_bytes;
  return a;
}

// What plan_memory reports for the problem's layout.
MemoryPlan memory_plan(const MemoryLayout& l) { return {l.saved_bytes, l.forward_bytes, l.backward_bytes}; }

// DeepSeek-V2-Lite at T=4096 in a training mode: the problem, its memory plan and a backward
// whose every buffer lies in a GiB of its own.
struct BackwardCase {
  explicit BackwardCase(Mode mode)
      : p{4096, 64, 2048, 1408, 6, DType::kBF16, mode}, m(memory_plan(memory_layout(p))),
        args(separate_backward_args(memory_layout(p))) {}
  MoeProblem p;
  MemoryPlan m;
  BackwardArgs args;
};

// The argument validate_problem names, or "" when it accepts the problem.
std::string rejected_argument(const MoeProblem& p) {
  try {
    validate_problem(p);
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "";
}

}  // namespace

TEST_CASE("T·K stays at most 2^31 - 256, so device row indices plus a tile stay in int32", "[validate]") {
  MoeProblem p{(1LL << 31) - 256, 1, 8, 8, 1, DType::kBF16, Mode::kInference};
  CHECK_NOTHROW(validate_problem(p));
  p.tokens += 1;
  CHECK_THROWS_WITH(validate_problem(p), Catch::StartsWith("tokens") && Catch::Contains("2^31 - 256"));
  p = MoeProblem{(1LL << 31) / 8, 8, 8, 8, 8, DType::kBF16, Mode::kInference};  // T·K = 2^31 exactly
  CHECK_THROWS_WITH(validate_problem(p), Catch::StartsWith("tokens"));
}

TEST_CASE("hidden and intermediate stay below 2^28, each named on its own; H within gather_sum's grid", "[validate]") {
  // One token, expert and slot: no other bound of the problem comes near.
  const auto problem = [](int hidden, int intermediate) {
    return MoeProblem{1, 1, hidden, intermediate, 1, DType::kBF16, Mode::kTraining};
  };
  constexpr int kBound = 1 << 28;
  CHECK(rejected_argument(problem(1, kBound - 1)).empty());
  CHECK(rejected_argument(problem(kBound, 1)) == "hidden");
  CHECK(rejected_argument(problem(1, kBound)) == "intermediate");
  CHECK(rejected_argument(problem(1, kBound + 1)) == "intermediate");
  CHECK(rejected_argument(problem(kBound + 1, kBound - 1)) == "hidden");
  // gather_sum spans a row of H in at most 65535 blocks of 8 warps: 256 columns each, 2048 on the
  // vector path (H and I multiples of 8). Past that no config could run, so the problem is refused
  // up front rather than after compiling.
  CHECK(rejected_argument(problem(65535 * 2048, 8)).empty());
  CHECK(rejected_argument(problem(65535 * 2048 + 8, 8)) == "hidden");
  CHECK(rejected_argument(problem(65535 * 256, 7)).empty());
  CHECK_THROWS_WITH(validate_problem(problem(65535 * 256 + 1, 7)),
                    Catch::StartsWith("hidden: must be at most 16776960 unless H and I are multiples of 8"));
}

TEST_CASE("the weights are at most 2^61 elements, so their byte counts cannot wrap", "[validate]") {
  // Each dimension within its own bound; E * 2I * H = 2^61 exactly at E = 128, H = 2^26, I = 2^27.
  const auto problem = [](int experts) {
    return MoeProblem{1, experts, 1 << 26, 1 << 27, 1, DType::kBF16, Mode::kInference};
  };
  CHECK(rejected_argument(problem(128)).empty());
  CHECK(rejected_argument(problem(129)) == "experts * 2 * intermediate * hidden");
  CHECK_THROWS_WITH(validate_problem(problem(4096)), Catch::Contains("at most 2^61"));
  // 2^61 + 16 weights (E * I * H = 8 (2^57 + 1)), which a double product rounds to 2^61.
  CHECK(rejected_argument(MoeProblem{1, 2284, 3145734, 160465489, 1, DType::kBF16, Mode::kInference}) ==
        "experts * 2 * intermediate * hidden");
}

TEST_CASE("checking mode rejects the first token that names one expert twice", "[validate]") {
  const std::vector<std::int32_t> distinct = {0, 1, 2, 3, 2, 1, 7, 0, 5};
  CHECK_NOTHROW(check_distinct_experts(distinct.data(), 3, 3));
  CHECK_NOTHROW(check_distinct_experts(distinct.data(), 9, 1));
  const std::vector<std::int32_t> repeated = {0, 1, 2, 4, 6, 4, 3, 3, 3};
  CHECK_THROWS_WITH(check_distinct_experts(repeated.data(), 3, 3),
                    Catch::Contains("topk_ids") && Catch::Contains("token 1 names expert 4 twice (slots 0 and 2)"));
  CHECK_THROWS_WITH(check_distinct_experts(repeated.data() + 6, 1, 3), Catch::Contains("token 0 names expert 3 twice (slots 0 and 1)"));
  // K = E = 4096: one token's slots name every expert once, then the last slot repeats slot 37's.
  std::vector<std::int32_t> wide(4096);
  for (int k = 0; k < 4096; ++k) wide[k] = 4095 - k;
  CHECK_NOTHROW(check_distinct_experts(wide.data(), 1, 4096));
  wide[4095] = wide[37];
  CHECK_THROWS_WITH(check_distinct_experts(wide.data(), 1, 4096),
                    Catch::Contains("token 0 names expert 4058 twice (slots 37 and 4095)"));
}

TEST_CASE("a forward whose outputs overlap an input is rejected", "[validate]") {
  const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kTraining};
  const MemoryLayout l = memory_layout(p);
  const MemoryPlan m = memory_plan(l);
  const ForwardArgs a = separate_forward_args(l);
  CHECK_NOTHROW(validate_forward(a, p, m, true));
  ForwardArgs bad = a;
  bad.out = gib(1);  // the output over x
  CHECK_THROWS_WITH(validate_forward(bad, p, m, true), Catch::Contains("out") && Catch::Contains("overlaps x"));
}

TEST_CASE("a backward whose outputs overlap another argument is rejected, naming both", "[validate]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    INFO(mode_name(mode));
    const auto [p, m, a] = BackwardCase(mode);
    CHECK_NOTHROW(validate_backward(a, p, m, true));

    BackwardArgs bad = a;
    bad.dw1 = gib(3);  // dW1 over W1
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::Contains("dw1") && Catch::Contains("overlaps w1"));
    bad = a;
    bad.dx = static_cast<char*>(gib(1)) + 4096;  // dx inside dO
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::Contains("dx") && Catch::Contains("overlaps d_out"));
    bad = a;
    bad.workspace = static_cast<char*>(a.dw2) + 256;  // two outputs
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::Contains("overlaps workspace"));
    bad = a;
    bad.d_topk_weights = static_cast<char*>(a.saved) + 1024;
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::Contains("overlaps saved"));
    // Adjacent buffers touch without overlapping.
    BackwardArgs adjacent = a;
    adjacent.dw2 = static_cast<char*>(a.dw1) + std::size_t{64} * 2 * 1408 * 2048 * 2;
    CHECK_NOTHROW(validate_backward(adjacent, p, m, true));
    adjacent.dw2 = static_cast<char*>(adjacent.dw2) - 16;
    CHECK_THROWS_WITH(validate_backward(adjacent, p, m, true), Catch::Contains("overlaps dw2"));
  }
}

TEST_CASE("a memory-efficient backward, which writes over saved, rejects saved over an input", "[validate]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    INFO(mode_name(mode));
    auto [p, m, a] = BackwardCase(mode);
    a.saved = gib(1);  // saved over dO
    if (mode == Mode::kTraining) {
      // Training's backward only reads saved: two inputs may share bytes.
      CHECK_NOTHROW(validate_backward(a, p, m, true));
      continue;
    }
    CHECK_THROWS_AS(validate_backward(a, p, m, true), InvalidArgument);
    CHECK_THROWS_WITH(validate_backward(a, p, m, true), Catch::StartsWith("saved: overlaps d_out"));
    BackwardArgs bad = a;
    bad.saved = gib(2);
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("saved: overlaps x"));
    bad.saved = static_cast<char*>(gib(3)) + 4096;  // inside W1
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("saved: overlaps w1"));
    bad.saved = gib(8);
    CHECK_NOTHROW(validate_backward(bad, p, m, true));
  }
}

namespace {

// The plan's context in the fake driver's view, and another context on the same device.
constexpr std::uintptr_t kPlanContext = 0xc1, kOtherContext = 0xc2;

// A fake driver's view: GiBs 1-15 are device 0's memory, 16 (the workspace) device 1's, and the
// memory of each GiB stops 64 MiB before its end; past that the driver knows nothing. Only GiBs
// 9, 17 and 18 report ranges. Device memory is kPlanContext's, but GiB 19's is kOtherContext's
// and mapped virtual memory (GiB 17) names no context.
cuda::PointerInfo fake_query(const void* p, cuda::MemoryKind gib6_kind) {
  constexpr std::uintptr_t mib = std::uintptr_t{1} << 20;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t n = a >> 30, offset = a & ((std::uintptr_t{1} << 30) - 1), gib_start = n << 30;
  if (n < 1 || n > 19 || offset >= 960 * mib) return {};
  if (n == 19) return {cuda::MemoryKind::kDevice, 0, 0, 0, kOtherContext};
  if (n == 6) return {gib6_kind, 0};
  // GiB 9 holds cuMemAlloc allocations of 256 MiB each, back to back.
  if (n == 9) return {cuda::MemoryKind::kDevice, 0, a & ~(256 * mib - 1), 256 * mib, kPlanContext};
  // GiB 17 is mapped virtual memory in two reserved ranges, 0-512 and 512-960 MiB, each the range
  // of every address in it, with nothing mapped at 64-68 MiB (no memory there).
  if (n == 17) {
    if (offset >= 64 * mib && offset < 68 * mib) return {};
    return offset < 512 * mib ? cuda::PointerInfo{cuda::MemoryKind::kDevice, 0, gib_start, 512 * mib}
                              : cuda::PointerInfo{cuda::MemoryKind::kDevice, 0, gib_start + 512 * mib, 448 * mib};
  }
  // GiB 18 holds managed allocations of 256 MiB each, back to back.
  if (n == 18) return {cuda::MemoryKind::kManaged, -1, a & ~(256 * mib - 1), 256 * mib};
  return {cuda::MemoryKind::kDevice, n == 16 ? 1 : 0, 0, 0, kPlanContext};
}

}  // namespace

TEST_CASE("tensors outside this device's memory are rejected, each named", "[validate]") {
  const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kTraining};
  const MemoryLayout l = memory_layout(p);
  const MemoryPlan m = memory_plan(l);
  BackwardArgs a = separate_backward_args(l);
  const auto device = [](cuda::MemoryKind k) { return [k](const void* at) { return fake_query(at, k); }; };
  const auto device0 = device(cuda::MemoryKind::kDevice);
  const auto rejected = [&](const BackwardArgs& args, int on, cuda::MemoryKind gib6) {
    try {
      require_device_memory(backward_tensors(args, p, m, true), on, kPlanContext, device(gib6));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Every tensor but the workspace is device 0's: so the workspace is named, on device 0.
  CHECK_THAT(rejected(a, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("workspace: is memory of device 1; this plan runs on device 0"));
  a.workspace = gib(11);
  CHECK(rejected(a, 0, cuda::MemoryKind::kDevice).empty());
  CHECK_NOTHROW(require_device_memory(backward_tensors(a, p, m, true), 0, kPlanContext, device0));
  // Device 1's plan finds device 0's memory first in its list: dx.
  CHECK_THAT(rejected(a, 1, cuda::MemoryKind::kDevice), Catch::StartsWith("dx: is memory of device 0"));
  // topk_weights lives in GiB 6: managed memory is accepted wherever it was allocated, page-locked
  // host memory is not.
  CHECK(rejected(a, 0, cuda::MemoryKind::kManaged).empty());
  CHECK_THAT(rejected(a, 0, cuda::MemoryKind::kHost), Catch::StartsWith("topk_weights: is page-locked host memory"));
  CHECK_THAT(rejected(a, 0, cuda::MemoryKind::kUnknown), Catch::StartsWith("topk_weights: address") &&
                                                              Catch::Contains("is not CUDA memory"));
  // A tensor whose last byte lies past the known memory: its first byte alone passes.
  BackwardArgs late = a;
  late.x = static_cast<char*>(gib(2)) + (950u << 20);  // x is 16 MiB: it ends at 966 MiB
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: its 16777216 bytes from") && Catch::Contains("run past the memory"));
  late.x = static_cast<char*>(gib(2)) + (944u << 20);  // ends at 960 MiB exactly
  CHECK(rejected(late, 0, cuda::MemoryKind::kDevice).empty());
  // Across two allocations, both device 0's: each byte alone passes, the range does not.
  late.x = static_cast<char*>(gib(9)) + (250u << 20);
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: its 16777216 bytes from") && Catch::Contains("run past the allocation there"));
  late.x = static_cast<char*>(gib(9)) + (240u << 20);  // ends where its allocation does
  CHECK(rejected(late, 0, cuda::MemoryKind::kDevice).empty());
  // Managed memory: the same.
  late.x = static_cast<char*>(gib(18)) + (250u << 20);
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: its 16777216 bytes from") && Catch::Contains("run past the allocation there"));
  late.x = static_cast<char*>(gib(18)) + (240u << 20);
  CHECK(rejected(late, 0, cuda::MemoryKind::kDevice).empty());
  // Mapped virtual memory: x within its reserved range.
  late.x = gib(17);
  CHECK(rejected(late, 0, cuda::MemoryKind::kDevice).empty());
  late.x = static_cast<char*>(gib(17)) + (496u << 20);  // ends where its range does
  CHECK(rejected(late, 0, cuda::MemoryKind::kDevice).empty());
  // ... ending where nothing is mapped, though its range holds it.
  late.x = static_cast<char*>(gib(17)) + (52u << 20);
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: its 16777216 bytes from") && Catch::Contains("run past the memory"));
  // ... across the end of its reserved range into the next one, though both are device 0's.
  late.x = static_cast<char*>(gib(17)) + (504u << 20);
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: its 16777216 bytes from") && Catch::Contains("run past the allocation there"));
  // Memory of another context on the same device: the plan's context cannot reach it. Without a
  // context to compare (0) it passes.
  late.x = gib(19);
  CHECK_THAT(rejected(late, 0, cuda::MemoryKind::kDevice),
             Catch::StartsWith("x: is memory of another CUDA context on device 0"));
  CHECK_NOTHROW(require_device_memory(backward_tensors(late, p, m, true), 0, 0, device0));
  // A size that wraps past the top of the address space.
  const std::vector<TensorRegion> huge = {TensorRegion{"x", gib(2), ~std::size_t{0} - 4096, 16, false}};
  CHECK_THROWS_WITH(require_device_memory(huge, 0, kPlanContext, device0), Catch::StartsWith("x: its") && Catch::Contains("run past"));
  // Nothing is asked of a tensor of no bytes: inference's saved state may be null.
  const MoeProblem infer{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kInference};
  const MemoryLayout li = memory_layout(infer);
  ForwardArgs f = separate_forward_args(li);
  f.saved = nullptr;
  f.workspace = gib(10);  // device 0's
  CHECK_NOTHROW(require_device_memory(forward_tensors(f, infer, memory_plan(li), true), 0, kPlanContext, device0));
}

TEST_CASE("a call's tensors must be non-null and aligned, its buffers as large as the plan says", "[validate]") {
  const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kTraining};
  const MemoryLayout l = memory_layout(p);
  const MemoryPlan m = memory_plan(l);
  const ForwardArgs a = separate_forward_args(l);
  const auto rejected = [&](const ForwardArgs& args, bool vector_aligned, const MoeProblem& problem) {
    try {
      validate_forward(args, problem, m, vector_aligned);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(rejected(a, true, p).empty());
  ForwardArgs bad = a;
  bad.x = static_cast<const char*>(a.x) + 2;
  CHECK_THAT(rejected(bad, true, p), Catch::StartsWith("x: must be 16-byte aligned"));
  CHECK(rejected(bad, false, p).empty());  // 2-byte accesses where H or I is not a multiple of 8
  bad = a;
  bad.topk_ids = reinterpret_cast<const std::int32_t*>(static_cast<const char*>(gib(5)) + 2);
  CHECK_THAT(rejected(bad, false, p), Catch::StartsWith("topk_ids: must be 4-byte aligned"));
  bad = a;
  bad.w2 = nullptr;
  CHECK_THAT(rejected(bad, true, p), Catch::StartsWith("w2: null device pointer"));
  bad = a;
  bad.workspace = static_cast<char*>(a.workspace) + 128;
  CHECK_THAT(rejected(bad, true, p), Catch::StartsWith("workspace: must be 256-byte aligned"));
  bad = a;
  bad.workspace_bytes = 16;
  CHECK_THAT(rejected(bad, true, p), Catch::StartsWith("workspace_bytes: 16 bytes given"));
  bad = a;
  bad.saved = nullptr;
  CHECK_THAT(rejected(bad, true, p), Catch::StartsWith("saved: null device pointer"));
  // An inference plan keeps nothing: its saved state may be null and of no bytes.
  MoeProblem infer = p;
  infer.mode = Mode::kInference;
  bad.saved_bytes = 0;
  CHECK(rejected(bad, true, infer).empty());
  // The tensors returned are the ones checked, written ones first.
  const std::vector<TensorRegion> t = validate_forward(a, p, m, true);
  REQUIRE(t.size() == 8);
  CHECK(std::string(t.front().name) == "out");
  CHECK(t.front().written);
  CHECK(std::string(t.back().name) == "topk_weights");
  CHECK(t.back().bytes == std::size_t{4096} * 6 * 2);
}

TEST_CASE("adopt_saved takes a training plan's non-null, 256-byte aligned buffer of its state's size", "[validate]") {
  const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kTraining};
  const MemoryPlan m = memory_plan(memory_layout(p));
  const std::vector<TensorRegion> t = validate_adopted(gib(3), p, m);
  REQUIRE(t.size() == 1);
  CHECK(std::string(t[0].name) == "saved");
  CHECK(t[0].bytes == m.saved_bytes);
  CHECK(t[0].written);  // the copy wrote it: states recorded over it are gone
  CHECK_THROWS_WITH(validate_adopted(nullptr, p, m), Catch::StartsWith("saved: null device pointer"));
  CHECK_THROWS_WITH(validate_adopted(static_cast<const char*>(gib(3)) + 16, p, m),
                    Catch::StartsWith("saved: must be 256-byte aligned"));
  MoeProblem infer = p;
  infer.mode = Mode::kInference;
  CHECK_THROWS_AS(validate_adopted(gib(3), infer, m), StateError);
}

TEST_CASE("a backward takes both weight gradients or neither (frozen experts)", "[validate]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    INFO(mode_name(mode));
    const auto [p, m, a] = BackwardCase(mode);
    BackwardArgs frozen = a;
    frozen.dw1 = frozen.dw2 = nullptr;
    CHECK_NOTHROW(validate_backward(frozen, p, m, true));
    for (const TensorRegion& t : backward_tensors(frozen, p, m, true)) {
      if (t.begin == nullptr) CHECK(t.bytes == 0);
    }
    BackwardArgs one = a;
    one.dw2 = nullptr;
    CHECK_THROWS_WITH(validate_backward(one, p, m, true),
                      Catch::StartsWith("dw2: null device pointer while dw1 is given") && Catch::Contains("neither"));
    one = a;
    one.dw1 = nullptr;
    CHECK_THROWS_WITH(validate_backward(one, p, m, true), Catch::StartsWith("dw1: null device pointer while dw2"));
    // The other outputs stay required.
    frozen.dx = nullptr;
    CHECK_THROWS_WITH(validate_backward(frozen, p, m, true), Catch::StartsWith("dx: null device pointer"));
  }
}

TEST_CASE("a backward may omit topk_ids, and x without weight gradients; given, each is checked", "[validate]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    INFO(mode_name(mode));
    auto [p, m, a] = BackwardCase(mode);
    a.workspace = gib(11);  // device 0's, as every other tensor in fake_query's view
    const auto device0 = [](const void* at) { return fake_query(at, cuda::MemoryKind::kDevice); };
    // The routing comes from saved: topk_ids may be null, weight gradients or not.
    BackwardArgs no_ids = a;
    no_ids.topk_ids = nullptr;
    CHECK_NOTHROW(validate_backward(no_ids, p, m, true));
    // Only the weight gradients read x.
    BackwardArgs frozen = no_ids;
    frozen.x = nullptr;
    frozen.dw1 = frozen.dw2 = nullptr;
    CHECK_NOTHROW(validate_backward(frozen, p, m, true));
    // A null one is no tensor: the device-memory and overlap checks pass it by.
    for (const TensorRegion& t : backward_tensors(frozen, p, m, true)) {
      if (t.begin == nullptr) CHECK(t.bytes == 0);
    }
    CHECK_NOTHROW(require_device_memory(backward_tensors(frozen, p, m, true), 0, kPlanContext, device0));
    BackwardArgs no_x = a;
    no_x.x = nullptr;
    CHECK_THROWS_AS(validate_backward(no_x, p, m, true), InvalidArgument);
    CHECK_THROWS_WITH(validate_backward(no_x, p, m, true),
                      Catch::StartsWith("x: null device pointer") && Catch::Contains("weight gradients"));
    // Given, each is checked as the forward's: alignment, overlap, device memory.
    frozen.x = a.x;
    frozen.topk_ids = a.topk_ids;
    CHECK_NOTHROW(validate_backward(frozen, p, m, true));
    BackwardArgs bad = frozen;
    bad.topk_ids = reinterpret_cast<const std::int32_t*>(static_cast<const char*>(gib(5)) + 2);
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("topk_ids: must be 4-byte aligned"));
    bad = frozen;
    bad.x = static_cast<const char*>(a.x) + 2;
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("x: must be 16-byte aligned"));
    bad = frozen;
    bad.x = a.dx;
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("dx: overlaps x"));
    bad = frozen;
    bad.topk_ids = static_cast<const std::int32_t*>(a.d_topk_weights);
    CHECK_THROWS_WITH(validate_backward(bad, p, m, true), Catch::StartsWith("d_topk_weights: overlaps topk_ids"));
    bad = frozen;
    bad.x = gib(16);  // device 1's
    CHECK_THROWS_WITH(require_device_memory(backward_tensors(bad, p, m, true), 0, kPlanContext, device0),
                      Catch::StartsWith("x: is memory of device 1"));
    bad = frozen;
    bad.topk_ids = static_cast<const std::int32_t*>(gib(20));  // unknown to the driver
    CHECK_THROWS_WITH(require_device_memory(backward_tensors(bad, p, m, true), 0, kPlanContext, device0),
                      Catch::StartsWith("topk_ids: address") && Catch::Contains("is not CUDA memory"));
  }
}
