#include "dense_ceiling.hpp"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "inputs.hpp"
#include "moejit/error.hpp"

namespace moejit::bench {
namespace {

// C[m x n] = op(A) · op(B), every matrix row-major and contiguous. a_t: A is stored [k x m];
// b_t: B is stored [n x k]. cuBLAS is column-major, where a row-major matrix reads as its
// transpose, so it computes C^T = op(B)^T · op(A)^T: B goes first.
void gemm(const Cublas& blas, DType dtype, int m, int n, int k, const cuda::DeviceBuffer& a, bool a_t,
          const cuda::DeviceBuffer& b, bool b_t, const cuda::DeviceBuffer& c) {
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  check_cublas(cublasGemmEx(blas.get(), b_t ? CUBLAS_OP_T : CUBLAS_OP_N, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                            &alpha, b.as<void>(), type, b_t ? k : n, a.as<void>(), type, a_t ? m : k, &beta,
                            c.as<void>(), type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(status));
  }
}

Cublas::Cublas(CUstream stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  const cublasStatus_t s = cublasSetStream(handle_, stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle_);
    check_cublas(s, "cublasSetStream");
  }
}

Cublas::~Cublas() { cublasDestroy(handle_); }

DenseCeiling::DenseCeiling(const MoeProblem& p, const Cublas& blas, long long l2_bytes, std::uint64_t seed)
    : blas_(blas), tk_(p.tokens * p.topk), hidden_(p.hidden), inter_(p.intermediate), dtype_(p.dtype) {
  if (tk_ > INT_MAX) throw InvalidArgument("tokens", "the dense ceiling needs tokens * topk below 2^31");
  const std::size_t tk = tk_, h = hidden_, i = inter_, elt = 2;
  auto random = [&, next = seed](std::size_t elements, double bound) mutable {
    cuda::DeviceBuffer b(elements * elt);
    fill_uniform(b, dtype_, -bound, bound, next++);
    return b;
  };
  const int n = rotation_copies(2 * tk * h * elt, l2_bytes);
  for (int c = 0; c < n; ++c) {
    x_.push_back(random(tk * h, 1.0));
    d_out_.push_back(random(tk * h, 1.0));
  }
  w1_ = random(2 * i * h, 1.0 / std::sqrt(double(h)));
  w2_ = random(h * i, 1.0 / std::sqrt(double(i)));
  pre_act_ = random(tk * 2 * i, 1.0);
  act_ = random(tk * i, 1.0);
  d_act_ = cuda::DeviceBuffer(tk * i * elt);
  y_ = cuda::DeviceBuffer(tk * h * elt);
  dx_ = cuda::DeviceBuffer(tk * h * elt);
  dw1_ = cuda::DeviceBuffer(2 * i * h * elt);
  dw2_ = cuda::DeviceBuffer(h * i * elt);
}

void DenseCeiling::forward(int step) const {
  const int tk = static_cast<int>(tk_);
  const cuda::DeviceBuffer& x = x_[step % copies()];
  gemm(blas_, dtype_, tk, 2 * inter_, hidden_, x, false, w1_, true, pre_act_);
  gemm(blas_, dtype_, tk, hidden_, inter_, act_, false, w2_, true, y_);
}

void DenseCeiling::backward(int step, bool weight_grads) const {
  const int tk = static_cast<int>(tk_);
  const cuda::DeviceBuffer& x = x_[step % copies()];
  const cuda::DeviceBuffer& d_out = d_out_[step % copies()];
  gemm(blas_, dtype_, tk, inter_, hidden_, d_out, false, w2_, false, d_act_);
  if (weight_grads) gemm(blas_, dtype_, hidden_, inter_, tk, d_out, true, act_, false, dw2_);
  gemm(blas_, dtype_, tk, hidden_, 2 * inter_, pre_act_, false, w1_, false, dx_);
  if (weight_grads) gemm(blas_, dtype_, 2 * inter_, hidden_, tk, pre_act_, true, x, false, dw1_);
}

Stats DenseCeiling::measure(StepKind kind, StreamTimer& timer, int warmup, int iters) const {
  const Step fwd = [this](int step) { forward(step); };
  const Step bwd = [this](int step) { backward(step); };
  switch (kind) {
    case StepKind::kForward:
    case StepKind::kInference: return timer.measure(warmup, iters, {}, fwd);
    case StepKind::kBackward: return timer.measure(warmup, iters, fwd, bwd);
    case StepKind::kFull:
    case StepKind::kMemEff:
    case StepKind::kFrozen: break;
  }
  const bool weight_grads = kind != StepKind::kFrozen;
  return timer.measure(warmup, iters, {}, [this, weight_grads](int step) {
    forward(step);
    backward(step, weight_grads);
  });
}

}  // namespace moejit::bench
