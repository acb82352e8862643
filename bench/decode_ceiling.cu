// What a decode-sized forward could cost with its expert GEMMs as GEMVs: at T = 1 the step
// touches K experts with one row each, and moejit's 16-row tiles stream those experts' weights at
// about 2.5 TB/s (fwd_up 20 µs, fwd_down 10 µs in place, session 43). Times, at the default shape
// (E=128, H=2048, I=768, K=8, bf16), each token's K experts distinct and drawn uniformly, a fresh
// routing per launch so the 9.4 MB an expert never sits in L2, batches of launches back to back
// timed by CUDA events (the mean launch of each batch; the median batch):
//   stream      reads the touched experts' W1 and W2 rows once with the GEMVs' warp mapping and
//               no arithmetic: the floor of these bytes in this access pattern
//   up_gemv     a[p] = silu(W1[e]_gate x) · (W1[e]_up x): a warp per (touched expert, row j), which
//               reads gate row j and up row j once for all of the expert's pairs
//   down_gemv   y[p] = W2[e] a[p]: a warp per (touched expert, four rows h)
// Each GEMV is checked against an fp64 host reference on the last routing (max relative error).
// A standalone tool (the project compiles its kernels with NVRTC; this one needs nvcc):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o build/decodetool/decode_ceiling bench/decode_ceiling.cu
//   (add -DDECODE_MIN_BLOCKS=1 for the variant without spills, below)
//   build/decodetool/decode_ceiling [T ...]          (default 1 2 4 8 16)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bf16x8.cuh"
#include "event_timing.cuh"

namespace {

using bench_tool::check;
using bench_tool::unpack;

constexpr int kE = 128, kH = 2048, kI = 768, kK = 8;
constexpr int kWarps = 8;                      // warps a block
// Blocks an SM must hold: 2 caps registers at 128 (up_gemv spills 120 bytes), 1 leaves it 169
// (no spills, 8 warps an SM). -DDECODE_MIN_BLOCKS=1 builds the other.
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 2
#endif
constexpr int kMinBlocks = DECODE_MIN_BLOCKS;
constexpr int kUpChunks = kH / 8 / 32;         // 16-byte chunks of a W1 row per lane (8)
constexpr int kDownChunks = kI / 8 / 32;       // 16-byte chunks of a W2 row per lane (3)
constexpr int kDownRows = 4;                   // W2 rows a warp
constexpr int kRoutings = 32;                  // routings cycled through, 2.4 GB of weights touched
constexpr int kBatch = 20;                     // launches a timed batch
constexpr int kMaxTokens = 64;                 // the fp64 check's cost grows with the pairs

// A routing sorted by expert: the touched experts, each one's pairs (offsets into pair_token).
struct Routing {
  const int* experts;     // [touched]
  const int* offsets;     // [touched + 1]
  const int* pair_token;  // [T*K], by sorted pair
  int touched;
};

__device__ __forceinline__ uint4 load_stream(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  float fa[8], fb[8];
  unpack(a, fa);
  unpack(b, fb);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(fa[i], fb[i], s);
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Warp w of the grid: touched expert w / rows_per_expert, its (w % rows_per_expert)-th row group.
__device__ __forceinline__ bool warp_item(const Routing& r, int groups, int& e_slot, int& group) {
  const int w = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  e_slot = w / groups;
  group = w % groups;
  return e_slot < r.touched;
}

__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) stream(Routing r, const __nv_bfloat16* w1, const __nv_bfloat16* w2,
                                                      float* sink) {
  int e_slot, j;
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  if (warp_item(r, kI, e_slot, j)) {
    const std::size_t e = r.experts[e_slot];
    const __nv_bfloat16* gate = w1 + (e * 2 * kI + j) * kH;
    const __nv_bfloat16* up = gate + static_cast<std::size_t>(kI) * kH;
    uint4 v[2 * kUpChunks];
#pragma unroll
    for (int c = 0; c < kUpChunks; ++c) {
      v[c] = load_stream(gate + (c * 32 + lane) * 8);
      v[kUpChunks + c] = load_stream(up + (c * 32 + lane) * 8);
    }
    // W2's share: the same bytes a down_gemv warp reads, spread over the up warps (H/4 groups).
    if (j < kH / kDownRows) {
      for (int h = j * kDownRows; h < (j + 1) * kDownRows; ++h) {
#pragma unroll
        for (int c = 0; c < kDownChunks; ++c) {
          const uint4 u = load_stream(w2 + (e * kH + h) * kI + (c * 32 + lane) * 8);
          acc += __uint_as_float(u.x ^ u.y ^ u.z ^ u.w);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < 2 * kUpChunks; ++c) acc += __uint_as_float(v[c].x ^ v[c].y ^ v[c].z ^ v[c].w);
  }
  if (acc == 1234.5f) *sink = acc;  // keeps the loads; never true for these bits in practice
}

__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) up_gemv(Routing r, const __nv_bfloat16* x, const __nv_bfloat16* w1,
                                                       __nv_bfloat16* act) {
  int e_slot, j;
  if (!warp_item(r, kI, e_slot, j)) return;
  const int lane = threadIdx.x % 32;
  const std::size_t e = r.experts[e_slot];
  const __nv_bfloat16* gate = w1 + (e * 2 * kI + j) * kH;
  const __nv_bfloat16* up = gate + static_cast<std::size_t>(kI) * kH;
  uint4 g[kUpChunks], u[kUpChunks];
#pragma unroll
  for (int c = 0; c < kUpChunks; ++c) {
    g[c] = load_stream(gate + (c * 32 + lane) * 8);
    u[c] = load_stream(up + (c * 32 + lane) * 8);
  }
  for (int p = r.offsets[e_slot]; p < r.offsets[e_slot + 1]; ++p) {
    const __nv_bfloat16* xt = x + static_cast<std::size_t>(r.pair_token[p]) * kH;
    float sg = 0.f, su = 0.f;
#pragma unroll
    for (int c = 0; c < kUpChunks; ++c) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xt + (c * 32 + lane) * 8);
      sg += dot8(g[c], xv);
      su += dot8(u[c], xv);
    }
    sg = warp_sum(sg);
    su = warp_sum(su);
    if (lane == 0) act[static_cast<std::size_t>(p) * kI + j] = __float2bfloat16(sg / (1.f + __expf(-sg)) * su);
  }
}

__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) down_gemv(Routing r, const __nv_bfloat16* act,
                                                         const __nv_bfloat16* w2, __nv_bfloat16* y) {
  int e_slot, group;
  if (!warp_item(r, kH / kDownRows, e_slot, group)) return;
  const int lane = threadIdx.x % 32;
  const std::size_t e = r.experts[e_slot];
  uint4 w[kDownRows][kDownChunks];
#pragma unroll
  for (int i = 0; i < kDownRows; ++i) {
#pragma unroll
    for (int c = 0; c < kDownChunks; ++c) {
      w[i][c] = load_stream(w2 + (e * kH + group * kDownRows + i) * kI + (c * 32 + lane) * 8);
    }
  }
  for (int p = r.offsets[e_slot]; p < r.offsets[e_slot + 1]; ++p) {
    const __nv_bfloat16* a = act + static_cast<std::size_t>(p) * kI;
    uint4 av[kDownChunks];
#pragma unroll
    for (int c = 0; c < kDownChunks; ++c) av[c] = *reinterpret_cast<const uint4*>(a + (c * 32 + lane) * 8);
#pragma unroll
    for (int i = 0; i < kDownRows; ++i) {
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < kDownChunks; ++c) s += dot8(w[i][c], av[c]);
      s = warp_sum(s);
      if (lane == 0) y[static_cast<std::size_t>(p) * kH + group * kDownRows + i] = __float2bfloat16(s);
    }
  }
}

float bf16_value(__nv_bfloat16 v) { return __bfloat162float(v); }

struct HostRouting {
  std::vector<int> experts, offsets, pair_token;
};

// T tokens, each of K distinct experts drawn uniformly, pairs sorted by expert.
HostRouting make_routing(int tokens, std::mt19937& rng) {
  std::vector<std::vector<int>> by_expert(kE);
  std::vector<int> ids(kE);
  std::iota(ids.begin(), ids.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int k = 0; k < kK; ++k) by_expert[ids[k]].push_back(t);
  }
  HostRouting h;
  h.offsets.push_back(0);
  for (int e = 0; e < kE; ++e) {
    if (by_expert[e].empty()) continue;
    h.experts.push_back(e);
    h.pair_token.insert(h.pair_token.end(), by_expert[e].begin(), by_expert[e].end());
    h.offsets.push_back(static_cast<int>(h.pair_token.size()));
  }
  return h;
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(&d, v.size() * sizeof(T)), "malloc");
  check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

template <typename T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> v(n);
  check(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}

std::vector<__nv_bfloat16> random_bf16(std::size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& e : v) {
    float f = u(rng);
    if (f == 0.f) f = scale * 0.5f;  // never zeros
    e = __float2bfloat16(f);
  }
  return v;
}

struct Weights {
  std::vector<__nv_bfloat16> w1, w2;
  __nv_bfloat16 *d_w1 = nullptr, *d_w2 = nullptr;
};

// Batches of kBatch launches back to back, each on the next routing: the median batch's mean.
template <typename F>
float per_launch_us(F&& launch) {
  int next = 0;
  const float batch_ms = bench_tool::median_ms([&] {
    for (int i = 0; i < kBatch; ++i) launch(next++ % kRoutings);
  });
  return batch_ms * 1000.f / kBatch;
}

void run(int tokens, const Weights& wt, std::mt19937& rng) {
  if (tokens < 1 || tokens > kMaxTokens) {
    std::printf("T=%d: out of this tool's range (1 to %d)\n", tokens, kMaxTokens);
    return;
  }
  const std::vector<__nv_bfloat16> x = random_bf16(static_cast<std::size_t>(tokens) * kH, 1.f, rng);
  __nv_bfloat16* d_x = upload(x);
  __nv_bfloat16 *d_act = nullptr, *d_y = nullptr;
  float* d_sink = nullptr;
  check(cudaMalloc(&d_act, static_cast<std::size_t>(tokens) * kK * kI * sizeof(__nv_bfloat16)), "malloc");
  check(cudaMalloc(&d_y, static_cast<std::size_t>(tokens) * kK * kH * sizeof(__nv_bfloat16)), "malloc");
  check(cudaMalloc(&d_sink, sizeof(float)), "malloc");

  std::vector<HostRouting> host;
  std::vector<Routing> dev;
  double touched = 0;
  for (int i = 0; i < kRoutings; ++i) {
    host.push_back(make_routing(tokens, rng));
    const HostRouting& h = host.back();
    dev.push_back({upload(h.experts), upload(h.offsets), upload(h.pair_token), static_cast<int>(h.experts.size())});
    touched += static_cast<double>(h.experts.size()) / kRoutings;
  }
  const auto blocks = [&](const Routing& r, int groups) { return (r.touched * groups + kWarps - 1) / kWarps; };
  const int threads = kWarps * 32;
  const float t_stream = per_launch_us(
      [&](int i) { stream<<<blocks(dev[i], kI), threads>>>(dev[i], wt.d_w1, wt.d_w2, d_sink); });
  const float t_up = per_launch_us(
      [&](int i) { up_gemv<<<blocks(dev[i], kI), threads>>>(dev[i], d_x, wt.d_w1, d_act); });
  const float t_down = per_launch_us(
      [&](int i) { down_gemv<<<blocks(dev[i], kH / kDownRows), threads>>>(dev[i], d_act, wt.d_w2, d_y); });

  // The last routing, checked against fp64: act from x, then y from the device's own act.
  const int last = kRoutings - 1;
  up_gemv<<<blocks(dev[last], kI), threads>>>(dev[last], d_x, wt.d_w1, d_act);
  down_gemv<<<blocks(dev[last], kH / kDownRows), threads>>>(dev[last], d_act, wt.d_w2, d_y);
  check(cudaDeviceSynchronize(), "check run");
  const HostRouting& h = host[last];
  const std::size_t pairs = h.pair_token.size();
  const std::vector<__nv_bfloat16> act = download(d_act, pairs * kI), y = download(d_y, pairs * kH);
  double err_act = 0, err_y = 0;
  for (std::size_t s = 0; s < h.experts.size(); ++s) {
    const std::size_t e = h.experts[s];
    for (int p = h.offsets[s]; p < h.offsets[s + 1]; ++p) {
      const __nv_bfloat16* xt = x.data() + static_cast<std::size_t>(h.pair_token[p]) * kH;
      double num = 0, den = 0;
      for (int j = 0; j < kI; ++j) {
        double g = 0, u = 0;
        for (int k = 0; k < kH; ++k) {
          g += double(bf16_value(wt.w1[(e * 2 * kI + j) * kH + k])) * bf16_value(xt[k]);
          u += double(bf16_value(wt.w1[(e * 2 * kI + kI + j) * kH + k])) * bf16_value(xt[k]);
        }
        const double ref = g / (1 + std::exp(-g)) * u, got = bf16_value(act[static_cast<std::size_t>(p) * kI + j]);
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
      err_act = std::max(err_act, std::sqrt(num / den));
      num = den = 0;
      for (int hh = 0; hh < kH; ++hh) {
        double ref = 0;
        for (int j = 0; j < kI; ++j) {
          ref += double(bf16_value(wt.w2[(e * kH + hh) * kI + j])) * bf16_value(act[static_cast<std::size_t>(p) * kI + j]);
        }
        const double got = bf16_value(y[static_cast<std::size_t>(p) * kH + hh]);
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
      err_y = std::max(err_y, std::sqrt(num / den));
    }
  }
  const double mb = touched * (2.0 * kI * kH + double(kH) * kI) * 2 / 1e6;
  std::printf("T=%d  experts touched %.1f  weights %.1f MB  stream %.1f us (%.2f TB/s)  up_gemv %.1f us  "
              "down_gemv %.1f us  up+down %.1f us (%.2f TB/s)  rel err act %.1e y %.1e\n",
              tokens, touched, mb, t_stream, mb / t_stream, t_up, t_down, t_up + t_down,
              mb / (t_up + t_down), err_act, err_y);
  for (Routing& r : dev) {
    cudaFree(const_cast<int*>(r.experts));
    cudaFree(const_cast<int*>(r.offsets));
    cudaFree(const_cast<int*>(r.pair_token));
  }
  cudaFree(d_x);
  cudaFree(d_act);
  cudaFree(d_y);
  cudaFree(d_sink);
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(20261202);
  Weights wt;
  wt.w1 = random_bf16(static_cast<std::size_t>(kE) * 2 * kI * kH, 1.f / std::sqrt(float(kH)), rng);
  wt.w2 = random_bf16(static_cast<std::size_t>(kE) * kH * kI, 1.f / std::sqrt(float(kI)), rng);
  wt.d_w1 = upload(wt.w1);
  wt.d_w2 = upload(wt.w2);
  std::vector<int> tokens;
  for (int i = 1; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  if (tokens.empty()) tokens = {1, 2, 4, 8, 16};
  for (int t : tokens) run(t, wt, rng);
  cudaFree(wt.d_w1);
  cudaFree(wt.d_w2);
  return 0;
}
