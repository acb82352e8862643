// What the standalone nvcc tools of bench/ (red_ceiling.cu, copy_sms_ceiling.cu) share: timing by
// CUDA events around one launch, after warm-up, the median of the repeats; and their command line,
// a list of token counts.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace bench_tool {

// A CUDA runtime call that must succeed: the tool stops with its message otherwise.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median milliseconds of `reps` timed calls of launch(), after three untimed ones.
template <typename F>
float median_ms(F&& launch, int reps = 20) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a), "record");
    launch();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float m = 0;
    check(cudaEventElapsedTime(&m, a, b), "elapsed");
    ms.push_back(m);
  }
  check(cudaGetLastError(), "launch");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Runs run(T) for each token count on the command line, 8192 and 32768 if none.
inline int run_token_counts(int argc, char** argv, void (*run)(int)) {
  std::vector<int> tokens;
  for (int i = 1; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  if (tokens.empty()) tokens = {8192, 32768};
  for (int t : tokens) run(t);
  return 0;
}

}  // namespace bench_tool
