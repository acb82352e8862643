// Host reference for the fused MoE block, forward and backward, in double: a direct
// implementation of the math in include/moejit/moejit.hpp and DESIGN.md ("The math"),
// written independently of the kernels, that GPU tests compare against. It also exposes the
// per-pair intermediates so a failing GPU test can tell which role went wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace moejit::reference {

struct MoeTensors {  // layouts exactly as in include/moejit/moejit.hpp
  long long tokens = 0;
  int experts = 0, hidden = 0, intermediate = 0, topk = 0;
  std::vector<double> x;               // [T, H]
  std::vector<double> w1;              // [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up
  std::vector<double> w2;              // [E, H, I]
  std::vector<std::int32_t> topk_ids;  // [T, K]; ids outside [0, E) are dropped
  std::vector<double> topk_weights;    // [T, K]
};

// Per-pair tensors are indexed by the flat pair p = t*K + k (not the sorted order) and are zero
// for dropped pairs.
struct ForwardReference {
  std::vector<double> out;      // [T, H]
  std::vector<double> pre_act;  // [TK, 2I]: g (cols 0..I-1) and u (cols I..2I-1) = x[t] W1[e]^T
  std::vector<double> act;      // [TK, I]: silu(g) * u
  std::vector<double> y;        // [TK, H]: act W2[e]^T, not weighted by s
};

struct BackwardReference {
  std::vector<double> dx, dw1, dw2, d_topk_weights;  // shapes of x, w1, w2, topk_weights
  std::vector<double> d_act;         // [TK, I]: dO[t] W2[e], not weighted by s
  std::vector<double> d_pre_act;     // [TK, 2I]: dg (cols 0..I-1), du (cols I..2I-1), s folded in
  std::vector<double> weighted_act;  // [TK, I]: s * act
};

struct ReferenceOptions {
  // Applied to every intermediate the GPU stores in its storage dtype (pre_act, act, y,
  // d_pre_act, weighted_act) right after computing it and before later stages use it, so a test
  // can mimic the GPU's bf16/fp16 storage; identity when empty. Like the GPU, forward computes
  // act from the unrounded g, u while backward recomputes it from the stored (rounded) pre_act;
  // d_act and d_topk_weights stay unrounded (the GPU keeps them in fp32).
  std::function<double(double)> round_stored;
  unsigned threads = 0;  // 0: std::thread::hardware_concurrency()
};

// Both throw InvalidArgument naming the first field that is out of range or whose size disagrees
// with the shape.
ForwardReference moe_forward(const MoeTensors& tensors, const ReferenceOptions& options = {});
BackwardReference moe_backward(const MoeTensors& tensors, const std::vector<double>& d_out,
                               const ReferenceOptions& options = {});

}  // namespace moejit::reference
