// What each driver call of a forward() costs the host on this machine: the lead is DESIGN.md's
// "steady-state host cost <= 20 us a call", which eager calls miss (a training forward() enqueues
// 7 to 9 items: two stamp memsets, one to three routing phases, the scatter, fwd_up, fwd_down and
// the combine). Times, on the host clock, batches of 256 calls on one non-blocking stream (the
// stream drained between batches, outside the timing), the median batch's mean call:
//   launch P       cuLaunchKernel of an empty kernel taking P bytes of parameters (640: fwd_up's
//                  struct with its four tensor maps)
//   launch P cl2   the same through cuLaunchKernelEx with a cluster of two
//   memset         cuMemsetD32Async of 16 words (a stamp)
//   capturing      cuStreamIsCapturing
//   graph N        cuGraphLaunch of an instantiated graph of N such kernel nodes
//   graph N set    the same after cuGraphExecKernelNodeSetParams on each node (new arguments)
// A standalone tool (the project compiles its kernels with NVRTC; this one needs nvcc):
//   nvcc -O2 -std=c++17 -arch=sm_90a -o build/launchtool/launch_cost bench/launch_cost.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::fprintf(stderr, "%s: %s\n", what, name ? name : "?");
    std::exit(1);
  }
}

template <int kBytes>
struct Params {
  unsigned char bytes[kBytes];
};

template <int kBytes>
__global__ void empty_kernel(const __grid_constant__ Params<kBytes> p) {
  // Never true for the arguments the tool passes: keeps the parameters live.
  if (p.bytes[kBytes - 1] == 0xff && threadIdx.x == 1023) printf("unreachable\n");
}

template <int kBytes>
CUfunction function_of() {
  cudaFunction_t f;
  if (cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&empty_kernel<kBytes>)) != cudaSuccess) {
    std::fprintf(stderr, "cudaGetFuncBySymbol failed\n");
    std::exit(1);
  }
  return reinterpret_cast<CUfunction>(f);
}

// Mean microseconds of one call(i), the median over `batches` batches of `per_batch` calls.
template <typename F>
double host_us(CUstream stream, F&& call, int batches = 15, int per_batch = 256) {
  std::vector<double> means;
  for (int b = 0; b < batches + 2; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) call(i);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    check(cuStreamSynchronize(stream), "sync");
    if (b >= 2) means.push_back(us / per_batch);  // two warm-up batches
  }
  std::sort(means.begin(), means.end());
  return means[means.size() / 2];
}

template <int kBytes>
void launches(CUstream stream) {
  const CUfunction f = function_of<kBytes>();
  Params<kBytes> p{};
  void* args[] = {&p};
  const double plain = host_us(stream, [&](int i) {
    p.bytes[0] = static_cast<unsigned char>(i);
    check(cuLaunchKernel(f, 132, 1, 1, 128, 1, 1, 0, stream, args, nullptr), "launch");
  });
  CUlaunchAttribute cluster{};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = 2;
  cluster.value.clusterDim.y = 1;
  cluster.value.clusterDim.z = 1;
  CUlaunchConfig config{};
  config.gridDimX = 132;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  const double clustered = host_us(stream, [&](int i) {
    p.bytes[0] = static_cast<unsigned char>(i);
    check(cuLaunchKernelEx(&config, f, args, nullptr), "launch ex");
  });
  std::printf("launch %d: %.2f us   launch %d cl2: %.2f us\n", kBytes, plain, kBytes, clustered);
}

void graphs(CUstream stream, int nodes) {
  const CUfunction f = function_of<640>();
  std::vector<Params<640>> params(nodes);
  std::vector<void*> args(nodes);
  CUgraph graph;
  check(cuGraphCreate(&graph, 0), "graph");
  std::vector<CUgraphNode> node(nodes);
  std::vector<CUDA_KERNEL_NODE_PARAMS> np(nodes);
  for (int n = 0; n < nodes; ++n) {
    args[n] = &params[n];
    np[n] = {};
    np[n].func = f;
    np[n].gridDimX = 132;
    np[n].gridDimY = np[n].gridDimZ = 1;
    np[n].blockDimX = 128;
    np[n].blockDimY = np[n].blockDimZ = 1;
    np[n].kernelParams = &args[n];
    check(cuGraphAddKernelNode(&node[n], graph, n ? &node[n - 1] : nullptr, n ? 1 : 0, &np[n]), "node");
  }
  CUgraphExec exec;
  check(cuGraphInstantiate(&exec, graph, 0), "instantiate");
  const double launch_only = host_us(stream, [&](int) { check(cuGraphLaunch(exec, stream), "graph launch"); });
  const double with_set = host_us(stream, [&](int i) {
    for (int n = 0; n < nodes; ++n) {
      params[n].bytes[0] = static_cast<unsigned char>(i);
      check(cuGraphExecKernelNodeSetParams(exec, node[n], &np[n]), "set params");
    }
    check(cuGraphLaunch(exec, stream), "graph launch");
  });
  std::printf("graph %d: %.2f us   graph %d set: %.2f us\n", nodes, launch_only, nodes, with_set);
  check(cuGraphExecDestroy(exec), "exec destroy");
  check(cuGraphDestroy(graph), "graph destroy");
}

}  // namespace

int main() {
  check(cuInit(0), "init");
  if (cudaFree(nullptr) != cudaSuccess) return 1;  // the primary context, current
  CUstream stream;
  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
  launches<64>(stream);
  launches<640>(stream);
  CUdeviceptr word;
  check(cuMemAlloc(&word, 64), "alloc");
  const double memset = host_us(stream, [&](int i) { check(cuMemsetD32Async(word, i, 16, stream), "memset"); });
  CUstreamCaptureStatus status;
  const double capturing = host_us(stream, [&](int) { check(cuStreamIsCapturing(stream, &status), "capturing"); });
  CUcontext ctx;
  const double current = host_us(stream, [&](int) { check(cuCtxGetCurrent(&ctx), "current"); });
  std::printf("memset: %.2f us   capturing: %.3f us   ctx current: %.3f us\n", memset, capturing, current);
  graphs(stream, 1);
  graphs(stream, 8);
  check(cuMemFree(word), "free");
  check(cuStreamDestroy(stream), "stream destroy");
  return 0;
}
