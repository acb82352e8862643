// SwiGLU forward and backward in fp32. Every kernel that produces or recomputes an activation
// calls these, with explicitly rounded operations, so the forward, the backward and the
// memory-efficient recompute agree bit for bit.
#pragma once

#include "common/types.cuh"

namespace moejit {

struct SwiGlu {
  // 1 / (1 + e^-g) from one MUFU.EX2 and one MUFU.RCP (each within an ulp; flushing what would
  // be denormal, where sigmoid is 0 or 1 anyway). IEEE-rounded, the reciprocal cost a Newton step
  // and a range check with a branch, and the exponential a denormal fix-up: 12 of bwd_down's 42
  // epilogue instructions per element (ncu, session 10). Not volatile, so repeated calls on one g
  // fold into one.
  __device__ __forceinline__ static float sigmoid(float g) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(e) : "f"(__fmul_rn(g, -1.4426950408889634f)));
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(__fadd_rn(1.f, e)));
    return r;
  }

  // silu(g) * u
  __device__ __forceinline__ static float act(float g, float u) { return __fmul_rn(__fmul_rn(g, sigmoid(g)), u); }

  // s * silu(g) * u: the weighted activation dW2 consumes.
  __device__ __forceinline__ static float weighted_act(float g, float u, float s) { return __fmul_rn(s, act(g, u)); }

  // Gradients of act(g, u) given d(act).
  __device__ __forceinline__ static void backward(float g, float u, float d_act, float& dg, float& du) {
    const float sg = sigmoid(g);
    const float silu = __fmul_rn(g, sg);
    du = __fmul_rn(d_act, silu);
    // d silu/dg = sg * (1 + g * (1 - sg)), the inner product and sum fused: only bwd_down takes
    // this derivative, so no other kernel's rounding need match it.
    const float dsilu = __fmul_rn(sg, __fmaf_rn(g, __fsub_rn(1.f, sg), 1.f));
    dg = __fmul_rn(__fmul_rn(d_act, u), dsilu);
  }
};

}  // namespace moejit
