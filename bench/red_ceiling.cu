// What a fused combine would cost: fwd_down's epilogue adding s·Y rows straight into `out` with
// vector reductions (red.global.add) instead of storing Y for gather_sum to read back. Times, on
// buffers as the default shape's step has them (rows sorted by expert, each token's K rows in K
// experts drawn uniformly, never zeros), with CUDA events after warm-up, median of the repeats:
//   gather_sum       today's combine: per token, K rows of Y read, weighted, summed in fp32, bf16 out
//   red_f32          red_rows into an fp32 out: per sorted row, s·row added (red.v4.f32)
//   red_bf16         red_rows into a bf16 out (red.noftz.v4.bf16x2): rounded at every add
//   from registers   the same reductions of values made in registers, without reading Y: the
//                    cost the epilogue would add, since its rows are in registers already
//   memset, fp32->bf16   what a reduction target needs before and (fp32) after
// A standalone tool (the project compiles its kernels with NVRTC; this one needs nvcc):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o build/redtool/red_ceiling bench/red_ceiling.cu
//   build/redtool/red_ceiling [T ...]          (default 8192 32768; E=128, H=2048, K=8)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "bf16x8.cuh"
#include "event_timing.cuh"

namespace {

using bench_tool::check;
using bench_tool::unpack;
using bench_tool::median_ms;

constexpr int kE = 128, kH = 2048, kK = 8;
constexpr int kThreads = kH / 8;  // one 16-byte chunk of a row per thread

__device__ __forceinline__ void red_v4_f32(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

__device__ __forceinline__ void red_v4_bf16x2(__nv_bfloat16* p, uint4 v) {
  asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Values of sorted row r, chunk c, made in registers (nonzero, varying).
__device__ __forceinline__ void synth(int r, int c, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = 0.25f + 1e-3f * static_cast<float>((r * 7 + c * 8 + i) & 1023);
}

// Row r's chunk c: read from Y, or made in registers.
template <bool kFromY>
__device__ __forceinline__ void row_values(const __nv_bfloat16* y, int r, int c, float (&f)[8]) {
  if (kFromY) {
    unpack(*reinterpret_cast<const uint4*>(y + static_cast<size_t>(r) * kH + c * 8), f);
  } else {
    synth(r, c, f);
  }
}

__global__ void gather_sum(const __nv_bfloat16* y, const int* token_rows, const float* s, __nv_bfloat16* out) {
  const int t = blockIdx.x, c = threadIdx.x;
  float acc[8] = {};
  for (int k = 0; k < kK; ++k) {
    const int r = token_rows[t * kK + k];
    float f[8];
    unpack(*reinterpret_cast<const uint4*>(y + static_cast<size_t>(r) * kH + c * 8), f);
    const float w = s[t * kK + k];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += w * f[i];
  }
  const uint4 v{pack2(acc[0], acc[1]), pack2(acc[2], acc[3]), pack2(acc[4], acc[5]), pack2(acc[6], acc[7])};
  *reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * kH + c * 8) = v;
}

// Sorted row r's chunk c, weighted by its score, added into its token's row of `out`.
template <bool kFromY, typename Out>
__global__ void red_rows(const __nv_bfloat16* y, const int* row_token, const float* row_s, Out* out) {
  const int r = blockIdx.x, c = threadIdx.x;
  float f[8];
  row_values<kFromY>(y, r, c, f);
  const float w = row_s[r];
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] *= w;
  Out* p = out + static_cast<size_t>(row_token[r]) * kH + c * 8;
  if constexpr (std::is_same_v<Out, float>) {
    red_v4_f32(p, f[0], f[1], f[2], f[3]);
    red_v4_f32(p + 4, f[4], f[5], f[6], f[7]);
  } else {
    red_v4_bf16x2(p, uint4{pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7])});
  }
}

__global__ void f32_to_bf16(const float* in, __nv_bfloat16* out, size_t n8) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n8; i += size_t{gridDim.x} * blockDim.x) {
    const float4 a = reinterpret_cast<const float4*>(in)[2 * i], b = reinterpret_cast<const float4*>(in)[2 * i + 1];
    reinterpret_cast<uint4*>(out)[i] = uint4{pack2(a.x, a.y), pack2(a.z, a.w), pack2(b.x, b.y), pack2(b.z, b.w)};
  }
}

void run(int tokens) {
  const int pairs = tokens * kK;
  // Each token's K distinct experts drawn uniformly; rows sorted by expert, stable in (t, k).
  std::mt19937 rng(1234 + tokens);
  std::vector<int> expert(pairs);
  std::vector<int> perm(kE);
  std::iota(perm.begin(), perm.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < kK; ++k) expert[t * kK + k] = perm[k];
  }
  std::vector<int> order(pairs);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return expert[a] < expert[b]; });
  std::vector<int> token_rows(pairs), row_token(pairs);
  std::vector<float> s(pairs), row_s(pairs);
  std::uniform_real_distribution<float> score(0.05f, 0.3f);
  for (auto& v : s) v = score(rng);
  for (int r = 0; r < pairs; ++r) {
    token_rows[order[r]] = r;
    row_token[r] = order[r] / kK;
    row_s[r] = s[order[r]];
  }
  std::vector<__nv_bfloat16> y_host(static_cast<size_t>(pairs) * kH);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  for (auto& v : y_host) v = __float2bfloat16(val(rng) + 2.f);

  const size_t y_bytes = y_host.size() * 2, out_elems = static_cast<size_t>(tokens) * kH;
  __nv_bfloat16 *y, *out_bf16;
  float *out_f32, *d_s, *d_row_s;
  int *d_token_rows, *d_row_token;
  check(cudaMalloc(&y, y_bytes), "malloc");
  check(cudaMalloc(&out_bf16, out_elems * 2), "malloc");
  check(cudaMalloc(&out_f32, out_elems * 4), "malloc");
  check(cudaMalloc(&d_s, pairs * 4), "malloc");
  check(cudaMalloc(&d_row_s, pairs * 4), "malloc");
  check(cudaMalloc(&d_token_rows, pairs * 4), "malloc");
  check(cudaMalloc(&d_row_token, pairs * 4), "malloc");
  check(cudaMemcpy(y, y_host.data(), y_bytes, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(d_s, s.data(), pairs * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(d_row_s, row_s.data(), pairs * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(d_token_rows, token_rows.data(), pairs * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(d_row_token, row_token.data(), pairs * 4, cudaMemcpyHostToDevice), "copy");

  const float gs = median_ms([&] { gather_sum<<<tokens, kThreads>>>(y, d_token_rows, d_s, out_bf16); });
  const float zero_f32 = median_ms([&] { cudaMemsetAsync(out_f32, 0, out_elems * 4); });
  const float zero_bf16 = median_ms([&] { cudaMemsetAsync(out_bf16, 0, out_elems * 2); });
  const float conv = median_ms([&] { f32_to_bf16<<<132 * 8, 256>>>(out_f32, out_bf16, out_elems / 8); });
  const float f32_y = median_ms([&] { red_rows<true, float><<<pairs, kThreads>>>(y, d_row_token, d_row_s, out_f32); });
  const float f32_r = median_ms([&] { red_rows<false, float><<<pairs, kThreads>>>(y, d_row_token, d_row_s, out_f32); });
  const float b16_y = median_ms([&] { red_rows<true, __nv_bfloat16><<<pairs, kThreads>>>(y, d_row_token, d_row_s, out_bf16); });
  const float b16_r = median_ms([&] { red_rows<false, __nv_bfloat16><<<pairs, kThreads>>>(y, d_row_token, d_row_s, out_bf16); });

  // One accuracy check of the bf16 path against gather_sum's fp32 sums (run once, from zero).
  check(cudaMemset(out_bf16, 0, out_elems * 2), "memset");
  red_rows<true, __nv_bfloat16><<<pairs, kThreads>>>(y, d_row_token, d_row_s, out_bf16);
  std::vector<__nv_bfloat16> red_out(out_elems), ref_out(out_elems);
  check(cudaMemcpy(red_out.data(), out_bf16, out_elems * 2, cudaMemcpyDeviceToHost), "copy");
  gather_sum<<<tokens, kThreads>>>(y, d_token_rows, d_s, out_bf16);
  check(cudaMemcpy(ref_out.data(), out_bf16, out_elems * 2, cudaMemcpyDeviceToHost), "copy");
  double num = 0, den = 0;
  for (size_t i = 0; i < out_elems; ++i) {
    const double a = __bfloat162float(red_out[i]), b = __bfloat162float(ref_out[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }

  const double y_gb = y_bytes / 1e9;
  std::printf("T=%d  Y %.2f GB, out %.0f MB (bf16)\n", tokens, y_gb, out_elems * 2 / 1e6);
  std::printf("  gather_sum           %8.1f us  (%.2f TB/s of Y)\n", gs * 1e3, y_gb / gs);
  std::printf("  memset out fp32      %8.1f us   bf16 %.1f us   fp32->bf16 %.1f us\n", zero_f32 * 1e3,
              zero_bf16 * 1e3, conv * 1e3);
  std::printf("  red_f32  reading Y   %8.1f us   from registers %8.1f us\n", f32_y * 1e3, f32_r * 1e3);
  std::printf("  red_bf16 reading Y   %8.1f us   from registers %8.1f us\n", b16_y * 1e3, b16_r * 1e3);
  std::printf("  red_bf16 against gather_sum: relative rms %.2e\n", std::sqrt(num / den));
  for (void* p : {static_cast<void*>(y), static_cast<void*>(out_bf16), static_cast<void*>(out_f32),
                  static_cast<void*>(d_s), static_cast<void*>(d_row_s), static_cast<void*>(d_token_rows),
                  static_cast<void*>(d_row_token)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) { return bench_tool::run_token_counts(argc, argv, run); }
