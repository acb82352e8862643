// The C ABI on the GPU: the same results as the C++ API.
#include <catch2/catch.hpp>

#include "moejit/moejit.h"
#include "support/differences.hpp"
#include "support/gpu.hpp"
#include "support/moe_case.hpp"

using namespace moejit;
using namespace moejit::test;

TEST_CASE("the C ABI runs forward and backward like the C++ API", "[gpu][capi]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const CaseSpec spec{300, 8, 256, 128, 2, DType::kBF16, Routing::kRandom, 21};
  const CaseData data = make_case(spec);
  const std::size_t th = 300 * 256, ew1 = 8 * 2 * 128 * 256, ew2 = 8 * 256 * 128;

  FusedMoe cpp({spec.tokens, spec.experts, spec.hidden, spec.intermediate, spec.topk});
  DeviceRun a(data, cpp.memory());
  cuda::Stream stream;
  cpp.forward(a.forward_args(stream.get()));
  cpp.backward(a.backward_args(stream.get()));
  stream.synchronize();

  moejit_problem p{spec.tokens, spec.experts, spec.hidden, spec.intermediate, spec.topk, MOEJIT_DTYPE_BF16,
                   MOEJIT_MODE_TRAINING, 0};
  moejit_plan* plan = nullptr;
  REQUIRE(moejit_plan_create_on_stream(&p, stream.get(), &plan) == MOEJIT_OK);
  moejit_memory_plan m{};
  REQUIRE(moejit_plan_memory(plan, &m) == MOEJIT_OK);
  CHECK(m.saved_bytes == cpp.memory().saved_bytes);
  DeviceRun b(data, cpp.memory());
  auto f = b.forward_args(stream.get());
  CHECK(moejit_forward(plan, f.x, f.w1, f.w2, f.topk_ids, f.topk_weights, f.out, f.saved, f.saved_bytes, f.workspace,
                       f.workspace_bytes, stream.get()) == MOEJIT_OK);
  auto g = b.backward_args(stream.get());
  CHECK(moejit_backward(plan, g.d_out, g.x, g.w1, g.w2, g.topk_ids, g.topk_weights, g.saved, g.saved_bytes, g.dx,
                        g.dw1, g.dw2, g.d_topk_weights, g.workspace, g.workspace_bytes, stream.get()) == MOEJIT_OK);
  // A misaligned pointer comes back as a status with the argument named.
  CHECK(moejit_forward(plan, static_cast<const char*>(f.x) + 2, f.w1, f.w2, f.topk_ids, f.topk_weights, f.out, f.saved,
                       f.saved_bytes, f.workspace, f.workspace_bytes, stream.get()) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("x:"));
  // NULL topk_ids, and NULL x without weight gradients: neither is read. With them, x is named.
  DeviceRun c(data, cpp.memory());
  f = c.forward_args(stream.get());
  CHECK(moejit_forward(plan, f.x, f.w1, f.w2, f.topk_ids, f.topk_weights, f.out, f.saved, f.saved_bytes, f.workspace,
                       f.workspace_bytes, stream.get()) == MOEJIT_OK);
  g = c.backward_args(stream.get());
  CHECK(moejit_backward(plan, g.d_out, nullptr, g.w1, g.w2, nullptr, g.topk_weights, g.saved, g.saved_bytes, g.dx,
                        g.dw1, g.dw2, g.d_topk_weights, g.workspace, g.workspace_bytes,
                        stream.get()) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("x: null device pointer"));
  CHECK(moejit_backward(plan, g.d_out, nullptr, g.w1, g.w2, nullptr, g.topk_weights, g.saved, g.saved_bytes, g.dx,
                        nullptr, nullptr, g.d_topk_weights, g.workspace, g.workspace_bytes, stream.get()) == MOEJIT_OK);
  stream.synchronize();
  moejit_plan_destroy(plan);
  CHECK(test::differences(download(a.dx, spec.dtype, th), download(c.dx, spec.dtype, th)) == "none");
  CHECK(rel_l2(download(c.d_weights, spec.dtype, 600), download(a.d_weights, spec.dtype, 600)) < 1e-2);

  CHECK(test::differences(download(a.out, spec.dtype, th), download(b.out, spec.dtype, th)) == "none");
  CHECK(test::differences(download(a.dx, spec.dtype, th), download(b.dx, spec.dtype, th)) == "none");
  CHECK(test::differences(download(a.dw1, spec.dtype, ew1), download(b.dw1, spec.dtype, ew1)) == "none");
  CHECK(test::differences(download(a.dw2, spec.dtype, ew2), download(b.dw2, spec.dtype, ew2)) == "none");
  CHECK(rel_l2(download(b.d_weights, spec.dtype, 600), download(a.d_weights, spec.dtype, 600)) < 1e-2);
}
