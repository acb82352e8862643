// The C ABI over FusedMoe: exceptions become status codes plus a thread-local message.
#include "moejit/moejit.h"

#include <string>

#include "capi/guarded.hpp"
#include "moe/memory_layout.hpp"
#include "moe/validate.hpp"
#include "moejit/moejit.hpp"
#include "moejit/version.hpp"

struct moejit_plan {
  moejit::FusedMoe plan;
};

namespace {

thread_local std::string last_error;
// Copying a message allocates: where that fails, this static text stands in for it.
thread_local const char* unkept_error = nullptr;

moejit_plan* require_plan(moejit_plan* plan) {
  if (plan == nullptr) throw moejit::InvalidArgument("plan", "null plan");
  return plan;
}

moejit::MoeProblem to_problem(const moejit_problem* p) {
  if (p == nullptr) throw moejit::InvalidArgument("problem", "null pointer");
  return {p->tokens,
          p->experts,
          p->hidden,
          p->intermediate,
          p->topk,
          static_cast<moejit::DType>(p->dtype),
          static_cast<moejit::Mode>(p->mode)};
}

}  // namespace

namespace moejit::capi {

void clear_error() noexcept {
  last_error.clear();
  unkept_error = nullptr;
}

void set_error(const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    unkept_error = "out of host memory (the error's own message could not be kept)";
  }
}

}  // namespace moejit::capi

using moejit::capi::guarded;

extern "C" {

moejit_status moejit_plan_create_on_stream(const moejit_problem* p, void* stream, moejit_plan** out) {
  return guarded([&] {
    if (out != nullptr) *out = nullptr;
    const moejit::MoeProblem problem = to_problem(p);
    if (out == nullptr) throw moejit::InvalidArgument("out", "null pointer");
    moejit::Options options;
    options.check_expert_ids = p->check_expert_ids != 0;
    options.stream = static_cast<CUstream_st*>(stream);
    *out = new moejit_plan{moejit::FusedMoe(problem, options)};
  });
}

moejit_status moejit_plan_create(const moejit_problem* p, moejit_plan** out) {
  return moejit_plan_create_on_stream(p, nullptr, out);
}

void moejit_plan_destroy(moejit_plan* plan) { delete plan; }

moejit_status moejit_plan_memory(const moejit_plan* plan, moejit_memory_plan* out) {
  return guarded([&] {
    if (plan == nullptr) throw moejit::InvalidArgument("plan", "null plan");
    if (out == nullptr) throw moejit::InvalidArgument("out", "null pointer");
    const moejit::MemoryPlan& m = plan->plan.memory();
    *out = {m.saved_bytes, m.forward_workspace_bytes, m.backward_workspace_bytes};
  });
}

moejit_status moejit_problem_memory(const moejit_problem* p, moejit_memory_plan* out) {
  return guarded([&] {
    const moejit::MoeProblem problem = to_problem(p);
    if (out == nullptr) throw moejit::InvalidArgument("out", "null pointer");
    moejit::validate_problem(problem);
    const moejit::MemoryLayout l = moejit::memory_layout(problem);
    *out = {l.saved_bytes, l.forward_bytes, l.backward_bytes};
  });
}

moejit_status moejit_forward(moejit_plan* plan, const void* x, const void* w1, const void* w2, const int32_t* topk_ids,
                             const void* topk_weights, void* out, void* saved, size_t saved_bytes, void* workspace,
                             size_t workspace_bytes, void* stream) {
  return guarded([&] {
    moejit::ForwardArgs a;
    a.x = x;
    a.w1 = w1;
    a.w2 = w2;
    a.topk_ids = topk_ids;
    a.topk_weights = topk_weights;
    a.out = out;
    a.saved = saved;
    a.saved_bytes = saved_bytes;
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    a.stream = static_cast<CUstream_st*>(stream);
    require_plan(plan)->plan.forward(a);
  });
}

moejit_status moejit_backward(moejit_plan* plan, const void* d_out, const void* x, const void* w1, const void* w2,
                              const int32_t* topk_ids, const void* topk_weights, void* saved, size_t saved_bytes,
                              void* dx, void* dw1, void* dw2, void* d_topk_weights, void* workspace,
                              size_t workspace_bytes, void* stream) {
  return guarded([&] {
    moejit::BackwardArgs a;
    a.d_out = d_out;
    a.x = x;
    a.w1 = w1;
    a.w2 = w2;
    a.topk_ids = topk_ids;
    a.topk_weights = topk_weights;
    a.saved = saved;
    a.saved_bytes = saved_bytes;
    a.dx = dx;
    a.dw1 = dw1;
    a.dw2 = dw2;
    a.d_topk_weights = d_topk_weights;
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    a.stream = static_cast<CUstream_st*>(stream);
    require_plan(plan)->plan.backward(a);
  });
}

moejit_status moejit_plan_adopt_saved(moejit_plan* plan, const void* saved) {
  return guarded([&] { require_plan(plan)->plan.adopt_saved(saved); });
}

moejit_status moejit_set_option(const char* name, const char* value) {
  return guarded([&] {
    if (name == nullptr) throw moejit::InvalidArgument("name", "null pointer");
    moejit::set_option(name, value);
  });
}

moejit_status moejit_clear_option(const char* name) {
  return guarded([&] {
    if (name == nullptr) throw moejit::InvalidArgument("name", "null pointer");
    moejit::clear_option(name);
  });
}

const char* moejit_last_error(void) { return unkept_error != nullptr ? unkept_error : last_error.c_str(); }

const char* moejit_status_name(moejit_status status) {
  return moejit::error_code_name(static_cast<moejit::ErrorCode>(status));
}

const char* moejit_version(void) { return moejit::kLibraryVersion; }

}  // extern "C"
