// 16-bit storage types (bf16, fp16) and their conversions, written against PTX so NVRTC needs
// none of the toolkit's headers. Arithmetic is always fp32.
#pragma once

#include "common/types.cuh"

namespace moejit {

struct bf16 {
  uint16 bits;
};
struct fp16 {
  uint16 bits;
};

template <typename T>
struct DTypeTraits;

template <>
struct DTypeTraits<bf16> {
  __device__ __forceinline__ static float to_float(uint16 b) { return __uint_as_float(static_cast<uint32>(b) << 16); }
  __device__ __forceinline__ static uint16 from_float(float f) {
    uint16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
  }
  // lo in the low half, hi in the high half.
  __device__ __forceinline__ static uint32 pack2(float lo, float hi) {
    uint32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <>
struct DTypeTraits<fp16> {
  __device__ __forceinline__ static float to_float(uint16 b) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
  }
  __device__ __forceinline__ static uint16 from_float(float f) {
    uint16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
  }
  __device__ __forceinline__ static uint32 pack2(float lo, float hi) {
    uint32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
  return DTypeTraits<T>::to_float(reinterpret_cast<const uint16*>(p)[0]);
}

template <typename T>
__device__ __forceinline__ void store_float(T* p, float v) {
  reinterpret_cast<uint16*>(p)[0] = DTypeTraits<T>::from_float(v);
}

// Element j of 16-bit elements packed two to a word, low half first, as fp32.
template <typename T>
__device__ __forceinline__ float word_element(const uint32* words, int j) {
  return DTypeTraits<T>::to_float(static_cast<uint16>(words[j / 2] >> (16 * (j % 2))));
}

// Two consecutive elements as floats; p must be 4-byte aligned.
template <typename T>
__device__ __forceinline__ void load_float2(const T* p, float& lo, float& hi) {
  const uint32 v = *reinterpret_cast<const uint32*>(p);
  lo = DTypeTraits<T>::to_float(static_cast<uint16>(v & 0xffffu));
  hi = DTypeTraits<T>::to_float(static_cast<uint16>(v >> 16));
}

// Two consecutive elements; p must be 4-byte aligned.
template <typename T>
__device__ __forceinline__ void store_float2(T* p, float lo, float hi) {
  *reinterpret_cast<uint32*>(p) = DTypeTraits<T>::pack2(lo, hi);
}

// Eight consecutive elements as four packed words; p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void store_uint4(T* p, const uint32 (&w)[4]) {
  uint4 v;
  v.x = w[0];
  v.y = w[1];
  v.z = w[2];
  v.w = w[3];
  *reinterpret_cast<uint4*>(p) = v;
}

// Four consecutive elements as two packed words; p must be 8-byte aligned.
template <typename T>
__device__ __forceinline__ void store_uint2(T* p, const uint32 (&w)[2]) {
  uint2 v;
  v.x = w[0];
  v.y = w[1];
  // 8-byte aligned by contract; said so, since an offset by a runtime element count (d_pre_act's
  // up half) otherwise split the store in two (ptxas, session 18).
  *static_cast<uint2*>(__builtin_assume_aligned(p, 8)) = v;
}

}  // namespace moejit
