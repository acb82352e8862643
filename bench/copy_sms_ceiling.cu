// What the x scatter would cost on a few SMs of its own beside fwd_up (performance log, session
// 33, "Next"): x copied into sorted order in the gather form, sorted row r <- x[token(r)], rows in
// expert order as fwd_up would consume them, by S blocks of one SM each, alone on the card.
// Times with CUDA events after warm-up, median of the repeats, on x of random values and a
// routing of K distinct experts per token drawn uniformly (rows sorted by expert):
//   vector  each thread moves 16-byte chunks of kRowsInFlight rows at once (loads, then stores)
//   bulk    one thread moves rows through 192 KB of shared memory by bulk copies
//           (cp.async.bulk global -> shared on an mbarrier, then shared -> global), two halves in turn
// and prints GB/s (bytes read + written) in all and per SM. An upper bound for the fused form: a
// GEMM beside it shares DRAM and L2.
// A standalone tool (the project compiles its kernels with NVRTC; this one needs nvcc):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o build/copytool/copy_sms_ceiling bench/copy_sms_ceiling.cu
//   build/copytool/copy_sms_ceiling [T ...]          (default 8192 32768; E=128, H=2048, K=8)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "event_timing.cuh"

namespace {

using bench_tool::check;
using bench_tool::median_ms;

constexpr int kE = 128, kH = 2048, kK = 8;
constexpr int kRowBytes = kH * 2;
constexpr int kVectorThreads = 1024;
constexpr int kChunksPerRow = kRowBytes / 16;                        // 256 threads per row
constexpr int kRowsPerPass = kVectorThreads / kChunksPerRow;         // 4
constexpr int kRowsInFlight = 4;                                     // per thread: 16 rows per block
constexpr int kBulkHalfRows = 24;                                    // 2 x 24 x 4 KB = 192 KB
constexpr int kBulkSmem = 2 * kBulkHalfRows * kRowBytes + 64;

// Rows [S*16*i + 16*b, ...) of block b in pass i: the blocks sweep the sorted rows in order.
__global__ void __launch_bounds__(kVectorThreads) copy_vector(const uint4* x, const int* token, uint4* rows, int n_rows) {
  const int chunk = threadIdx.x % kChunksPerRow, lane_row = threadIdx.x / kChunksPerRow;
  constexpr int kBlockRows = kRowsPerPass * kRowsInFlight;
  for (int base = blockIdx.x * kBlockRows; base < n_rows; base += gridDim.x * kBlockRows) {
    uint4 v[kRowsInFlight];
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int r = base + j * kRowsPerPass + lane_row;
      if (r < n_rows) v[j] = x[static_cast<int64_t>(token[r]) * kChunksPerRow + chunk];
    }
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int r = base + j * kRowsPerPass + lane_row;
      if (r < n_rows) rows[static_cast<int64_t>(r) * kChunksPerRow + chunk] = v[j];
    }
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// One thread per block: half h of the ring takes a batch of rows (bulk loads completing on bar[h]),
// then leaves by bulk stores, while the other half loads the next batch.
__global__ void copy_bulk(const unsigned char* x, const int* token, unsigned char* rows, int n_rows) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 2 * kBulkHalfRows * kRowBytes);
  if (threadIdx.x != 0) return;
  for (int h = 0; h < 2; ++h) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar + h)));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  uint32_t phase[2] = {0, 0};
  int batch = 0;
  for (int base = blockIdx.x * kBulkHalfRows; base < n_rows; base += gridDim.x * kBulkHalfRows, ++batch) {
    const int h = batch & 1;
    unsigned char* buf = smem + h * kBulkHalfRows * kRowBytes;
    // This half's stores of two batches ago have read it (at most the last batch's group pends).
    if (batch >= 2) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
    const int count = min(kBulkHalfRows, n_rows - base);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar + h)),
                 "r"(count * kRowBytes)
                 : "memory");
    for (int j = 0; j < count; ++j) {
      const unsigned char* src = x + static_cast<int64_t>(token[base + j]) * kRowBytes;
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
              smem_u32(buf + j * kRowBytes)),
          "l"(src), "r"(kRowBytes), "r"(smem_u32(bar + h))
          : "memory");
    }
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_u32(bar + h)), "r"(phase[h])
          : "memory");
    }
    phase[h] ^= 1;
    for (int j = 0; j < count; ++j) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                       rows + static_cast<int64_t>(base + j) * kRowBytes),
                   "r"(smem_u32(buf + j * kRowBytes)), "r"(kRowBytes)
                   : "memory");
    }
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

void run(int tokens) {
  const int n_rows = tokens * kK;
  std::mt19937 rng(1234 + tokens);
  // Each token's K experts drawn uniformly without repeats; rows sorted by expert, then token.
  std::vector<std::vector<int>> by_expert(kE);
  std::vector<int> experts(kE);
  for (int t = 0; t < tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int k = 0; k < kK; ++k) {
      std::uniform_int_distribution<int> pick(k, kE - 1);
      std::swap(experts[k], experts[pick(rng)]);
      by_expert[experts[k]].push_back(t);
    }
  }
  std::vector<int> token;
  token.reserve(n_rows);
  for (const auto& rows : by_expert) token.insert(token.end(), rows.begin(), rows.end());
  std::vector<uint16_t> xh(static_cast<size_t>(tokens) * kH);
  std::uniform_int_distribution<int> bits(0x3c00, 0x3fff);  // bf16 in [1, 2): never zero
  for (auto& v : xh) v = static_cast<uint16_t>(bits(rng));

  unsigned char *x, *rows;
  int* dtoken;
  check(cudaMalloc(&x, xh.size() * 2), "malloc x");
  check(cudaMalloc(&rows, static_cast<size_t>(n_rows) * kRowBytes), "malloc rows");
  check(cudaMalloc(&dtoken, n_rows * sizeof(int)), "malloc token");
  check(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice), "copy x");
  check(cudaMemcpy(dtoken, token.data(), n_rows * sizeof(int), cudaMemcpyHostToDevice), "copy token");
  check(cudaFuncSetAttribute(copy_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkSmem), "smem");

  const double bytes = 2.0 * n_rows * kRowBytes;  // every row read once (from x) and written once
  std::printf("T=%d: %d rows, %.0f MB moved; x %.1f MB\n", tokens, n_rows, bytes / 1e6, xh.size() * 2 / 1e6);
  std::printf("  %4s %-7s %10s %10s %12s   (sampled)\n", "SMs", "form", "ms", "GB/s", "GB/s per SM");
  // Rows poisoned before each form's runs, then every 97th row compared with its token's x row.
  std::vector<uint16_t> out(static_cast<size_t>(n_rows) * kH);
  const auto rows_differing = [&] {
    check(cudaMemcpy(out.data(), rows, out.size() * 2, cudaMemcpyDeviceToHost), "copy back");
    size_t bad = 0;
    for (int r = 0; r < n_rows; r += 97) {
      bad += !std::equal(out.begin() + static_cast<size_t>(r) * kH, out.begin() + static_cast<size_t>(r + 1) * kH,
                         xh.begin() + static_cast<size_t>(token[r]) * kH);
    }
    return bad;
  };
  for (int sms : {4, 8, 12, 16, 32, 132}) {
    for (int f = 0; f < 2; ++f) {
      check(cudaMemset(rows, 0xff, static_cast<size_t>(n_rows) * kRowBytes), "poison");
      const float ms = median_ms(
          [&] {
            if (f == 0) {
              copy_vector<<<sms, kVectorThreads>>>(reinterpret_cast<const uint4*>(x), dtoken,
                                                   reinterpret_cast<uint4*>(rows), n_rows);
            } else {
              copy_bulk<<<sms, 32, kBulkSmem>>>(x, dtoken, rows, n_rows);
            }
          },
          7);
      std::printf("  %4d %-7s %10.3f %10.1f %12.1f   rows differing: %zu\n", sms, f == 0 ? "vector" : "bulk", ms,
                  bytes / ms / 1e6, bytes / ms / 1e6 / sms, rows_differing());
    }
  }
  cudaFree(x);
  cudaFree(rows);
  cudaFree(dtoken);
}

}  // namespace

int main(int argc, char** argv) { return bench_tool::run_token_counts(argc, argv, run); }
