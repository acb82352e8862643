// Whether Hopper's copy engine can gather token rows into shared memory fast enough for a token
// GEMM to read x directly, with no scatter (docs/issue5-bounds.md). Session 12's row gather issued
// 128 one-row tensor boxes of 128 bytes per stage from one warp and ran fwd_up 4.5x slower; this
// tool separates the request size and the number of issuing threads from everything else.
// Every SM runs one block that keeps 4 stages of 48 KB in flight, each filled by requests of
// W bytes at random rows of x ([T, 2048] bf16), and only waits for them to land:
//   tensor-row  one-row boxes of 64 columns through a 2-D tensor map, 128-byte swizzle (W = 128)
//   bulk-W      1-D bulk copies of W contiguous bytes of a row (W = 128 ... 4096)
//   tensor-tile the form fwd_up uses now: 128-row boxes of sorted, contiguous rows (for scale)
// issued by 1 to 384 threads (all lanes of up to 12 warps, or one lane of each). It prints the
// bytes landed per second, in all and per SM, and the requests per SM per microsecond. fwd_up at
// T=32768 (128-column tiles) takes its A tiles at about 39 GB/s per SM, its W1 tiles at as much
// again.
// A standalone tool (the project compiles its kernels with NVRTC; this one needs nvcc):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o build/copytool/tma_gather_ceiling bench/tma_gather_ceiling.cu
//   build/copytool/tma_gather_ceiling [T ...]      (default 4096, whose x stays in L2, and 65536)
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "event_timing.cuh"

namespace {

using bench_tool::check;
using bench_tool::median_ms;

constexpr int kH = 2048, kRowBytes = kH * 2;
constexpr int kStageBytes = 48 * 1024, kStages = 4;  // 384 rows of 128 bytes a stage
constexpr int kItemsPerBlock = 256;  // stages each block fills per launch
constexpr int kThreads = 384;
constexpr int kSmem = kStages * kStageBytes + 1024 + kStages * 8;

enum class Form { kTensorRow, kBulk, kTensorTile };

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// Item i of block b fills stage i % kStages; its pieces go to the issuing threads in turn.
template <Form F, int W, int ISSUERS, int STRIDE>
__global__ void __launch_bounds__(kThreads) gather(const __grid_constant__ CUtensorMap rows_map,
                                              const __grid_constant__ CUtensorMap tile_map, const unsigned char* x,
                                              const int* rows, int n_tiles) {
  extern __shared__ unsigned char raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar + s)), "n"(ISSUERS));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid % STRIDE != 0 || tid / STRIDE >= ISSUERS) return;
  const int me = tid / STRIDE;
  constexpr int kPieces = F == Form::kTensorTile ? kStageBytes / (128 * 128) : kStageBytes / W;
  constexpr int kPiecesPerRow = F == Form::kBulk ? kRowBytes / W : kRowBytes / 128;
  for (int i = 0; i < kItemsPerBlock; ++i) {
    const int s = i % kStages;
    const uint32_t b = smem_u32(bar + s);
    if (i >= kStages) wait_parity(b, ((i / kStages) - 1) & 1);  // the stage's previous fill landed
    // Each issuer arrives for the bytes of its own pieces, so no copy can land before its count.
    constexpr int kPieceBytes = kStageBytes / kPieces;
    const int mine = (kPieces - me + ISSUERS - 1) / ISSUERS;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(mine * kPieceBytes) : "memory");
    const long long item = static_cast<long long>(blockIdx.x) * kItemsPerBlock + i;
    unsigned char* stage = smem + s * kStageBytes;
    for (int p = me; p < kPieces; p += ISSUERS) {
      if constexpr (F == Form::kTensorTile) {
        // 128 rows x 64 columns of the sorted rows: a k tile of an m tile.
        const int tile = static_cast<int>((item * kPieces + p) % (static_cast<long long>(n_tiles) * (kH / 64)));
        const int col = (tile % (kH / 64)) * 64, row = (tile / (kH / 64)) * 128;
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                smem_u32(stage + p * 128 * 128)),
            "l"(&tile_map), "r"(col), "r"(row), "r"(b)
            : "memory");
      } else {
        // As a GEMM's k tile: piece p is row p of the item's rows, all at the item's slice of
        // W bytes (tensor: 64 columns).
        const int row = rows[(item * kPieces + p) % (static_cast<long long>(n_tiles) * 128)];
        const int slice = static_cast<int>(item % kPiecesPerRow);
        if constexpr (F == Form::kTensorRow) {
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                  smem_u32(stage + p * 128)),
              "l"(&rows_map), "r"(slice * 64), "r"(row), "r"(b)
              : "memory");
        } else {
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                           smem_u32(stage + p * W)),
                       "l"(x + static_cast<long long>(row) * kRowBytes + slice * W), "r"(W), "r"(b)
                       : "memory");
        }
      }
    }
  }
  // The last kStages fills land before the block exits.
  for (int i = kItemsPerBlock - kStages; i < kItemsPerBlock; ++i) wait_parity(smem_u32(bar + i % kStages), (i / kStages) & 1);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A [rows, 2048] bf16 map with boxes of 64 columns x box_rows rows, 128-byte swizzle.
CUtensorMap map_of(EncodeTiled encode, void* base, unsigned long long n_rows, unsigned box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {kH, n_rows}, strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {64, box_rows}, elem[2] = {1, 1};
  if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
      CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    std::exit(1);
  }
  return m;
}

struct Case {
  const char* name;
  int request_bytes;
  void (*kernel)(CUtensorMap, CUtensorMap, const unsigned char*, const int*, int);
  int issuers, issuer_stride;  // issuing threads, and the thread-index step between them (32: a lane per warp)
};

template <Form F, int W, int I, int STRIDE = 1>
void launch(CUtensorMap a, CUtensorMap b, const unsigned char* x, const int* rows, int n_tiles) {
  static bool once = [] {
    check(cudaFuncSetAttribute(gather<F, W, I, STRIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "smem");
    return true;
  }();
  (void)once;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SMs");
  gather<F, W, I, STRIDE><<<sms, kThreads, kSmem>>>(a, b, x, rows, n_tiles);
}

void run(int tokens) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found), "entry point");
  const auto encode = reinterpret_cast<EncodeTiled>(fn);
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SMs");

  const int n_tiles = tokens / 128;  // 128-row tiles of x; rows drawn from all of x
  std::mt19937 rng(4321 + tokens);
  std::vector<int> rows(static_cast<size_t>(tokens));
  std::uniform_int_distribution<int> pick(0, tokens - 1);
  for (int& r : rows) r = pick(rng);
  std::vector<uint16_t> xh(static_cast<size_t>(tokens) * kH);
  std::uniform_int_distribution<int> bits(0x3c00, 0x3fff);  // bf16 in [1, 2): never zero
  for (auto& v : xh) v = static_cast<uint16_t>(bits(rng));
  unsigned char* x;
  int* drows;
  check(cudaMalloc(&x, xh.size() * 2), "malloc x");
  check(cudaMalloc(&drows, rows.size() * sizeof(int)), "malloc rows");
  check(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice), "copy x");
  check(cudaMemcpy(drows, rows.data(), rows.size() * sizeof(int), cudaMemcpyHostToDevice), "copy rows");
  const CUtensorMap row_map = map_of(encode, x, tokens, 1), tile_map = map_of(encode, x, tokens, 128);

  const Case cases[] = {
      {"tensor-tile", 16384, launch<Form::kTensorTile, 16384, 1>, 1, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 1>, 1, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 32>, 32, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 128>, 128, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 256>, 256, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 384>, 384, 1},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 4, 32>, 4, 32},
      {"tensor-row", 128, launch<Form::kTensorRow, 128, 12, 32>, 12, 32},
      {"bulk", 128, launch<Form::kBulk, 128, 128>, 128, 1},
      {"bulk", 512, launch<Form::kBulk, 512, 128>, 128, 1},
      {"bulk", 512, launch<Form::kBulk, 512, 384>, 384, 1},
      {"bulk", 1024, launch<Form::kBulk, 1024, 128>, 128, 1},
      {"bulk", 4096, launch<Form::kBulk, 4096, 32>, 32, 1},
  };
  const double bytes = static_cast<double>(sms) * kItemsPerBlock * kStageBytes;
  std::printf("T=%d: x %.1f MB, %d SMs x %d stages of %d KB (%d in flight), %.0f MB landed per launch\n", tokens,
              xh.size() * 2 / 1e6, sms, kItemsPerBlock, kStageBytes / 1024, kStages, bytes / 1e6);
  std::printf("  %-12s %6s %8s %6s %9s %9s %12s %14s\n", "form", "bytes", "issuers", "warps", "ms", "GB/s",
              "GB/s per SM", "requests/us/SM");
  for (const Case& c : cases) {
    const float ms = median_ms([&] { c.kernel(row_map, tile_map, x, drows, n_tiles); }, 9);
    const double per_sm = bytes / ms / 1e6 / sms;
    std::printf("  %-12s %6d %8d %6d %9.3f %9.0f %12.1f %14.1f\n", c.name, c.request_bytes, c.issuers,
                (c.issuers * c.issuer_stride + 31) / 32, ms, bytes / ms / 1e6, per_sm, per_sm * 1e3 / c.request_bytes);
  }
  cudaFree(x);
  cudaFree(drows);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  if (argc == 1) {
    static char a[] = "4096", b[] = "65536";
    args = {argv[0], a, b};
  }
  return bench_tool::run_token_counts(static_cast<int>(args.size()), args.data(), run);
}
