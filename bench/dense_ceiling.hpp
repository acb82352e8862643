// The dense cuBLAS ceiling: GEMMs of the same FLOPs as the fused MoE steps, on dense 16-bit
// operands with fp32 accumulation. A grouped GEMM over gathered tokens does the same math with
// extra indexing, so the dense time is what the fused kernels can at best approach.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <vector>

#include "cuda/handles.hpp"
#include "moejit/moejit.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace moejit::bench {

// Throws std::runtime_error naming the call when a cuBLAS call fails.
void check_cublas(cublasStatus_t status, const char* what);

// Owns a cuBLAS handle bound to one stream.
class Cublas {
 public:
  explicit Cublas(CUstream stream);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Dense operands for one token count (TK = tokens * topk rows), one copy of the weights, and
// rotation copies of the per-step inputs x and dO, all random.
class DenseCeiling {
 public:
  DenseCeiling(const MoeProblem& problem, const Cublas& blas, long long l2_bytes, std::uint64_t seed);

  // [TK x H]·[H x 2I] and [TK x I]·[I x H]: 6·TK·H·I FLOPs.
  void forward(int step) const;
  // dO·W2 [TK x H]·[H x I], dW2 [H x TK]·[TK x I], dX [TK x 2I]·[2I x H], dW1 [2I x TK]·[TK x H]:
  // 12·TK·H·I FLOPs; without weight_grads (frozen) dO·W2 and dX alone, 6·TK·H·I.
  void backward(int step, bool weight_grads = true) const;
  int copies() const { return static_cast<int>(x_.size()); }

  // Times the sequence matching `kind`: forward for forward and inference, forward + backward
  // for full and memeff (frozen: without weight gradients), backward after an untimed forward
  // for backward (as the fused step runs).
  Stats measure(StepKind kind, StreamTimer& timer, int warmup, int iters) const;

 private:
  const Cublas& blas_;
  long long tk_;
  int hidden_, inter_;
  DType dtype_;
  std::vector<cuda::DeviceBuffer> x_, d_out_;  // [TK, H] each
  cuda::DeviceBuffer w1_, w2_;                  // [2I, H], [H, I]
  cuda::DeviceBuffer pre_act_;                  // [TK, 2I]: forward output, backward's d_pre_act
  cuda::DeviceBuffer act_, d_act_;              // [TK, I]
  cuda::DeviceBuffer y_, dx_;                   // [TK, H]
  cuda::DeviceBuffer dw1_, dw2_;                // [2I, H], [H, I]
};

}  // namespace moejit::bench
