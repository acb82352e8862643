// What the standalone nvcc tools of bench/ that read bf16 rows 16 bytes at a time share.
#pragma once

#include <cstdint>

namespace bench_tool {

// Eight bf16 values of a 16-byte load, as floats (a bf16 is a float's high half).
__device__ __forceinline__ void unpack(uint4 v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

}  // namespace bench_tool
